package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/llm"
)

// fakeOllama is a loopback stand-in for Ollama's /api/chat: it records the
// request bodies and answers with what the test's handler writes.
type fakeOllama struct {
	srv    *httptest.Server
	mu     sync.Mutex
	bodies []map[string]any
	// answer writes the response; nil streams two tokens and a final line.
	answer func(w http.ResponseWriter, r *http.Request)
}

func newFakeOllama(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *fakeOllama {
	t.Helper()
	f := &fakeOllama{answer: answer}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/chat" {
			http.NotFound(w, r)
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		if f.answer == nil {
			writeLines(w, `{"message":{"role":"assistant","content":"Hel"},"done":false}`,
				`{"message":{"role":"assistant","content":"lo"},"done":false}`,
				`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":7,"eval_count":2}`)
			return
		}
		f.answer(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeOllama) lastBody(t *testing.T) map[string]any {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.bodies) == 0 {
		t.Fatal("fake ollama received no chat request")
	}
	return f.bodies[len(f.bodies)-1]
}

func writeLines(w http.ResponseWriter, lines ...string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		w.(http.Flusher).Flush()
	}
}

func newBackend(t *testing.T, url string, mod func(*Config)) *Backend {
	t.Helper()
	cfg := Config{BaseURL: url, Model: "m"}
	if mod != nil {
		mod(&cfg)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Ends the pooled goroutines: a synctest bubble must not end with one
	// waiting.
	t.Cleanup(b.CloseIdleConnections)
	return b
}

type result struct {
	text  string
	calls []llm.ToolCall
	final llm.Event
	err   error
}

func collect(s llm.Stream) result {
	var r result
	var b strings.Builder
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			r.err = err
			break
		}
		b.WriteString(ev.Content)
		r.calls = append(r.calls, ev.ToolCalls...)
		if ev.Done {
			r.final = ev
		}
	}
	r.text = b.String()
	return r
}

func ptr[T any](v T) *T { return &v }

func TestChatStreamsAndMapsUsage(t *testing.T) {
	f := newFakeOllama(t, nil)
	b := newBackend(t, f.srv.URL, nil)
	s, err := b.Chat(context.Background(), &llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	r := collect(s)
	if r.err != nil || r.text != "Hello" {
		t.Fatalf("got %q, %v", r.text, r.err)
	}
	if !r.final.Done || r.final.FinishReason != llm.FinishStop || r.final.PromptTokens != 7 || r.final.CompletionTokens != 2 {
		t.Fatalf("final %+v", r.final)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Fatalf("Recv after final = %v, want EOF", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	body := f.lastBody(t)
	if body["model"] != "m" || body["stream"] != true || body["keep_alive"] != float64(-1) {
		t.Fatalf("model/stream/keep_alive: %v", body)
	}
	if o, ok := body["options"]; ok && o != nil {
		t.Fatalf("options sent although none set: %v", o)
	}
	if _, ok := body["format"]; ok {
		t.Fatalf("format sent although not set: %v", body["format"])
	}
	if _, ok := body["tools"]; ok {
		t.Fatalf("tools sent although none: %v", body["tools"])
	}
}

func TestOptionsOnlyWhatWasSet(t *testing.T) {
	cases := []struct {
		name string
		opts llm.Options
		want map[string]any
	}{
		{"temperature only", llm.Options{Temperature: ptr(0.0)}, map[string]any{"temperature": 0.0}},
		{"max tokens and stop", llm.Options{MaxTokens: ptr(5), Stop: []string{"x", "y"}}, map[string]any{"num_predict": 5.0, "stop": []any{"x", "y"}}},
		{"all", llm.Options{
			Temperature: ptr(0.7), TopP: ptr(0.9), MaxTokens: ptr(10), Stop: []string{"."}, Seed: ptr(int64(42)),
			PresencePenalty: ptr(0.5), FrequencyPenalty: ptr(-0.5),
		}, map[string]any{
			"temperature": 0.7, "top_p": 0.9, "num_predict": 10.0, "stop": []any{"."}, "seed": 42.0,
			"presence_penalty": 0.5, "frequency_penalty": -0.5,
		}},
		{"vLLM's extras", llm.Options{TopK: ptr(int64(40)), MinP: ptr(0.05), RepetitionPenalty: ptr(1.1)},
			map[string]any{"top_k": 40.0, "min_p": 0.05, "repeat_penalty": 1.1}},
		{"top_k -1 is off", llm.Options{TopK: ptr(int64(-1))}, map[string]any{"top_k": 0.0}},
	}
	f := newFakeOllama(t, nil)
	b := newBackend(t, f.srv.URL, nil)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := b.Chat(context.Background(), &llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, Options: c.opts})
			if err != nil {
				t.Fatal(err)
			}
			collect(s)
			s.Close()
			got, _ := f.lastBody(t)["options"].(map[string]any)
			gj, _ := json.Marshal(got)
			wj, _ := json.Marshal(c.want)
			if string(gj) != string(wj) {
				t.Fatalf("options = %s, want %s", gj, wj)
			}
		})
	}
}

func TestMessagesToolsAndFormat(t *testing.T) {
	f := newFakeOllama(t, nil)
	b := newBackend(t, f.srv.URL, nil)
	req := &llm.Request{
		Messages: []llm.Message{
			{Role: "system", Content: "be brief"},
			{Role: "user", Content: "weather in Oslo?"},
			{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)}}},
			{Role: "tool", Content: `{"temp":3}`, ToolName: "get_weather"},
		},
		Format: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}}}`),
		Tools: []llm.Tool{{
			Name: "get_weather", Description: "Current weather",
			Parameters: json.RawMessage(`{"type":"object","required":["city"],"properties":{"city":{"type":"string","description":"City name"},"unit":{"type":"string","enum":["c","f"]}}}`),
		}},
	}
	s, err := b.Chat(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	collect(s)
	s.Close()
	body := f.lastBody(t)
	gotMsgs, _ := json.Marshal(body["messages"])
	wantMsgs := `[{"content":"be brief","role":"system"},{"content":"weather in Oslo?","role":"user"},` +
		`{"content":"","role":"assistant","tool_calls":[{"function":{"arguments":{"city":"Oslo"},"name":"get_weather"}}]},` +
		`{"content":"{\"temp\":3}","role":"tool","tool_name":"get_weather"}]`
	if string(gotMsgs) != wantMsgs {
		t.Fatalf("messages\n got %s\nwant %s", gotMsgs, wantMsgs)
	}
	gotFormat, _ := json.Marshal(body["format"])
	if string(gotFormat) != `{"properties":{"a":{"type":"string"}},"type":"object"}` {
		t.Fatalf("format = %s", gotFormat)
	}
	tools, _ := body["tools"].([]any)
	if len(tools) != 1 {
		t.Fatalf("tools = %v", body["tools"])
	}
	tool := tools[0].(map[string]any)
	fn := tool["function"].(map[string]any)
	params := fn["parameters"].(map[string]any)
	props := params["properties"].(map[string]any)
	city := props["city"].(map[string]any)
	unit := props["unit"].(map[string]any)
	if tool["type"] != "function" || fn["name"] != "get_weather" || fn["description"] != "Current weather" ||
		params["type"] != "object" || city["type"] != "string" || city["description"] != "City name" ||
		len(unit["enum"].([]any)) != 2 || params["required"].([]any)[0] != "city" {
		t.Fatalf("tool = %v", tool)
	}
}

func TestInvalidRequestsAreRejectedBeforeSending(t *testing.T) {
	f := newFakeOllama(t, nil)
	b := newBackend(t, f.srv.URL, nil)
	cases := map[string]*llm.Request{
		"schema not an object":              {Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`[1,2]`)}}},
		"property type a number":            {Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{"a":{"type":5}}}`)}}},
		"tool call arguments not an object": {Messages: []llm.Message{{Role: "assistant", ToolCalls: []llm.ToolCall{{Name: "f", Arguments: json.RawMessage(`"x"`)}}}}},
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := b.Chat(context.Background(), req)
			var ire *llm.InvalidRequestError
			if !errors.As(err, &ire) {
				t.Fatalf("err = %v, want InvalidRequestError", err)
			}
		})
	}
	f.mu.Lock()
	n := len(f.bodies)
	f.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d invalid requests reached ollama", n)
	}
}

func TestToolCallsAndFinishReasons(t *testing.T) {
	var lines []string
	f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) { writeLines(w, lines...) })
	b := newBackend(t, f.srv.URL, nil)
	run := func() result {
		s, err := b.Chat(context.Background(), &llm.Request{Messages: []llm.Message{{Role: "user", Content: "x"}}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		return collect(s)
	}

	lines = []string{
		`{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather","arguments":{"city":"Oslo"}}},{"function":{"name":"now","arguments":{}}}]},"done":false}`,
		`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":9}`,
	}
	r := run()
	if r.err != nil || len(r.calls) != 2 || r.final.FinishReason != llm.FinishToolCalls {
		t.Fatalf("tool calls: %+v", r)
	}
	if r.calls[0].Name != "get_weather" || string(r.calls[0].Arguments) != `{"city":"Oslo"}` || string(r.calls[1].Arguments) != `{}` {
		t.Fatalf("calls %+v", r.calls)
	}
	if !strings.HasPrefix(r.calls[0].ID, "call_") || len(r.calls[0].ID) < 12 || r.calls[0].ID == r.calls[1].ID {
		t.Fatalf("call ids %q %q", r.calls[0].ID, r.calls[1].ID)
	}

	lines = []string{
		`{"message":{"role":"assistant","content":"a"},"done":false}`,
		`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"length","prompt_eval_count":3,"eval_count":1}`,
	}
	if r := run(); r.err != nil || r.final.FinishReason != llm.FinishLength || r.final.CompletionTokens != 1 {
		t.Fatalf("length: %+v", r)
	}

	// Content on the final line (Ollama flushes held-back text there) is
	// delivered before the final event.
	lines = []string{
		`{"message":{"role":"assistant","content":"a"},"done":false}`,
		`{"message":{"role":"assistant","content":"bc"},"done":true,"done_reason":"stop","eval_count":3}`,
	}
	if r := run(); r.err != nil || r.text != "abc" || r.final.FinishReason != llm.FinishStop {
		t.Fatalf("final content: %+v", r)
	}
}

func TestErrorsAreClassified(t *testing.T) {
	status := func(code int, body string) func(w http.ResponseWriter, r *http.Request) {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(code)
			io.WriteString(w, body)
		}
	}
	req := &llm.Request{Messages: []llm.Message{{Role: "user", Content: "x"}}}

	t.Run("400 is an invalid request", func(t *testing.T) {
		f := newFakeOllama(t, status(400, `{"error":"registry.ollama.ai/library/m:latest does not support tools"}`))
		_, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
		var ire *llm.InvalidRequestError
		if !errors.As(err, &ire) || !strings.Contains(ire.Msg, "does not support tools") {
			t.Fatalf("err = %v", err)
		}
	})
	for _, c := range []struct {
		code int
		body string
	}{{404, `{"error":"model \"m\" not found, try pulling it first"}`}, {500, `{"error":"llama runner process has terminated"}`}, {503, `{"error":"server busy"}`}} {
		t.Run(http.StatusText(c.code), func(t *testing.T) {
			f := newFakeOllama(t, status(c.code, c.body))
			_, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
			if !errors.Is(err, llm.ErrUnavailable) {
				t.Fatalf("err = %v, want ErrUnavailable", err)
			}
		})
	}
	// Ollama's words for a format it cannot turn into a grammar or sample
	// with (0.9.6 and 0.17.4, their server and both runners) are the
	// client's error, whatever the status.
	for _, body := range []string{
		`{"error":"invalid JSON schema in format"}`,
		`{"error":"invalid format: \"x\"; expected \"json\" or a valid JSON Schema object"}`,
		`{"error":"Failed to create new sequence: unable to create sampling context\n"}`,
		`{"error":"failed to load model vocabulary required for format"}`,
	} {
		t.Run("schema refused "+body, func(t *testing.T) {
			f := newFakeOllama(t, status(500, body))
			_, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
			var ire *llm.InvalidRequestError
			if !errors.As(err, &ire) || !ire.Schema || errors.Is(err, llm.ErrUnavailable) || !strings.Contains(ire.Msg, "JSON schema") {
				t.Fatalf("err = %#v", err)
			}
		})
	}
	t.Run("error line before any token", func(t *testing.T) {
		f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) { writeLines(w, `{"error":"runner crashed"}`) })
		_, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
		if !errors.Is(err, llm.ErrUnavailable) || !strings.Contains(err.Error(), "runner crashed") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("malformed first line", func(t *testing.T) {
		f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) { writeLines(w, `<html>`) })
		_, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
		if !errors.Is(err, llm.ErrUnavailable) || !strings.Contains(err.Error(), "malformed") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("connection refused", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		url := "http://" + l.Addr().String()
		l.Close()
		b := newBackend(t, url, nil)
		_, err = b.Chat(context.Background(), req)
		if !errors.Is(err, llm.ErrUnavailable) || !strings.Contains(err.Error(), "unreachable") {
			t.Fatalf("chat err = %v", err)
		}
		if err := b.Ready(context.Background()); !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("ready err = %v", err)
		}
		if _, err := b.Warm(context.Background()); !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("warm err = %v", err)
		}
		if err := b.EnsureModel(context.Background(), ModelSource{}); !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("ensure err = %v", err)
		}
	})
	t.Run("connection closed without an answer", func(t *testing.T) {
		f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
		})
		_, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
		if !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("err = %v", err)
		}
	})
	// A runtime that is late keeps its request until it answers (it would
	// go on reading the prompt anyway): the caller gets ErrTimeout at once,
	// and RuntimeDone closes only once the runtime has answered and the
	// request is closed.
	for _, headersFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("first line late, headers first %v", headersFirst), func(t *testing.T) {
			release, gone := make(chan struct{}), make(chan struct{})
			f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
				defer close(gone)
				if headersFirst {
					w.WriteHeader(200)
					w.(http.Flusher).Flush()
				}
				<-release
				writeLines(w, `{"message":{"role":"assistant","content":"late"},"done":false}`)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			b := newBackend(t, f.srv.URL, func(c *Config) { c.FirstByteTimeout = 50 * time.Millisecond })
			_, err := b.Chat(context.Background(), req)
			var ab llm.Abandoned
			if !errors.Is(err, llm.ErrTimeout) || !errors.As(err, &ab) {
				t.Fatalf("err = %v, want ErrTimeout and llm.Abandoned", err)
			}
			select {
			case <-ab.RuntimeDone():
				t.Fatal("done before the runtime answered")
			case <-gone:
				t.Fatal("the request was dropped while the runtime still worked on it")
			default:
			}
			close(release)
			for what, ch := range map[string]<-chan struct{}{"RuntimeDone": ab.RuntimeDone(), "the request's end": gone} {
				select {
				case <-ch:
				case <-time.After(10 * time.Second):
					t.Fatalf("%s: not within 10 s of the answer", what)
				}
			}
		})
	}
	t.Run("mid-stream error line", func(t *testing.T) {
		f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
			writeLines(w, `{"message":{"role":"assistant","content":"a"},"done":false}`, `{"error":"an error was encountered while running the model"}`)
		})
		s, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		r := collect(s)
		if r.text != "a" || r.err == nil || !strings.Contains(r.err.Error(), "while running the model") {
			t.Fatalf("%+v", r)
		}
		if _, err := s.Recv(); err == nil || err == io.EOF {
			t.Fatalf("Recv after failure = %v", err)
		}
	})
	t.Run("stream cut before the final line", func(t *testing.T) {
		f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
			writeLines(w, `{"message":{"role":"assistant","content":"a"},"done":false}`)
		})
		s, err := newBackend(t, f.srv.URL, nil).Chat(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		r := collect(s)
		if r.text != "a" || !errors.Is(r.err, io.ErrUnexpectedEOF) {
			t.Fatalf("%+v", r)
		}
	})
}

// TestCancelAbortsRequest checks that both ways of stopping a stream make
// the server see its client go away, which is what stops Ollama.
func TestCancelAbortsRequest(t *testing.T) {
	for _, how := range []string{"context", "close"} {
		t.Run(how, func(t *testing.T) {
			gone := make(chan struct{})
			f := newFakeOllama(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				for {
					if _, err := io.WriteString(w, `{"message":{"role":"assistant","content":"tok"},"done":false}`+"\n"); err != nil {
						break
					}
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						close(gone)
						return
					case <-time.After(time.Millisecond):
					}
				}
				close(gone)
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := newBackend(t, f.srv.URL, nil).Chat(ctx, &llm.Request{})
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if _, err := s.Recv(); err != nil {
					t.Fatal(err)
				}
			}
			if how == "context" {
				cancel()
			} else {
				s.Close()
			}
			select {
			case <-gone:
			case <-time.After(10 * time.Second):
				t.Fatal("server did not see the request end")
			}
			var err2 error
			for i := 0; i < 10000 && err2 == nil; i++ {
				_, err2 = s.Recv()
			}
			if err2 == nil || err2 == io.EOF {
				t.Fatalf("Recv after stop = %v", err2)
			}
			if how == "context" && !errors.Is(err2, context.Canceled) {
				t.Fatalf("Recv after cancel = %v, want context.Canceled", err2)
			}
			s.Close()
		})
	}
}

func TestConcurrentStreams(t *testing.T) {
	f := newFakeOllama(t, nil)
	b := newBackend(t, f.srv.URL, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := b.Chat(context.Background(), &llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}})
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			if r := collect(s); r.err != nil || r.text != "Hello" || !r.final.Done {
				errs <- fmt.Errorf("stream: %+v", r)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{BaseURL: "http://127.0.0.1:1"}); err == nil {
		t.Error("no model accepted")
	}
	if _, err := New(Config{BaseURL: "127.0.0.1:1", Model: "m"}); err == nil {
		t.Error("URL without scheme accepted")
	}
}

func TestSameModel(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"hearth-tiny", "hearth-tiny:latest", true},
		{"llama3:8b", "llama3:8b", true},
		{"llama3:8b", "llama3", false},
		{"host:5000/ns/m", "host:5000/ns/m:latest", true},
	} {
		if got := sameModel(c.a, c.b); got != c.want {
			t.Errorf("sameModel(%q, %q) = %v", c.a, c.b, got)
		}
	}
}

// BenchmarkStream measures the per-token cost of reading a stream: b.N
// tokens from a loopback server that answers with pre-encoded lines.
func BenchmarkStream(b *testing.B) {
	const perRequest = 1000
	var body bytes.Buffer
	for i := 0; i < perRequest; i++ {
		body.WriteString(`{"model":"m","created_at":"2026-01-01T00:00:00.000000Z","message":{"role":"assistant","content":" word"},"done":false}` + "\n")
	}
	body.WriteString(`{"model":"m","created_at":"2026-01-01T00:00:00.000000Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","prompt_eval_count":5,"eval_count":1000}` + "\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write(body.Bytes())
	}))
	defer srv.Close()
	be, err := New(Config{BaseURL: srv.URL, Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	req := &llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}}
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; {
		s, err := be.Chat(context.Background(), req)
		if err != nil {
			b.Fatal(err)
		}
		for {
			ev, err := s.Recv()
			if err != nil {
				if err != io.EOF {
					b.Fatal(err)
				}
				break
			}
			if !ev.Done {
				n++
			}
		}
		s.Close()
	}
}
