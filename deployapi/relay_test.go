package deployapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"

	"github.com/hearthd/hearth/llm/fake"
)

// dialRaw dials the test API and returns the connection with a reader.
func (ta *testAPI) dialRaw(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := ta.dial()
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

// A stream's connection then serves the client's next requests, streamed
// or not, as keep-alive.
func TestStreamKeepsTheConnection(t *testing.T) { overBoth(t, testStreamKeepsTheConnection) }

func testStreamKeepsTheConnection(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a", "b"}, TokenCount: 5}, nil)
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
func TestPipelinedRequestsAfterAStream(t *testing.T) { overBoth(t, testPipelinedRequestsAfterAStream) }

func testPipelinedRequestsAfterAStream(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a"}, TokenCount: 3}, nil)
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
// before it, pipelined or not) is the same stream.
func TestStreamAfterAResponseOnItsConnection(t *testing.T) {
	overBoth(t, testStreamAfterAResponseOnItsConnection)
}

func testStreamAfterAResponseOnItsConnection(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a"}, TokenCount: 3}, nil)
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
	overBoth(t, testStreamClosesItsConnectionWhenDraining)
}

func testStreamClosesItsConnectionWhenDraining(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 10, TokenDelay: 20 * time.Millisecond}, nil)
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

// A connection waiting for its next request after a stream when the API
// shuts down is closed at once: the shutdown waits for nothing idle.
func TestShutdownClosesAConnectionWaitingAfterItsStream(t *testing.T) {
	overBoth(t, testShutdownClosesAConnectionWaitingAfterItsStream)
}

func testShutdownClosesAConnectionWaitingAfterItsStream(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 3}, nil)
	// A server of its own with an idle timeout beyond the test's reach.
	srv := ta.api.Server(time.Minute, time.Hour)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	own := *ta
	own.root = strings.Replace(ta.root, ta.addr(), ln.Addr().String(), 1)
	var sl net.Listener = ln
	if overTLS {
		sl = tls.NewListener(ln, ta.serverTLS)
	}
	go func() { _ = srv.Serve(Listener(sl)) }()
	conn, br := own.dialRaw(t)
	if _, err := io.WriteString(conn, ta.rawPost("/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`)); err != nil {
		t.Fatal(err)
	}
	if resp := readStream(t, br); resp.Close {
		t.Fatal("Connection: close on a stream before the shutdown")
	}
	start := time.Now()
	ta.api.Shutdown(srv, 10*time.Second)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the shutdown: %d bytes, %v; want the connection closed", n, err)
	}
	// The drain's bound is 10 s; an idle connection must not wait for it.
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the shutdown took %v with only an idle connection open", took)
	}
}

// After a stream its connection waits for the next request as long as any
// keep-alive connection (the idle timeout), not the read timeout of a
// request's first byte.
func TestAfterAStreamTheIdleTimeoutApplies(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 3}, nil)
	srv := ta.api.Server(300*time.Millisecond, time.Hour)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(Listener(ln)) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	own := *ta
	own.root = "http://" + ln.Addr().String()
	conn, br := own.dialRaw(t)
	stream := ta.rawPost("/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	if _, err := io.WriteString(conn, stream); err != nil {
		t.Fatal(err)
	}
	readStream(t, br)
	time.Sleep(time.Second) // over three read timeouts, far under the idle one
	if _, err := io.WriteString(conn, stream); err != nil {
		t.Fatal(err)
	}
	readStream(t, br)
}

// counterValue is the value of counter name with the given labels.
func counterValue(t *testing.T, ta *testAPI, name string, want map[string]string) float64 {
	t.Helper()
	return findMetric(t, ta, name, want).GetCounter().GetValue()
}

// findMetric is the first series of the family name with the labels in
// want (nil if there is none).
func findMetric(t *testing.T, ta *testAPI, name string, want map[string]string) *dto.Metric {
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
			return m
		}
	}
	return nil
}

// A stream is counted before its client sees it end: a client that reads
// the metrics once its stream is over finds it there.
func TestStreamCountedBeforeItsEnd(t *testing.T) { overBoth(t, testStreamCountedBeforeItsEnd) }

func testStreamCountedBeforeItsEnd(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a"}, TokenCount: 2}, nil)
	labels := map[string]string{"finish_reason": "length", "stream": "true"}
	for i := range 20 {
		resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`, nil)
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := counterValue(t, ta, "hearth_generations_total", labels); got != float64(i+1) {
			t.Fatalf("after stream %d ended: %v counted", i+1, got)
		}
	}
}

// The official Go SDK stops reading a stream at [DONE] and closes it; it
// keeps the connection for the next request only if the end of the body
// came with that event. Ten streams one after another: one connection.
func TestSDKKeepsItsConnectionAfterAStream(t *testing.T) {
	overBoth(t, testSDKKeepsItsConnectionAfterAStream)
}

func testSDKKeepsItsConnectionAfterAStream(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a", "b"}, TokenCount: 6}, nil)
	rec := newConnRecorder(nil)
	rec.base.TLSClientConfig = ta.tlsConf
	defer rec.base.CloseIdleConnections()
	c := openai.NewClient(option.WithBaseURL(ta.url), option.WithAPIKey(ta.secret),
		option.WithHTTPClient(&http.Client{Transport: rec}), option.WithMaxRetries(0))
	for i := range 10 {
		s := c.Chat.Completions.NewStreaming(t.Context(), chatParams())
		n := 0
		for s.Next() {
			n++
		}
		if err := s.Err(); err != nil || n == 0 {
			t.Fatalf("stream %d: %d chunks, %v", i, n, err)
		}
		if got := rec.last(t); got.reused != (i > 0) {
			t.Fatalf("stream %d: connection reused %v", i, got.reused)
		}
	}
}
