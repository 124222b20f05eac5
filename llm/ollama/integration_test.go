package ollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// One real Ollama for the integration tests of this package.
var ollama ollamatest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	ollama.Close()
	os.Exit(code)
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func realBackend(t *testing.T, inst *ollamatest.Instance) *Backend {
	t.Helper()
	b, err := New(Config{BaseURL: inst.URL, Model: inst.Model, FirstByteTimeout: time.Minute, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := b.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func userSays(s string) []llm.Message { return []llm.Message{{Role: "user", Content: s}} }

func TestRealEnsureModelWarmReady(t *testing.T) {
	ollama.ForEach(t, testRealEnsureModelWarmReady)
}

func testRealEnsureModelWarmReady(t *testing.T, inst *ollamatest.Instance) {
	name := "hearth-ensure-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	gguf := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{Seed: 7}); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{BaseURL: inst.URL, Model: name, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	if err := b.Ready(ctx); !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("Ready before the model exists = %v, want ErrUnavailable", err)
	}
	if _, err := b.Warm(ctx); err == nil {
		t.Fatal("Warm of a missing model succeeded")
	}
	src := ModelSource{GGUFPath: gguf, Template: tinymodel.Template, Parameters: tinymodel.Parameters()}
	if err := b.EnsureModel(ctx, src); err != nil {
		t.Fatalf("EnsureModel: %v", err)
	}
	show, err := inst.Client().Show(ctx, &api.ShowRequest{Model: name})
	if err != nil {
		t.Fatalf("model not created: %v", err)
	}
	if show.Template != tinymodel.Template {
		t.Fatalf("template = %q", show.Template)
	}
	// Second call finds it: no new create (the file is gone now, so a
	// create attempt would fail).
	if err := os.Remove(gguf); err != nil {
		t.Fatal(err)
	}
	if err := b.EnsureModel(ctx, src); err != nil {
		t.Fatalf("second EnsureModel: %v", err)
	}

	took, err := b.Warm(ctx)
	if err != nil || took <= 0 {
		t.Fatalf("Warm = %v, %v", took, err)
	}
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("Ready after Warm: %v", err)
	}
	ps, err := inst.Client().ListRunning(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, m := range ps.Models {
		if sameModel(m.Name, name) {
			found = true
			if m.ExpiresAt.Before(time.Now().Add(24 * time.Hour)) {
				t.Fatalf("model expires at %v; want pinned (keep_alive -1)", m.ExpiresAt)
			}
		}
	}
	if !found {
		t.Fatalf("%s not among running models %+v", name, ps.Models)
	}

	// The same runtime serves the shared model too (WithModel), and
	// Unload takes this one out of memory.
	other := b.WithModel(inst.Model)
	if other.Model() != inst.Model || b.Model() != name {
		t.Fatalf("WithModel: %s, original %s", other.Model(), b.Model())
	}
	if _, err := other.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Unload(ctx); err != nil {
		t.Fatalf("Unload: %v", err)
	}
	// Ollama stops the runner right after answering.
	testutil.WaitFor(t, 30*time.Second, "the unloaded model out of memory", func() bool {
		return errors.Is(b.Ready(ctx), llm.ErrUnavailable)
	})
	if err := other.Ready(ctx); err != nil {
		t.Fatalf("the other model after unloading this one: %v", err)
	}
}

// A model that is neither present nor pullable fails EnsureModel with the
// reason (here: the registry refuses the connection; no traffic leaves the
// host).
func TestRealEnsureModelUnpullable(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		b, err := New(Config{BaseURL: inst.URL, Model: "127.0.0.1:9/no/such-model", Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var statuses []string
		err = b.EnsureModel(ctx, ModelSource{Progress: func(s string, _, _ int64) { statuses = append(statuses, s) }})
		// The runtime answered; the registry did not: the error says so,
		// not that the runtime is unreachable.
		if err == nil || !strings.HasPrefix(err.Error(), "pull model 127.0.0.1:9/no/such-model: pull model manifest") ||
			strings.Contains(err.Error(), "unreachable") || !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("EnsureModel of an unpullable model = %v", err)
		}
		t.Logf("error: %v (progress %q)", err, statuses)
	})
}

func TestRealStreamingChat(t *testing.T) {
	ollama.ForEach(t, testRealStreamingChat)
}

func testRealStreamingChat(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	s, err := b.Chat(ctx, &llm.Request{Messages: userSays("hello there"), Options: llm.Options{MaxTokens: ptr(20)}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var contentEvents int
	var final llm.Event
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Done {
			if final.Done {
				t.Fatal("two final events")
			}
			final = ev
			continue
		}
		if final.Done {
			t.Fatal("content after the final event")
		}
		if ev.Content == "" {
			t.Fatal("empty content event")
		}
		contentEvents++
	}
	if contentEvents < 2 || !final.Done || final.PromptTokens <= 0 || final.CompletionTokens != 20 || final.FinishReason != llm.FinishLength {
		t.Fatalf("%d content events, final %+v", contentEvents, final)
	}
}

func generate(t *testing.T, b *Backend, opts llm.Options) (string, llm.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.Chat(ctx, &llm.Request{Messages: userSays("tell me a story"), Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := collect(s)
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.text, r.final
}

func TestRealMaxTokensDeterminismAndStop(t *testing.T) {
	ollama.ForEach(t, testRealMaxTokensDeterminismAndStop)
}

func testRealMaxTokensDeterminismAndStop(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	for _, n := range []int{1, 7, 64} {
		_, final := generate(t, b, llm.Options{MaxTokens: ptr(n)})
		if final.FinishReason != llm.FinishLength || final.CompletionTokens != n {
			t.Fatalf("max_tokens %d: final %+v", n, final)
		}
	}

	opts := llm.Options{Temperature: ptr(0.0), Seed: ptr(int64(1234)), MaxTokens: ptr(40)}
	a, _ := generate(t, b, opts)
	c, _ := generate(t, b, opts)
	if a != c || len(strings.Fields(a)) < 10 {
		t.Fatalf("temperature 0 + seed gave different texts:\n%q\n%q", a, c)
	}

	// Sampled runs with the same seed agree, with different seeds differ.
	hot := llm.Options{Temperature: ptr(1.0), Seed: ptr(int64(5)), MaxTokens: ptr(40)}
	x, _ := generate(t, b, hot)
	y, _ := generate(t, b, hot)
	hot.Seed = ptr(int64(6))
	z, _ := generate(t, b, hot)
	if x != y || x == z {
		t.Fatalf("seeded sampling: same seed equal=%v, other seed equal=%v", x == y, x == z)
	}

	// A stop sequence taken from the middle of a known generation ends
	// the same generation there.
	words := strings.Fields(x)
	stop := " " + words[len(words)/2] + " "
	want := x[:strings.Index(x, stop)]
	hot.Seed = ptr(int64(5))
	hot.Stop = []string{stop}
	text, final := generate(t, b, hot)
	if final.FinishReason != llm.FinishStop || text != want {
		t.Fatalf("stop %q: finish %q, text %q, want %q", stop, final.FinishReason, text, want)
	}
}

// recordingProxy forwards to the real Ollama and records chat bodies.
type recordingProxy struct {
	mu     sync.Mutex
	bodies [][]byte
}

func (p *recordingProxy) start(t *testing.T, target string) string {
	u, _ := url.Parse(target)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.FlushInterval = -1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/api/chat" {
			body, _ := io.ReadAll(r.Body)
			p.mu.Lock()
			p.bodies = append(p.bodies, body)
			p.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRealOnlySetOptionsAreSent(t *testing.T) {
	ollama.ForEach(t, testRealOnlySetOptionsAreSent)
}

func testRealOnlySetOptionsAreSent(t *testing.T, inst *ollamatest.Instance) {
	var p recordingProxy
	b, err := New(Config{BaseURL: p.start(t, inst.URL), Model: inst.Model})
	if err != nil {
		t.Fatal(err)
	}
	_, final := generate(t, b, llm.Options{MaxTokens: ptr(3), Temperature: ptr(0.5)})
	if final.CompletionTokens != 3 {
		t.Fatalf("final %+v", final)
	}
	_, final = generate(t, b, llm.Options{})
	if !final.Done {
		t.Fatalf("final %+v", final)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.bodies) != 2 {
		t.Fatalf("%d chat requests recorded", len(p.bodies))
	}
	var first, second struct {
		Options   map[string]any `json:"options"`
		KeepAlive any            `json:"keep_alive"`
	}
	json.Unmarshal(p.bodies[0], &first)
	json.Unmarshal(p.bodies[1], &second)
	if len(first.Options) != 2 || first.Options["num_predict"] != 3.0 || first.Options["temperature"] != 0.5 {
		t.Fatalf("options sent: %s", p.bodies[0])
	}
	if len(second.Options) != 0 || second.KeepAlive != -1.0 {
		t.Fatalf("request without options sent: %s", p.bodies[1])
	}
}

func TestRealUnreachable(t *testing.T) {
	// Port 1 on loopback: nothing listens there.
	b, err := New(Config{BaseURL: "http://127.0.0.1:1", Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Chat(context.Background(), &llm.Request{Messages: userSays("hi")})
	if !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
}

func TestRealMissingModelIsUnavailable(t *testing.T) {
	ollama.ForEach(t, testRealMissingModelIsUnavailable)
}

func testRealMissingModelIsUnavailable(t *testing.T, inst *ollamatest.Instance) {
	b, _ := New(Config{BaseURL: inst.URL, Model: "hearth-no-such-model"})
	_, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("hi")})
	if !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
}

func TestRealToolsAreAccepted(t *testing.T) {
	ollama.ForEach(t, testRealToolsAreAccepted)
}

func testRealToolsAreAccepted(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.Chat(ctx, &llm.Request{
		Messages: []llm.Message{
			{Role: "user", Content: "weather?"},
			{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)}}},
			{Role: "tool", ToolName: "get_weather", Content: `{"temp":3}`},
		},
		Tools:   []llm.Tool{{Name: "get_weather", Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)}},
		Options: llm.Options{MaxTokens: ptr(5)},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := collect(s)
	if r.err != nil || r.final.CompletionTokens != 5 {
		t.Fatalf("%+v", r)
	}
}

func TestRealFormatJSONIsAccepted(t *testing.T) {
	ollama.ForEach(t, testRealFormatJSONIsAccepted)
}

func testRealFormatJSONIsAccepted(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.Chat(ctx, &llm.Request{Messages: userSays("json please"), Format: json.RawMessage(`"json"`), Options: llm.Options{MaxTokens: ptr(5)}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if r := collect(s); r.err != nil || !r.final.Done {
		t.Fatalf("%+v", r)
	}
}

// TestRealTokenLinesTakeFastPath guards the fast path against a change in
// Ollama's output: every token line of a real answer must be one the fast
// path decodes, the same as encoding/json.
func TestRealTokenLinesTakeFastPath(t *testing.T) {
	ollama.ForEach(t, testRealTokenLinesTakeFastPath)
}

func testRealTokenLinesTakeFastPath(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	body, err := b.chatBody(&llm.Request{
		Messages: userSays("write some <html> & \"quotes\"\nplease"),
		Options:  llm.Options{MaxTokens: ptr(64), Seed: ptr(int64(3))},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, inst.URL+"/api/chat", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	tokens := 0
	for sc.Scan() {
		line := sc.Bytes()
		var l chatLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		if l.Done {
			break
		}
		if !checkFastLine(t, line) {
			t.Fatalf("token line %q does not take the fast path", line)
		}
		tokens++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if tokens < 32 {
		t.Fatalf("only %d token lines", tokens)
	}
}

// vLLM's extra sampling parameters reach the runtime as its own options,
// which every version of the matrix takes: with top_k 1 the output is the
// most likely token each time, so two runs agree without a seed.
func TestRealExtraSamplingOptions(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		b := realBackend(t, inst)
		o := llm.Options{MaxTokens: ptr(8), TopK: ptr(int64(1)), MinP: ptr(0.05), RepetitionPenalty: ptr(1.0), Temperature: ptr(1.5)}
		a, fa := generate(t, b, o)
		c, _ := generate(t, b, o)
		if fa.CompletionTokens != 8 || a != c {
			t.Fatalf("top_k 1: %q then %q (%+v)", a, c, fa)
		}
	})
}
