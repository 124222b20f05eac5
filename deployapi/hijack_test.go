package deployapi

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/metrics"
)

// dialRaw dials the test API and returns the connection with a reader.
func (ta *testAPI) dialRaw(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(ta.root, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	return conn, bufio.NewReader(conn)
}

func (ta *testAPI) rawPost(path, body string) string {
	return fmt.Sprintf("POST /api/v1%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, ta.secret, len(body), body)
}

// readStream reads one streamed answer and checks it is a whole chunked
// SSE stream ending in [DONE].
func readStream(t *testing.T, br *bufio.Reader) *http.Response {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || len(resp.TransferEncoding) != 1 || resp.TransferEncoding[0] != "chunked" {
		t.Fatalf("status %d, transfer encoding %v", resp.StatusCode, resp.TransferEncoding)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") ||
		resp.Header.Get("X-Request-Id") == "" || resp.Header.Get("Server") != "hearthd" || resp.Header.Get("Date") == "" {
		t.Fatalf("headers %v", resp.Header)
	}
	evs := readSSE(t, resp.Body)
	if len(evs) < 2 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream ended without [DONE]: %v", evs)
	}
	return resp
}

// A stream is written on the connection itself, and the connection then
// serves the client's next requests, streamed or not, as keep-alive.
func TestStreamKeepsTheConnection(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a", "b"}, TokenCount: 5}, nil)
	conn, br := ta.dialRaw(t)
	stream := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	for i := range 3 {
		if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", stream)); err != nil {
			t.Fatal(err)
		}
		if resp := readStream(t, br); resp.Close {
			t.Fatalf("stream %d: Connection: close", i)
		}
	}
	if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := decodeJSON(t, resp.Body); resp.StatusCode != 200 || m["object"] != "chat.completion" {
		t.Fatalf("non-stream after streams: %d %v", resp.StatusCode, m)
	}
	if n := len(ta.rt.Streams()); n != 4 {
		t.Fatalf("%d generations, want 4", n)
	}
}

// Requests the client sent behind a stream without waiting (pipelined)
// are answered after it, in order.
func TestPipelinedRequestsAfterAStream(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 3}, nil)
	conn, br := ta.dialRaw(t)
	stream := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	pipelineStreamsAndModels(t, conn, br, ta.rawPost("/chat/completions", stream), ta.secret)
}

// pipelineStreamsAndModels writes stream (a raw streamed chat request),
// GET /models, stream and GET /models again in one write on conn, and
// checks the four answers come back in that order.
func pipelineStreamsAndModels(t *testing.T, conn net.Conn, br *bufio.Reader, stream, secret string) {
	t.Helper()
	models := "GET /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + "\r\n\r\n"
	if _, err := io.WriteString(conn, stream+models+stream+models); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		readStream(t, br)
		readModels(t, br, fmt.Sprintf("pipelined models %d", i))
	}
}

// readModels reads one answer to GET /models and checks it is the list.
func readModels(t *testing.T, br *bufio.Reader, what string) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if m := decodeJSON(t, resp.Body); resp.StatusCode != 200 || m["object"] != "list" {
		t.Fatalf("%s: %d %v", what, resp.StatusCode, m)
	}
}

// A stream that is not its connection's first request (a response went
// before it, pipelined or not) has its head written after the handler,
// behind that response, and is the same stream.
func TestStreamAfterAResponseOnItsConnection(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 3}, nil)
	stream := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	models := "GET /api/v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ta.secret + "\r\n\r\n"
	readModels := func(br *bufio.Reader) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if m := decodeJSON(t, resp.Body); resp.StatusCode != 200 || m["object"] != "list" {
			t.Fatalf("models: %d %v", resp.StatusCode, m)
		}
	}
	for _, pipelined := range []bool{false, true} {
		conn, br := ta.dialRaw(t)
		if pipelined {
			if _, err := io.WriteString(conn, models+ta.rawPost("/chat/completions", stream)); err != nil {
				t.Fatal(err)
			}
			readModels(br)
		} else {
			if _, err := io.WriteString(conn, models); err != nil {
				t.Fatal(err)
			}
			readModels(br)
			if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", stream)); err != nil {
				t.Fatal(err)
			}
		}
		if resp := readStream(t, br); resp.Close {
			t.Fatalf("pipelined %v: Connection: close", pipelined)
		}
		if _, err := io.WriteString(conn, models); err != nil {
			t.Fatal(err)
		}
		readModels(br)
	}
}

// A stream that ends while the server drains closes its connection: the
// next request goes to a server that is not shutting down.
func TestStreamClosesItsConnectionWhenDraining(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 10, TokenDelay: 20 * time.Millisecond}, nil)
	conn, br := ta.dialRaw(t)
	if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	}
	drainDuringStream(t, ta, conn, br, nil)
}

// drainDuringStream reads the response to the stream just sent on conn
// up to its first event, calls started (if set), starts the drain, and
// fails unless the stream still ends whole and its connection is closed
// after it.
func drainDuringStream(t *testing.T, ta *testAPI, conn net.Conn, br *bufio.Reader, started func()) {
	t.Helper()
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := bufio.NewReader(resp.Body)
	if line, err := body.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first SSE line %q, %v", line, err)
	}
	if started != nil {
		started()
	}
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		drained <- ta.api.Drain(ctx)
	}()
	if evs := readSSE(t, body); evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream did not finish: %v", evs)
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a kept connection would wait for a request
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the stream: %d bytes, %v; want the connection closed", n, err)
	}
}

// serveAndDial serves srv on a loopback port until the test ends and
// returns a connection to it, closed at the end too.
func serveAndDial(t *testing.T, srv *fasthttp.Server) (net.Conn, *bufio.Reader) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, bufio.NewReader(conn)
}

// A connection handed back after its stream, waiting for its next
// request when the drain begins, is closed by the drain: the server's own
// shutdown would leave it open, with a goroutine reading it, for 5 s or,
// if it had returned already, until the idle timeout.
func TestDrainClosesAConnectionWaitingAfterItsStream(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 3}, nil)
	// A server of its own with an idle timeout beyond the test's reach.
	conn, br := serveAndDial(t, ta.api.Server(time.Minute, time.Hour))
	if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	}
	if resp := readStream(t, br); resp.Close {
		t.Fatal("Connection: close on a stream before the drain")
	}
	testutil.WaitFor(t, 10*time.Second, "the connection handed back", func() bool {
		ta.api.kept.mu.Lock()
		defer ta.api.kept.mu.Unlock()
		return len(ta.api.kept.conns) == 1
	})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := ta.api.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the drain: %d bytes, %v; want the connection closed", n, err)
	}
	if ta.api.kept.add(&keptConn{}) {
		t.Fatal("a connection was handed back after the drain began")
	}
}

// keepAlive hands back the connection under fasthttp's hijacked one, not
// the wrapper (which would grow by a layer per stream and whose buffer
// lives only as long as the hijack handler), with pipelined bytes read
// out of that buffer first. This pins what keepAlive reads of fasthttp's
// wrapper (readsFrom) to the fasthttp in go.mod. Without ReduceMemoryUsage
// fasthttp's wrapper reads through its buffer at every request, which
// readsFrom does not see through: the buffer is read out without waiting
// for the client (a wait there would hold the response until the client
// sent another request, which it does not before the response).
func TestKeepAliveUnwrapsTheHijackedConnection(t *testing.T) {
	for _, reduce := range []bool{true, false} {
		t.Run(fmt.Sprintf("ReduceMemoryUsage=%v", reduce), func(t *testing.T) { testKeepAliveUnwraps(t, reduce) })
	}
}

func testKeepAliveUnwraps(t *testing.T, reduceMemory bool) {
	var rf readerField // the field found at the first stream, then kept
	var mu sync.Mutex
	var seen []string
	srv := &fasthttp.Server{KeepHijackedConns: true, ReduceMemoryUsage: reduceMemory, IdleTimeout: time.Minute, ReadTimeout: time.Minute}
	srv.Handler = func(ctx *fasthttp.RequestCtx) {
		ctx.HijackSetNoResponse(true)
		ctx.Hijack(func(hc net.Conn) {
			next, err := keepAlive(&rf, hc, srv.IdleTimeout, srv.ReadTimeout)
			k, ok := next.(*keptConn)
			if err != nil || !ok {
				t.Errorf("keepAlive gave %T, %v", next, err)
				hc.Close()
				return
			}
			mu.Lock()
			seen = append(seen, fmt.Sprintf("%T", k.Conn))
			mu.Unlock()
			_, _ = io.WriteString(hc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			go func() { _ = srv.ServeConn(next) }()
		})
	}
	conn, br := serveAndDial(t, srv)
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	const get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n"
	exchange := func(req string, answers int) {
		t.Helper()
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		for range answers {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	exchange(get, 1)
	exchange(get, 1)
	exchange(get+get, 2) // the first of these two is hijacked with the second buffered
	exchange(get, 1)
	mu.Lock()
	defer mu.Unlock()
	want := []string{"*net.TCPConn", "*net.TCPConn", "*net.TCPConn", "*net.TCPConn", "*net.TCPConn"}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("connections handed back: %v, want %v", seen, want)
	}
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if rf.typ == nil || rf.idx < 0 {
		t.Fatalf("fasthttp's hijacked connection %v has no reader field r: keepAlive reads every stream's next request to find out", rf.typ)
	}
}

// deadlineConn records the read deadlines set on it.
type deadlineConn struct {
	net.Conn
	deadlines []time.Time
	data      string
}

func (d *deadlineConn) SetReadDeadline(t time.Time) error {
	d.deadlines = append(d.deadlines, t)
	return nil
}

func (d *deadlineConn) Read(p []byte) (int, error) {
	n := copy(p, d.data)
	d.data = d.data[n:]
	return n, nil
}

// A connection handed back waits for its next request as long as any
// keep-alive connection (the idle timeout), not the read timeout the
// server gives a new connection's first request; once the request
// arrives, the server's deadlines apply unchanged.
func TestKeptConnectionWaitsTheIdleTimeout(t *testing.T) {
	d := &deadlineConn{data: "GET"}
	kc, err := keepAlive(nil, d, time.Hour, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	k := kc.(*keptConn)
	readTimeout := time.Now().Add(time.Second)
	if err := k.SetReadDeadline(readTimeout); err != nil { // the server, before the first byte
		t.Fatal(err)
	}
	if _, err := k.Read(make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	if err := k.SetReadDeadline(readTimeout); err != nil { // the server, reading the request
		t.Fatal(err)
	}
	if len(d.deadlines) != 3 {
		t.Fatalf("deadlines %v", d.deadlines)
	}
	for i, dl := range d.deadlines[:2] {
		if time.Until(dl) < 59*time.Minute {
			t.Fatalf("deadline %d before the first byte: %v from now, want the idle hour", i, time.Until(dl))
		}
	}
	if !d.deadlines[2].Equal(readTimeout) {
		t.Fatalf("deadline once the request arrives: %v, want the server's %v", d.deadlines[2], readTimeout)
	}
	k.pending = []byte("rest")
	again, err := keepAlive(nil, k, time.Hour, 0)
	if err != nil || again.(*keptConn).Conn != d || string(again.(*keptConn).pending) != "rest" {
		t.Fatalf("a kept connection handed back again: %#v, %v; want it unwrapped, its bytes kept", again, err)
	}
}

// The completion ends even if fasthttp never starts the hijacked stream.
func TestStartWithin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var expired atomic.Int32
		start := startWithin(time.Minute, func() { expired.Add(1) })
		time.Sleep(time.Minute + time.Second)
		if n := expired.Load(); n != 1 {
			t.Fatalf("not started in time: expired %d times", n)
		}
		if start() {
			t.Fatal("start after the expiry")
		}
		start = startWithin(time.Minute, func() { expired.Add(1) })
		if !start() || start() {
			t.Fatal("start must be true once")
		}
		time.Sleep(2 * time.Minute)
		if expired.Load() != 1 {
			t.Fatal("expired after a start")
		}
	})
}

// counterValue is the value of counter name with the given labels.
func counterValue(t *testing.T, ta *testAPI, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := ta.api.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := want[l.GetName()]; ok && v != l.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// A stream is counted before its client sees it end: a client that reads
// the metrics once its stream is over finds it there.
func TestStreamCountedBeforeItsEnd(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 2}, nil)
	labels := map[string]string{"finish_reason": "length", "stream": "true"}
	for i := range 20 {
		resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := counterValue(t, ta, "hearth_chat_completions_total", labels); got != float64(i+1) {
			t.Fatalf("after stream %d ended: %v counted", i+1, got)
		}
	}
}

// failingConn is a connection whose SetDeadline fails once fail is set, as
// a connection closed in between would.
type failingConn struct {
	net.Conn
	fail *atomic.Bool
}

func (f failingConn) SetDeadline(t time.Time) error {
	if f.fail.Load() {
		return net.ErrClosed
	}
	return f.Conn.SetDeadline(t)
}

type failingListener struct {
	net.Listener
	fail *atomic.Bool
}

func (l failingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return failingConn{c, l.fail}, nil
}

// A stream on a connection kept after a stream whose hijack the server
// never starts (setting the connection up for it failed) still ends, and
// gives its slot back: the server's return tells, without a timer per
// request.
func TestKeptStreamEndsWhenItsHijackNeverStarts(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	rt := fake.New(fake.Config{Tokens: []string{"x"}, TokenCount: 3, Hold: hold,
		HoldIf: func(r *llm.Request) bool { return r.Messages[0].Content == "hold" }})
	keys := apikeys.NewStatic()
	secret, _ := keys.Add("test")
	api := NewAPI(APIConfig{Model: testModel, Version: "test", MaxConcurrent: 1, MaxQueue: 1, MaxBodyBytes: 64 << 10,
		WriteStallTimeout: time.Hour}, rt, keys, metrics.NewNode("test"), slog.New(slog.DiscardHandler))
	api.SetWarm(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	srv := api.Server(5*time.Second, 5*time.Second)
	go func() { _ = srv.Serve(failingListener{ln, &fail}) }()
	t.Cleanup(func() {
		api.Close()
		_ = srv.Shutdown()
	})
	root := "http://" + ln.Addr().String()
	ta := &testAPI{url: root + "/api/v1", root: root, secret: secret}
	conn, br := ta.dialRaw(t)
	stream := func(content string) string {
		return ta.rawPost("/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"`+content+`"}]}`)
	}
	if _, err := io.WriteString(conn, stream("hi")); err != nil {
		t.Fatal(err)
	}
	readStream(t, br) // the connection is kept now
	first := rt.LastStream()
	fail.Store(true)
	if _, err := io.WriteString(conn, stream("hold")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the held generation to start", func() bool {
		return rt.LastStream() != first
	})
	select {
	case <-rt.LastStream().Done():
	case <-time.After(10 * time.Second): // a bound for a broken build
		t.Fatal("the stream whose hijack never started still runs")
	}
	// Its slot is free again: the only one there is serves a new client.
	fail.Store(false)
	resp := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after the dropped stream: %d", resp.StatusCode)
	}
}
