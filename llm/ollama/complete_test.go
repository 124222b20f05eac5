package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// routeOllama is a loopback stand-in for one Ollama route: it records the
// last body and answers with answer.
func routeOllama(t *testing.T, path string, answer func(w http.ResponseWriter, body map[string]any)) (*Backend, func() map[string]any) {
	t.Helper()
	var mu sync.Mutex
	var last map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		last = body
		mu.Unlock()
		answer(w, body)
	}))
	t.Cleanup(srv.Close)
	return newBackend(t, srv.URL, nil), func() map[string]any { mu.Lock(); defer mu.Unlock(); return last }
}

func TestCompleteSendsTheRawPrompt(t *testing.T) {
	b, last := routeOllama(t, "/api/generate", func(w http.ResponseWriter, _ map[string]any) {
		writeLines(w, `{"model":"m","created_at":"t","response":"Hel","done":false}`,
			`{"model":"m","created_at":"t","response":"lo","done":false}`,
			`{"model":"m","created_at":"t","response":"","done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":2}`)
	})
	max := 2
	s, err := b.Complete(context.Background(), &llm.CompletionRequest{Prompt: "Say", Options: llm.Options{MaxTokens: &max}})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(s)
	if r.err != nil || r.text != "Hello" || r.final.FinishReason != llm.FinishLength || r.final.PromptTokens != 3 || r.final.CompletionTokens != 2 {
		t.Fatalf("got %+v", r)
	}
	body := last()
	if body["prompt"] != "Say" || body["raw"] != true || body["stream"] != true || body["model"] != "m" ||
		body["options"].(map[string]any)["num_predict"] != 2.0 {
		t.Fatalf("body %v", body)
	}
	if _, ok := body["suffix"]; ok && body["suffix"] != "" {
		t.Fatalf("suffix sent: %v", body)
	}

	// With a suffix the template places prompt and suffix: not raw.
	s, err = b.Complete(context.Background(), &llm.CompletionRequest{Prompt: "def f(", Suffix: "return x"})
	if err != nil {
		t.Fatal(err)
	}
	collect(s)
	if body := last(); body["raw"] != nil || body["suffix"] != "return x" || body["options"] != nil {
		t.Fatalf("suffix body %v", body)
	}
}

func TestCompleteRefusalIsInvalidRequest(t *testing.T) {
	b, _ := routeOllama(t, "/api/generate", func(w http.ResponseWriter, _ map[string]any) {
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":"registry.ollama.ai/library/m:latest does not support insert"}`)
	})
	_, err := b.Complete(context.Background(), &llm.CompletionRequest{Prompt: "a", Suffix: "b"})
	var inv *llm.InvalidRequestError
	if !errors.As(err, &inv) || !strings.Contains(inv.Msg, "does not support insert") {
		t.Fatalf("err = %v", err)
	}
}

func TestEmbedMapping(t *testing.T) {
	for _, c := range []struct {
		name   string
		status int
		answer string
		dims   int
		check  func(t *testing.T, e *llm.Embeddings, err error)
	}{
		{"vectors", 200, `{"model":"m","embeddings":[[0.5,1],[2,3]],"prompt_eval_count":4}`, 0, func(t *testing.T, e *llm.Embeddings, err error) {
			if err != nil || len(e.Vectors) != 2 || e.Vectors[1][1] != 3 || e.PromptTokens != 4 {
				t.Fatalf("%+v %v", e, err)
			}
		}},
		{"dimensions honoured", 200, `{"embeddings":[[1],[2]]}`, 1, func(t *testing.T, e *llm.Embeddings, err error) {
			if err != nil || len(e.Vectors[0]) != 1 {
				t.Fatalf("%+v %v", e, err)
			}
		}},
		{"dimensions ignored", 200, `{"embeddings":[[1,2],[3,4]]}`, 1, func(t *testing.T, _ *llm.Embeddings, err error) {
			var inv *llm.InvalidRequestError
			if !errors.As(err, &inv) || inv.Param != "dimensions" {
				t.Fatalf("%v", err)
			}
		}},
		{"new engine without pooling", 501, "this model does not support embeddings\n", 0, func(t *testing.T, _ *llm.Embeddings, err error) {
			var inv *llm.InvalidRequestError
			if !errors.As(err, &inv) || inv.Param != "model" || !strings.Contains(inv.Msg, "does not support embeddings") || strings.Contains(inv.Msg, "127.0.0.1") {
				t.Fatalf("%v", err)
			}
		}},
		{"input refused", 400, `{"error":"input exceeds maximum context length"}`, 0, func(t *testing.T, _ *llm.Embeddings, err error) {
			var inv *llm.InvalidRequestError
			if !errors.As(err, &inv) || inv.Param != "input" || inv.Msg != "input exceeds maximum context length" {
				t.Fatalf("%v", err)
			}
		}},
		{"runtime broken", 500, `{"error":"boom"}`, 0, func(t *testing.T, _ *llm.Embeddings, err error) {
			if !errors.Is(err, llm.ErrUnavailable) {
				t.Fatalf("%v", err)
			}
		}},
		{"count mismatch", 200, `{"embeddings":[[1]]}`, 0, func(t *testing.T, _ *llm.Embeddings, err error) {
			if !errors.Is(err, llm.ErrUnavailable) {
				t.Fatalf("%v", err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, last := routeOllama(t, "/api/embed", func(w http.ResponseWriter, _ map[string]any) {
				w.WriteHeader(c.status)
				io.WriteString(w, c.answer)
			})
			e, err := b.Embed(context.Background(), &llm.EmbedRequest{Input: []string{"a", "b"}, Dimensions: c.dims})
			c.check(t, e, err)
			body := last()
			if body["truncate"] != false || body["model"] != "m" || len(body["input"].([]any)) != 2 {
				t.Fatalf("body %v", body)
			}
			if d, ok := body["dimensions"]; (c.dims == 0) == ok || (ok && d != float64(c.dims)) {
				t.Fatalf("dimensions in body: %v", body)
			}
		})
	}
}

func TestEmbedTimeoutAndUnreachable(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	b, _ := routeOllama(t, "/api/embed", func(http.ResponseWriter, map[string]any) { <-release })
	b.cfg.FirstByteTimeout = 50 * time.Millisecond
	if _, err := b.Embed(context.Background(), &llm.EmbedRequest{Input: []string{"a"}}); !errors.Is(err, llm.ErrTimeout) {
		t.Fatalf("slow runtime: %v", err)
	}
	down := newBackend(t, "http://127.0.0.1:1", nil)
	if _, err := down.Embed(context.Background(), &llm.EmbedRequest{Input: []string{"a"}}); !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("unreachable: %v", err)
	}
}

// What the real runtimes do: both embed with the tiny llama model (the
// llama.cpp engine pools it although /api/show lists no "embedding"
// capability), only 0.17.4 honours dimensions, neither takes a suffix for
// a template without one, and a raw prompt is continued token by token.
func TestRealEmbedAndComplete(t *testing.T) {
	ollama.ForEach(t, testRealEmbedAndComplete)
}

func testRealEmbedAndComplete(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	e, err := b.Embed(ctx, &llm.EmbedRequest{Input: []string{"hello world", "bapi boru"}})
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	if len(e.Vectors) != 2 || len(e.Vectors[0]) != 64 || len(e.Vectors[1]) != 64 || e.PromptTokens <= 0 {
		t.Fatalf("Embed = %d vectors of %d, %d tokens", len(e.Vectors), len(e.Vectors[0]), e.PromptTokens)
	}
	var norm float64
	for _, v := range e.Vectors[0] {
		norm += float64(v) * float64(v)
	}
	if norm < 0.99 || norm > 1.01 {
		t.Fatalf("vector not normalised: |v|² = %v", norm)
	}

	e, err = b.Embed(ctx, &llm.EmbedRequest{Input: []string{"hello"}, Dimensions: 8})
	var inv *llm.InvalidRequestError
	switch inst.Version {
	case "0.9.6":
		if !errors.As(err, &inv) || inv.Param != "dimensions" {
			t.Fatalf("dimensions on 0.9.6: %v", err)
		}
	default:
		if err != nil || len(e.Vectors[0]) != 8 {
			t.Fatalf("dimensions on %s: %v", inst.Version, err)
		}
	}

	// An input over the context is refused, not truncated.
	if _, err := b.Embed(ctx, &llm.EmbedRequest{Input: []string{strings.Repeat("bapi ", 6000)}}); !errors.As(err, &inv) || inv.Param != "input" {
		t.Fatalf("input over the context: %v", err)
	}

	max := 3
	s, err := b.Complete(ctx, &llm.CompletionRequest{Prompt: "Once upon a time", Options: llm.Options{MaxTokens: &max}})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	r := collect(s)
	if r.err != nil || r.text == "" || r.final.FinishReason != llm.FinishLength || r.final.CompletionTokens != 3 || r.final.PromptTokens <= 0 {
		t.Fatalf("Complete = %+v", r)
	}

	if _, err := b.Complete(ctx, &llm.CompletionRequest{Prompt: "a", Suffix: "b"}); !errors.As(err, &inv) || !strings.Contains(inv.Msg, "insert") {
		t.Fatalf("suffix without insert: %v", err)
	}
	l, err := b.Limits(ctx)
	if err != nil || l.Can("insert") || l.Can("embedding") || !l.Can("completion") {
		t.Fatalf("capabilities %v %v", l.Capabilities, err)
	}
}

// An embedding model (the tiny model with pooling) loads, reports the
// "embedding" capability only, embeds, and is refused generation as an
// invalid request, on both runtimes.
func TestRealEmbeddingModel(t *testing.T) {
	ollama.ForEach(t, testRealEmbeddingModel)
}

func testRealEmbeddingModel(t *testing.T, inst *ollamatest.Instance) {
	gguf := filepath.Join(t.TempDir(), "tiny-embed.gguf")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{Pooling: 1}); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{BaseURL: inst.URL, Model: "hearth-tiny-embed-" + strconv.FormatInt(time.Now().UnixNano(), 36), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.EnsureModel(ctx, ModelSource{GGUFPath: gguf}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Warm(ctx); err != nil {
		t.Fatalf("Warm: %v", err)
	}
	if err := b.Ready(ctx); err != nil {
		t.Fatalf("Ready: %v", err)
	}
	l, err := b.Limits(ctx)
	if err != nil || !slices.Equal(l.Capabilities, []string{"embedding"}) {
		t.Fatalf("Limits = %+v, %v", l, err)
	}
	// An embedding model generates nothing to give logprobs of.
	if lp, err := b.AnswersLogprobs(ctx); lp || err != nil {
		t.Fatalf("AnswersLogprobs = %v, %v", lp, err)
	}
	e, err := b.Embed(ctx, &llm.EmbedRequest{Input: []string{"hello world"}})
	if err != nil || len(e.Vectors) != 1 || len(e.Vectors[0]) != 64 {
		t.Fatalf("Embed = %+v, %v", e, err)
	}
	var inv *llm.InvalidRequestError
	if _, err := b.Complete(ctx, &llm.CompletionRequest{Prompt: "a"}); !errors.As(err, &inv) {
		t.Fatalf("Complete on an embedding model: %v", err)
	}
	if _, err := b.Chat(ctx, &llm.Request{Messages: userSays("hi")}); !errors.As(err, &inv) {
		t.Fatalf("Chat on an embedding model: %v", err)
	}
	if err := b.Unload(ctx); err != nil {
		t.Fatalf("Unload: %v", err)
	}
}
