package ollama

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// connCounter counts the connections a test server accepts.
func connCounter(srv *httptest.Server) *atomic.Int64 {
	var n atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			n.Add(1)
		}
	}
	return &n
}

// pipeRuntime makes lt dial in-memory connections (net.Pipe, on which a
// synctest bubble can wait, where it cannot on a socket), each served by
// serve in a goroutine of its own. It returns the count of connections
// dialled.
func pipeRuntime(lt *loopTransport, serve func(net.Conn)) *atomic.Int64 {
	var n atomic.Int64
	lt.dial = func(context.Context, string, string) (net.Conn, error) {
		n.Add(1)
		c, srv := net.Pipe()
		go func() {
			defer srv.Close()
			serve(srv)
		}()
		return c, nil
	}
	return &n
}

// The answer to a HEAD request has no body, whatever its Content-Length
// says (Ollama's HEAD / says 17): reading it ends at once, and the
// connection carries the next request.
func TestLoopTransportReadsNoBodyAfterHEAD(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lt := newLoopTransport(4)
		dials := pipeRuntime(lt, func(c net.Conn) {
			br := bufio.NewReader(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				head := "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 17\r\n\r\n"
				if req.Method != http.MethodHead {
					head += "Ollama is running"
				}
				if _, err := io.WriteString(c, head); err != nil {
					return
				}
			}
		})
		hc := &http.Client{Transport: lt}
		defer hc.CloseIdleConnections()
		for _, method := range []string{http.MethodHead, http.MethodGet, http.MethodHead} {
			req, _ := http.NewRequest(method, "http://127.0.0.1:11434/", nil)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("%s: %v", method, err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := "Ollama is running"
			if method == http.MethodHead {
				want = ""
			}
			if err != nil || string(b) != want {
				t.Fatalf("%s: body %q, %v; want %q", method, b, err, want)
			}
		}
		if n := dials.Load(); n != 1 {
			t.Fatalf("3 requests took %d connections, want 1", n)
		}
	})
}

func TestLoopTransportReusesAConnectionReadToTheEnd(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		for i := 0; i < 3; i++ {
			io.WriteString(w, string(b)+"\n")
			w.(http.Flusher).Flush() // chunked, as a streamed answer is
		}
	}))
	conns := connCounter(srv)
	srv.Start()
	defer srv.Close()
	hc := &http.Client{Transport: newLoopTransport(4)}
	defer hc.CloseIdleConnections()
	for i := 0; i < 5; i++ {
		resp, err := hc.Post(srv.URL+"/api/chat", "application/json", strings.NewReader("line"))
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "line\nline\nline\n" {
			t.Fatalf("request %d: %q, %v", i, b, err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("5 requests read to the end took %d connections, want 1", n)
	}
}

func TestLoopTransportCloseStopsTheRequestOnTheServer(t *testing.T) {
	cancelled := make(chan struct{})
	var once sync.Once // the second request is stopped the same way
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // a generation that goes on until stopped
		once.Do(func() { close(cancelled) })
	}))
	conns := connCounter(srv)
	srv.Start()
	defer srv.Close()
	hc := &http.Client{Transport: newLoopTransport(4)}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "first\n" {
		t.Fatalf("first line %q, %v", buf, err)
	}
	resp.Body.Close() // before the end
	<-cancelled       // the server saw the connection go
	// The closed connection is not reused.
	resp, err = hc.Get(srv.URL + "/again")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the stopped one is not reused)", n)
	}
}

func TestLoopTransportCancelEndsABlockedRead(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer srv.Close()
	hc := &http.Client{Transport: newLoopTransport(4)}
	defer hc.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	var readErr error
	go func() {
		defer wg.Done()
		_, readErr = resp.Body.Read(buf) // blocks: the server sends nothing more
	}()
	cancel()
	wg.Wait()
	if !errors.Is(readErr, context.Canceled) {
		t.Fatalf("read after cancel: %v, want context.Canceled", readErr)
	}
}

func TestLoopTransportSendsAgainOnAConnectionClosedWhileIdle(t *testing.T) {
	var mu sync.Mutex
	var conns []net.Conn
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Write(b)
	}))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	hc := &http.Client{Transport: newLoopTransport(4)}
	defer hc.CloseIdleConnections()
	post := func() (string, error) {
		resp, err := hc.Post(srv.URL, "application/json", strings.NewReader("body"))
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if got, err := post(); err != nil || got != "body" {
		t.Fatalf("first: %q, %v", got, err)
	}
	// The runtime restarts: its end of the pooled connection goes.
	mu.Lock()
	conns[0].Close()
	mu.Unlock()
	if got, err := post(); err != nil || got != "body" {
		t.Fatalf("after the idle connection closed: %q, %v (want the request sent again on a new one)", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 2 {
		t.Fatalf("%d connections, want 2", len(conns))
	}
}

func TestLoopTransportIdlePoolIsBounded(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	tr := newLoopTransport(2)
	hc := &http.Client{Transport: tr}
	defer hc.CloseIdleConnections()
	// Five requests in flight at once, then all read to the end.
	var resps []*http.Response
	for i := 0; i < 5; i++ {
		resp, err := hc.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resps = append(resps, resp)
	}
	for _, resp := range resps {
		io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	tr.mu.Lock()
	n := 0
	for _, l := range tr.idle {
		n += len(l)
	}
	tr.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d idle connections kept, want the cap of 2", n)
	}
}
