package deployapi

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
)

// A panic on a request's path fails that request alone: the client gets
// a 500 (or, once its stream has begun, an error event and a clean end),
// the process lives on, the panic is logged with its stack, and the
// request's generation slot is free again (with one slot and no queue, a
// slot kept would make the next request a 429).
func TestPanicFailsOnlyItsRequest(t *testing.T) {
	const (
		chat   = `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
		stream = `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
		twoN   = `{"model":"hearth-tiny","stream":true,"n":2,"messages":[{"role":"user","content":"hi"}]}`
	)
	ok := fake.Config{Tokens: []string{"x"}, TokenCount: 5}
	for _, tc := range []struct {
		name, path, body string
		fc               fake.Config
		streamed         bool // the panic comes after the stream began
	}{
		{"start", "/chat/completions", chat, fake.Config{ChatPanic: "boom"}, false},
		{"start streamed", "/chat/completions", stream, fake.Config{ChatPanic: "boom"}, false},
		{"embeddings", "/embeddings", `{"model":"hearth-tiny","input":"x"}`, fake.Config{ChatPanic: "boom"}, false},
		{"mid-generation", "/chat/completions", chat, fake.Config{Tokens: []string{"x"}, TokenCount: 5, StreamPanic: "boom", FailAfter: 2}, false},
		{"mid-stream", "/chat/completions", stream, fake.Config{Tokens: []string{"x"}, TokenCount: 5, StreamPanic: "boom", FailAfter: 2}, true},
		{"mid-stream, two choices", "/chat/completions", twoN, fake.Config{Tokens: []string{"x"}, TokenCount: 5, StreamPanic: "boom", FailAfter: 2}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs testutil.SyncBuffer
			ta := startAPILog(t, tc.fc, func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 2, 0 }, slog.New(slog.NewTextHandler(&logs, nil)))
			resp := ta.postTo(t, tc.path, tc.body, nil)
			if tc.streamed {
				if resp.StatusCode != 200 {
					t.Fatalf("status %d, want 200 (the stream began)", resp.StatusCode)
				}
				evs := readSSE(t, resp.Body)
				resp.Body.Close()
				if len(evs) < 3 || evs[len(evs)-1].data != "[DONE]" {
					t.Fatalf("stream did not end cleanly: %v", evs)
				}
				if e, _ := chunkOf(t, evs[len(evs)-2])["error"].(map[string]any); e == nil || e["type"] != "server_error" {
					t.Fatalf("no server_error event before [DONE]: %v", evs[len(evs)-2].data)
				}
			} else {
				if resp.StatusCode != 500 {
					t.Fatalf("status %d, want 500", resp.StatusCode)
				}
				if e := errorOf(t, resp); e["type"] != "server_error" || strings.Contains(e["message"].(string), "boom") {
					t.Fatalf("error %v: want server_error without the panic's text", e)
				}
			}
			if l := logs.String(); !strings.Contains(l, "recovered from a panic") || !strings.Contains(l, "panic=boom") || !strings.Contains(l, "llm/fake/fake.go") {
				t.Fatalf("panic not logged with its stack:\n%s", l)
			}
			if n := counterValue(t, ta, "hearth_panics_recovered_total", nil); n != 1 {
				t.Fatalf("hearth_panics_recovered_total %v, want 1", n)
			}
			// The slots are free: as many requests as there are slots at once.
			ta.rt.SetConfig(ok)
			done := make(chan int, 2)
			for range 2 {
				go func() {
					r := ta.postTo(t, tc.path, strings.Replace(tc.body, `"n":2,`, "", 1), nil)
					_, _ = io.Copy(io.Discard, r.Body)
					r.Body.Close()
					done <- r.StatusCode
				}()
			}
			for range 2 {
				if code := <-done; code != 200 {
					t.Fatalf("after the panic: status %d, want 200 (a slot kept?)", code)
				}
			}
		})
	}
}

// A panic while the handler writes a stream's head (the connection's
// first request) fails that stream: the connection closes without an
// answer, the panic is logged and counted, and the slot is free again.
func TestPanicWritingAStreamsHead(t *testing.T) {
	var logs testutil.SyncBuffer
	ta := startAPILog(t, fake.Config{Tokens: []string{"x"}, BufferedPanic: "boom"},
		func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 1, 0 }, slog.New(slog.NewTextHandler(&logs, nil)))
	conn, br := ta.dialRaw(t)
	if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	}
	if b, err := io.ReadAll(br); err != nil || len(b) != 0 {
		t.Fatalf("read %q, %v: want the connection closed without an answer", b, err)
	}
	if l := logs.String(); !strings.Contains(l, "recovered from a panic") || !strings.Contains(l, "panic=boom") {
		t.Fatalf("panic not logged:\n%s", l)
	}
	if n := counterValue(t, ta, "hearth_panics_recovered_total", nil); n != 1 {
		t.Fatalf("hearth_panics_recovered_total %v, want 1", n)
	}
	ta.rt.SetConfig(fake.Config{Tokens: []string{"x"}})
	testutil.WaitFor(t, 10*time.Second, "the slot back", func() bool { return ta.api.lim.active() == 0 })
	resp := ta.post(t, chatBody("hi", ""), nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after the panic: status %d, want 200 (the slot kept?)", resp.StatusCode)
	}
}
