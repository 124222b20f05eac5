package deployapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/llm/ollama"
)

// The tests here run the deployment API over the Ollama backend, against a
// runtime that writes its answers as Ollama does (net/http, a flush per
// line): the path a token takes in production, from the runtime's socket
// to the client's, over plain HTTP and over TLS.

// fakeOllama answers /api/chat with an NDJSON stream as Ollama writes it
// and /api/show with a model's limits.
type fakeOllama struct {
	tokens []string
	delay  time.Duration // before each token after the first
	// breakAfter, if > 0, cuts the connection after that many tokens.
	breakAfter atomic.Int32

	conns     atomic.Int64  // connections accepted
	cancelled chan struct{} // a stream's client went away, one per stream
}

func (f *fakeOllama) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/api/show":
		fmt.Fprint(w, `{"capabilities":["completion"],"model_info":{"llama.context_length":4096}}`)
		return
	case "/api/chat":
	default:
		http.NotFound(w, r)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/x-ndjson")
	fl := w.(http.Flusher)
	for i, tok := range f.tokens {
		if i > 0 && f.delay > 0 {
			select {
			case <-time.After(f.delay):
			case <-r.Context().Done():
				f.cancelled <- struct{}{}
				return
			}
		}
		if b := int(f.breakAfter.Load()); b > 0 && i == b {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		}
		content, _ := json.Marshal(tok)
		_, err := fmt.Fprintf(w, `{"model":"%s","created_at":"t","message":{"role":"assistant","content":%s},"done":false}`+"\n", testModel, content)
		fl.Flush()
		if err != nil || r.Context().Err() != nil {
			f.cancelled <- struct{}{}
			return
		}
	}
	fmt.Fprintf(w, `{"model":"%s","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":%d}`+"\n", testModel, len(f.tokens))
}

// startOllamaAPI is startAPIOver over an Ollama backend on f.
func startOllamaAPI(t *testing.T, overTLS bool, f *fakeOllama, mod func(*APIConfig)) *testAPI {
	t.Helper()
	if f.cancelled == nil {
		f.cancelled = make(chan struct{}, 16)
	}
	rs := httptest.NewUnstartedServer(f)
	rs.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			f.conns.Add(1)
		}
	}
	rs.Start()
	t.Cleanup(rs.Close)
	b, err := ollama.New(ollama.Config{BaseURL: rs.URL, Model: testModel})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the API and its server, then this.
	t.Cleanup(b.CloseIdleConnections)
	cfg := APIConfig{
		Model: testModel, Version: "test", MaxConcurrent: 8, MaxQueue: 8, MaxBodyBytes: 64 << 10,
		WriteStallTimeout: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	return serveAPIOver(t, overTLS, cfg, b, slog.New(slog.DiscardHandler))
}

const streamBody = `{"model":"hearth-tiny","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`

// streamHead sends a streamed chat request on conn and reads its
// response's head.
func (ta *testAPI) streamHead(t *testing.T, conn net.Conn, br *bufio.Reader) *http.Response {
	t.Helper()
	ta.sendStream(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sendStream writes a streamed chat request (streamBody) on conn.
func (ta *testAPI) sendStream(conn net.Conn) {
	fmt.Fprintf(conn, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		ta.secret, len(streamBody), streamBody)
}

// streamOn writes a streamed chat request on conn and reads its response
// to the end: the content, and whether it ended with [DONE].
func (ta *testAPI) streamOn(t *testing.T, conn net.Conn, br *bufio.Reader) (content string, done bool, usage map[string]any) {
	t.Helper()
	resp := ta.streamHead(t, conn, br)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var sb strings.Builder
	for _, e := range readSSE(t, resp.Body) {
		if e.data == "[DONE]" {
			done = true
			continue
		}
		c := chunkOf(t, e)
		if u, ok := c["usage"].(map[string]any); ok {
			usage = u
		}
		for _, ch := range c["choices"].([]any) {
			if d, ok := ch.(map[string]any)["delta"].(map[string]any); ok {
				s, _ := d["content"].(string)
				sb.WriteString(s)
			}
		}
	}
	return sb.String(), done, usage
}

// Streams one after another on one connection are relayed whole and keep
// the connections alive on both sides: five streams, one connection on the
// client's side and at most two on the runtime's (the client may see a
// stream's end and send its next request before the runtime's connection
// is back in the pool).
func TestRuntimeStreams(t *testing.T) { overBoth(t, testRuntimeStreams) }

func testRuntimeStreams(t *testing.T, overTLS bool) {
	f := &fakeOllama{tokens: []string{"Hello", ",", " relayed", " world"}, delay: 2 * time.Millisecond}
	ta := startOllamaAPI(t, overTLS, f, nil)
	conn, br := ta.dialRaw(t)
	for i := range 5 {
		content, done, usage := ta.streamOn(t, conn, br)
		if content != "Hello, relayed world" || !done {
			t.Fatalf("stream %d: content %q, [DONE] %v", i, content, done)
		}
		if usage["completion_tokens"] != float64(4) || usage["prompt_tokens"] != float64(3) {
			t.Fatalf("stream %d: usage %v", i, usage)
		}
	}
	if n := f.conns.Load(); n > 2 {
		t.Fatalf("the runtime saw %d connections for 5 streams one after another, want at most 2 (kept alive)", n)
	}
}

// Each token reaches the client when the runtime sends it, not at the end.
func TestRuntimeStreamFlushesPerToken(t *testing.T) { overBoth(t, testRuntimeStreamFlushesPerToken) }

func testRuntimeStreamFlushesPerToken(t *testing.T, overTLS bool) {
	f := &fakeOllama{tokens: []string{"a", "b", "c", "d"}, delay: 200 * time.Millisecond}
	ta := startOllamaAPI(t, overTLS, f, nil)
	conn, br := ta.dialRaw(t)
	resp := ta.streamHead(t, conn, br)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var at []time.Time
	for sc.Scan() && len(at) < 4 {
		if strings.Contains(sc.Text(), `"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
			at = append(at, time.Now())
		}
	}
	if len(at) != 4 {
		t.Fatalf("saw %d content chunks", len(at))
	}
	// The runtime spaces tokens 200 ms apart: had they been held back and
	// written together, the first and the last would arrive together.
	if gap := at[3].Sub(at[0]); gap < 300*time.Millisecond {
		t.Fatalf("first and last token %v apart: written together, not as they came", gap)
	}
}

// A client that leaves mid-stream stops the generation on the runtime.
func TestRuntimeDisconnectCancels(t *testing.T) { overBoth(t, testRuntimeDisconnectCancels) }

func testRuntimeDisconnectCancels(t *testing.T, overTLS bool) {
	f := &fakeOllama{tokens: []string{"x", "y"}, delay: slowToken}
	ta := startOllamaAPI(t, overTLS, f, nil)
	conn := ta.streamUntil(t, "/chat/completions", streamBody, `"content":"x"`)
	conn.Close()
	select {
	case <-f.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the runtime's stream still open 10 s after the client left")
	}
}

// A client that stops reading is cut after WriteStallTimeout without
// progress, and the generation stops.
func TestRuntimeStalledClient(t *testing.T) { overBoth(t, testRuntimeStalledClient) }

func testRuntimeStalledClient(t *testing.T, overTLS bool) {
	// ~40 MB of 2 KiB tokens, sent as fast as they go: far more than the
	// socket buffers on both sides hold.
	tok := strings.Repeat("z", 2<<10)
	f := &fakeOllama{tokens: make([]string, 20000)}
	for i := range f.tokens {
		f.tokens[i] = tok
	}
	ta := startOllamaAPI(t, overTLS, f, func(c *APIConfig) { c.WriteStallTimeout = 300 * time.Millisecond })
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	raw, err := d.Dial("tcp", ta.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	conn := raw
	if ta.tlsConf != nil {
		c := ta.tlsConf.Clone()
		c.ServerName = "127.0.0.1"
		tc := tls.Client(raw, c)
		if err := tc.Handshake(); err != nil {
			t.Fatal(err)
		}
		conn = tc
	}
	ta.sendStream(conn)
	// Never read.
	select {
	case <-f.cancelled:
	case <-time.After(20 * time.Second):
		t.Fatal("the generation still runs 20 s after the client stopped reading")
	}
}

// A line longer than the runtime's read buffer is relayed whole.
func TestRuntimeLongLine(t *testing.T) { overBoth(t, testRuntimeLongLine) }

func testRuntimeLongLine(t *testing.T, overTLS bool) {
	long := strings.Repeat("L", 10<<10)
	f := &fakeOllama{tokens: []string{"a", long, "b"}}
	ta := startOllamaAPI(t, overTLS, f, nil)
	conn, br := ta.dialRaw(t)
	for i := range 2 {
		content, done, _ := ta.streamOn(t, conn, br)
		if content != "a"+long+"b" || !done {
			t.Fatalf("stream %d: content of %d bytes, [DONE] %v", i, len(content), done)
		}
	}
}

// A runtime that breaks mid-stream: the client gets the error in the
// stream and its end, and the connection serves the next request.
func TestRuntimeBreaks(t *testing.T) { overBoth(t, testRuntimeBreaks) }

func testRuntimeBreaks(t *testing.T, overTLS bool) {
	f := &fakeOllama{tokens: []string{"a", "b", "c"}}
	f.breakAfter.Store(2)
	ta := startOllamaAPI(t, overTLS, f, nil)
	conn, br := ta.dialRaw(t)
	resp := ta.streamHead(t, conn, br)
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	var sawError bool
	for _, e := range events {
		if strings.Contains(e.data, `"error"`) {
			sawError = true
		}
	}
	if !sawError || events[len(events)-1].data != "[DONE]" {
		t.Fatalf("stream of a broken runtime: error %v, last %q", sawError, events[len(events)-1].data)
	}
	f.breakAfter.Store(0)
	if content, done, _ := ta.streamOn(t, conn, br); content != "abc" || !done {
		t.Fatalf("next stream: %q, [DONE] %v", content, done)
	}
}

// Many streams at once: each gets its own tokens whole.
func TestRuntimeConcurrentStreams(t *testing.T) { overBoth(t, testRuntimeConcurrentStreams) }

func testRuntimeConcurrentStreams(t *testing.T, overTLS bool) {
	f := &fakeOllama{tokens: []string{"p", "q", "r", "s", "t"}, delay: 5 * time.Millisecond}
	ta := startOllamaAPI(t, overTLS, f, func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 32, 32 })
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Go(func() {
			conn, err := ta.dial()
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			br := bufio.NewReader(conn)
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				content, done := streamText(ctx, ta, conn, br)
				cancel()
				if content != "pqrst" || !done {
					errs <- fmt.Errorf("content %q, [DONE] %v", content, done)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// streamText is streamOn for a goroutine other than the test's: no t.
func streamText(ctx context.Context, ta *testAPI, conn net.Conn, br *bufio.Reader) (string, bool) {
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	ta.sendStream(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err.Error(), false
	}
	defer resp.Body.Close()
	var sb strings.Builder
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		_ = json.Unmarshal([]byte(data), &c)
		for _, ch := range c.Choices {
			sb.WriteString(ch.Delta.Content)
		}
	}
	return sb.String(), done
}

// A stream that ends while the server drains closes its connection.
func TestRuntimeStreamClosesItsConnectionWhenDraining(t *testing.T) {
	overBoth(t, testRuntimeStreamClosesItsConnectionWhenDraining)
}

func testRuntimeStreamClosesItsConnectionWhenDraining(t *testing.T, overTLS bool) {
	f := &fakeOllama{tokens: []string{"a", "b", "c", "d", "e"}, delay: 20 * time.Millisecond}
	ta := startOllamaAPI(t, overTLS, f, nil)
	conn, br := ta.dialRaw(t)
	ta.sendStream(conn)
	drainDuringStream(t, ta, conn, br, nil)
}
