package deployapi

import (
	"bufio"
	"context"
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
	"unsafe"

	"github.com/hearthd/hearth/internal/evloop"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/ollama"
	"github.com/hearthd/hearth/openai"
)

// fakeOllama answers /api/chat with an NDJSON stream as Ollama writes it
// (net/http, a flush per line) and /api/show with a model's limits.
type fakeOllama struct {
	tokens []string
	delay  time.Duration // before each token after the first
	// breakAfter, if > 0, cuts the connection after that many tokens.
	breakAfter atomic.Int32
	// dieAt, if > 0, holds token dieAt until die closes, then sends it and
	// cuts the connection at once, and closes died: the token and the end
	// arrive together.
	dieAt     int
	die, died chan struct{}

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
		if f.dieAt > 0 && i == f.dieAt {
			<-f.die
			content, _ := json.Marshal(tok)
			fmt.Fprintf(w, `{"model":"%s","message":{"role":"assistant","content":%s},"done":false}`+"\n", testModel, content)
			fl.Flush()
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			close(f.died)
			return
		}
		if b := int(f.breakAfter.Load()); b > 0 && i == b {
			c, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		content, _ := json.Marshal(tok)
		_, err := fmt.Fprintf(w, `{"model":"%s","message":{"role":"assistant","content":%s},"done":false}`+"\n", testModel, content)
		fl.Flush()
		if err != nil || r.Context().Err() != nil {
			f.cancelled <- struct{}{}
			return
		}
	}
	fmt.Fprintf(w, `{"model":"%s","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":%d}`+"\n", testModel, len(f.tokens))
}

// startPolledAPI is startAPI over an Ollama backend on f, relayed from an
// event loop.
func startPolledAPI(t *testing.T, f *fakeOllama, mod func(*APIConfig)) *testAPI {
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
	loop, err := evloop.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ollama.New(ollama.Config{BaseURL: rs.URL, Model: testModel, Loop: loop})
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last first: the API and its server, then these.
	t.Cleanup(func() {
		b.CloseIdleConnections()
		loop.Close()
	})
	cfg := APIConfig{
		Model: testModel, Version: "test", MaxConcurrent: 8, MaxQueue: 8, MaxBodyBytes: 64 << 10,
		WriteStallTimeout: 5 * time.Second, Loop: loop,
	}
	if mod != nil {
		mod(&cfg)
	}
	return serveAPI(t, cfg, b, slog.New(slog.DiscardHandler))
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

func dialAPI(t *testing.T, ta *testAPI) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(ta.root, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

// A runtime whose last bytes and close arrive together, in one event of
// the loop (edge-triggered: no other event follows), still ends the
// stream: the read that takes the bytes is short, and without the close in
// the event's flags the stream would wait for an edge that never comes.
func TestPolledRuntimeDiesWithItsLastBytes(t *testing.T) {
	f := &fakeOllama{tokens: []string{"a", "b", "c"}, dieAt: 1, die: make(chan struct{}), died: make(chan struct{})}
	var loop *evloop.Loop
	ta := startPolledAPI(t, f, func(c *APIConfig) { loop = c.Loop })
	conn, br := dialAPI(t, ta)
	resp := ta.streamHead(t, conn, br)
	defer resp.Body.Close()
	events := make(chan sseEvent, 16)
	go func() {
		defer close(events)
		rd := bufio.NewReader(resp.Body)
		for {
			line, err := rd.ReadString('\n')
			if data, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); ok {
				events <- sseEvent{data: data}
			}
			if err != nil {
				return
			}
		}
	}()
	// On a failure, close the connection first: the reader goroutine's
	// Read ends, and with it its hold on the body, which the deferred
	// Close would wait for.
	fail := func(format string, args ...any) {
		t.Helper()
		conn.Close()
		t.Fatalf(format, args...)
	}
	timeout := time.After(10 * time.Second) // a bound for a broken build
	// The first token is through: the stream waits on the loop.
	for first := false; !first; {
		select {
		case e, ok := <-events:
			if !ok {
				fail("stream ended before its first token")
			}
			first = strings.Contains(e.data, `"content":"a"`)
		case <-timeout:
			fail("no first token")
		}
	}
	// Hold the loop while the runtime sends its token and closes, so
	// that both are in the socket when the loop looks.
	held, release := make(chan struct{}), make(chan struct{})
	loop.Post(func() { close(held); <-release })
	<-held
	close(f.die)
	<-f.died
	time.Sleep(50 * time.Millisecond) // loopback delivers the FIN at once; this is slack
	close(release)
	var rest []string
	for {
		select {
		case e, ok := <-events:
			if !ok {
				fail("stream ended without [DONE]: %q", rest)
			}
			rest = append(rest, e.data)
			if e.data != "[DONE]" {
				continue
			}
			all := strings.Join(rest, "\n")
			if !strings.Contains(all, `"content":"b"`) || !strings.Contains(all, `"error"`) {
				fail("after the runtime died: %q, want the token b, an error, then [DONE]", rest)
			}
			return
		case <-timeout:
			fail("the stream did not end after the runtime closed; got %q", rest)
		}
	}
}

// Streams relayed from the loop carry every token and the usage, keep the
// client's connection for the next request, and hand the runtime's
// connection back too: five streams, one connection on the client's side
// and at most two on the runtime's (the client may see a stream's end and
// send its next request before the runtime's connection, still waiting
// for the end of its answer, is back in the pool).
func TestPolledStreams(t *testing.T) {
	f := &fakeOllama{tokens: []string{"Hello", ",", " polled", " world"}, delay: 2 * time.Millisecond}
	ta := startPolledAPI(t, f, nil)
	conn, br := dialAPI(t, ta)
	for i := range 5 {
		content, done, usage := ta.streamOn(t, conn, br)
		if content != "Hello, polled world" || !done {
			t.Fatalf("stream %d: content %q, [DONE] %v", i, content, done)
		}
		if usage["completion_tokens"] != float64(4) || usage["prompt_tokens"] != float64(3) {
			t.Fatalf("stream %d: usage %v", i, usage)
		}
	}
	// A stream whose whole answer came in before its head was written (a
	// slow machine) leaves nothing to relay; every other one is the loop's.
	if n, w := ta.api.polled.Load(), ta.api.whole.Load(); n+w != 5 || n == 0 {
		t.Fatalf("%d of 5 streams relayed from the loop, %d whole at their head", n, w)
	}
	if n := f.conns.Load(); n > 2 {
		t.Fatalf("the runtime saw %d connections for 5 streams one after another, want at most 2 (kept alive)", n)
	}
}

// Each token reaches the client when the runtime sends it, not at the end.
func TestPolledStreamFlushesPerToken(t *testing.T) {
	f := &fakeOllama{tokens: []string{"a", "b", "c", "d"}, delay: 200 * time.Millisecond}
	ta := startPolledAPI(t, f, nil)
	conn, br := dialAPI(t, ta)
	resp := ta.streamHead(t, conn, br)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var seen []string
	var at []time.Time
	for sc.Scan() && len(seen) < 4 {
		if strings.Contains(sc.Text(), `"content":"`) && !strings.Contains(sc.Text(), `"content":""`) {
			seen = append(seen, sc.Text())
			at = append(at, time.Now())
		}
	}
	if len(seen) != 4 {
		t.Fatalf("saw %d content chunks", len(seen))
	}
	// The runtime spaces tokens 200 ms apart: had they been held back and
	// written together, the first and the last would arrive together.
	if gap := at[3].Sub(at[0]); gap < 300*time.Millisecond {
		t.Fatalf("first and last token %v apart: written together, not as they came", gap)
	}
	if ta.api.polled.Load() != 1 {
		t.Fatal("the stream was not relayed from the loop")
	}
}

// A client that leaves mid-stream stops the generation on the runtime.
func TestPolledDisconnectCancels(t *testing.T) {
	f := &fakeOllama{tokens: []string{"x", "y"}, delay: slowToken}
	ta := startPolledAPI(t, f, nil)
	conn := ta.streamUntil(t, "/chat/completions", streamBody, `"content":"x"`)
	testutil.WaitFor(t, 10*time.Second, "the loop to relay the stream", func() bool { return ta.api.polled.Load() == 1 })
	conn.Close()
	select {
	case <-f.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the runtime's stream still open 10 s after the client left")
	}
}

// A client that stops reading is cut after WriteStallTimeout without
// progress, and the generation stops.
func TestPolledStalledClient(t *testing.T) {
	// ~40 MB of 2 KiB tokens, sent as fast as they go: far more than the
	// socket buffers on both sides hold.
	tok := strings.Repeat("z", 2<<10)
	f := &fakeOllama{tokens: make([]string, 20000)}
	for i := range f.tokens {
		f.tokens[i] = tok
	}
	ta := startPolledAPI(t, f, func(c *APIConfig) { c.WriteStallTimeout = 300 * time.Millisecond })
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	conn, err := d.Dial("tcp", strings.TrimPrefix(ta.root, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ta.sendStream(conn)
	// Never read.
	select {
	case <-f.cancelled:
	case <-time.After(20 * time.Second):
		t.Fatal("the generation still runs 20 s after the client stopped reading")
	}
	if ta.api.polled.Load() != 1 {
		t.Fatal("the stream was not relayed from the loop")
	}
}

// A line longer than the runtime read buffer is relayed whole: the stream
// goes on from a goroutine.
func TestPolledLongLine(t *testing.T) {
	long := strings.Repeat("L", 10<<10)
	f := &fakeOllama{tokens: []string{"a", long, "b"}}
	ta := startPolledAPI(t, f, nil)
	conn, br := dialAPI(t, ta)
	for i := range 2 {
		content, done, _ := ta.streamOn(t, conn, br)
		if content != "a"+long+"b" || !done {
			t.Fatalf("stream %d: content of %d bytes, [DONE] %v", i, len(content), done)
		}
	}
}

// A runtime that breaks mid-stream: the client gets the error in the
// stream and its end, and the connection serves the next request.
func TestPolledRuntimeBreaks(t *testing.T) {
	f := &fakeOllama{tokens: []string{"a", "b", "c"}}
	f.breakAfter.Store(2)
	ta := startPolledAPI(t, f, nil)
	conn, br := dialAPI(t, ta)
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

// Many streams at once through one loop: each gets its own tokens whole.
func TestPolledConcurrentStreams(t *testing.T) {
	f := &fakeOllama{tokens: []string{"p", "q", "r", "s", "t"}, delay: 5 * time.Millisecond}
	ta := startPolledAPI(t, f, func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 32, 32 })
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", strings.TrimPrefix(ta.root, "http://"))
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
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n, w := ta.api.polled.Load(), ta.api.whole.Load(); n+w != 96 || n == 0 {
		t.Fatalf("%d of 96 streams relayed from the loop, %d whole at their head", n, w)
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

// A stream relayed from the loop that ends while the server drains closes
// its connection, as a goroutine's does.
func TestPolledStreamClosesItsConnectionWhenDraining(t *testing.T) {
	f := &fakeOllama{tokens: []string{"a", "b", "c", "d", "e"}, delay: 20 * time.Millisecond}
	ta := startPolledAPI(t, f, nil)
	conn, br := dialAPI(t, ta)
	ta.sendStream(conn)
	drainDuringStream(t, ta, conn, br, func() {
		testutil.WaitFor(t, 10*time.Second, "the loop to relay the stream", func() bool { return ta.api.polled.Load() == 1 })
	})
}

// A polled chat stream names for the loop what its handler reads at every
// token: the relay, its body, the completion, the stream, the sink, and
// the encoder with the prefix and suffix it copies.
func TestPollRelayCacheLines(t *testing.T) {
	enc := openai.NewChunkEncoder("chatcmpl-1", 1, "m", "fp", false)
	k := newChatSink(enc, 1, false, false)
	c := &completion{}
	c.choices = c.one[:]
	sg := &single{}
	c.stream = sg
	r := &pollRelay{b: &sseBody{c: c, sink: k}}
	lines := map[unsafe.Pointer]bool{}
	for _, p := range r.cacheLines() {
		lines[p] = true
	}
	for what, p := range map[string]unsafe.Pointer{
		"relay": unsafe.Pointer(r), "body": unsafe.Pointer(r.b), "completion": unsafe.Pointer(c),
		"stream": unsafe.Pointer(sg), "sink": unsafe.Pointer(k), "encoder": unsafe.Pointer(enc),
	} {
		if !lines[p] {
			t.Errorf("the %s is not among the hot lines", what)
		}
	}
}
