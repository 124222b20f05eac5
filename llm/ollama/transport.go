package ollama

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"
)

// loopTransport is the HTTP/1.1 transport to a runtime on this host: pooled
// keep-alive connections, and each request written and its answer read in
// the caller's goroutine. net/http's Transport runs two goroutines per
// connection (a read loop and a write loop) and hands every answer across
// them; for thousands of long streams to one local runtime that is ~16 KiB
// of stacks and buffers per stream spent on nothing (BENCHMARKS.md). The
// request and answer framing itself is still net/http's (Request.Write,
// ReadResponse); only the connection handling is ours.
type loopTransport struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle int

	mu   sync.Mutex
	idle map[string][]*loopConn // by host:port, most recently used last
}

func newLoopTransport(maxIdle int) *loopTransport {
	d := &net.Dialer{
		// A loopback connect either succeeds at once or is refused;
		// waiting long only hides a runtime that is down.
		Timeout: 5 * time.Second,
		// The kernel resets loopback connections of a process that dies,
		// so keepalive probes would find nothing; skip their timers.
		KeepAlive: -1,
	}
	return &loopTransport{dial: d.DialContext, maxIdle: maxIdle, idle: map[string][]*loopConn{}}
}

// loopConn is one connection with its buffers.
type loopConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	host string
}

// RoundTrip sends req on a pooled connection (or a new one) and returns
// the answer with its headers read. The body is read from the connection
// as the caller reads it; read to the end, the connection goes back to the
// pool; closed before the end, the connection is closed, which is how a
// generation is stopped on the runtime.
func (t *loopTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		closeReqBody(req)
		return nil, fmt.Errorf("ollama transport: unsupported scheme %q", req.URL.Scheme)
	}
	host := req.URL.Host
	if req.URL.Port() == "" {
		host = net.JoinHostPort(req.URL.Hostname(), "80")
	}
	for try := 0; ; try++ {
		pc, reused, err := t.get(req.Context(), host)
		if err != nil {
			closeReqBody(req)
			return nil, err
		}
		resp, err := t.send(pc, req)
		if err == nil {
			return resp, nil
		}
		// A pooled connection the runtime closed while it was idle fails
		// before any answer: send again once on a new one, when the body
		// can be sent again.
		if !reused || try > 0 || req.Context().Err() != nil || !stale(err) {
			return nil, err
		}
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			r2 := *req
			r2.Body = body
			req = &r2
		} else if req.Body != nil && req.Body != http.NoBody {
			return nil, err
		}
	}
}

// stale reports an error of a connection that was closed by the peer
// before it answered anything.
func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// get takes an idle connection to host, or dials one.
func (t *loopTransport) get(ctx context.Context, host string) (pc *loopConn, reused bool, err error) {
	t.mu.Lock()
	if l := t.idle[host]; len(l) > 0 {
		pc = l[len(l)-1]
		l[len(l)-1] = nil
		t.idle[host] = l[:len(l)-1]
	}
	t.mu.Unlock()
	if pc != nil {
		return pc, true, nil
	}
	c, err := t.dial(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	// Answers are read through a small buffer: a token line is ~130 bytes,
	// and the stream above reads lines through a buffer of its own.
	// Requests are written once, so the write buffer is small too (a
	// larger body is written past it).
	return &loopConn{c: c, br: bufio.NewReaderSize(c, 2<<10), bw: bufio.NewWriterSize(c, 1<<10), host: host}, false, nil
}

// put returns a connection whose last answer was read to the end.
func (t *loopTransport) put(pc *loopConn) {
	t.mu.Lock()
	l := t.idle[pc.host]
	if len(l) < t.maxIdle {
		t.idle[pc.host] = append(l, pc)
		pc = nil
	}
	t.mu.Unlock()
	if pc != nil {
		pc.c.Close()
	}
}

// CloseIdleConnections closes the pooled connections (http.Client calls
// it).
func (t *loopTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*loopConn{}
	t.mu.Unlock()
	for _, l := range idle {
		for _, pc := range l {
			pc.c.Close()
		}
	}
}

// send writes req on pc and reads the answer's headers. On an error pc is
// closed.
func (t *loopTransport) send(pc *loopConn, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	// The caller's end closes the connection, which interrupts whatever it
	// is doing and tells the runtime to stop; no goroutine waits for it.
	stop := context.AfterFunc(ctx, func() { pc.c.Close() })
	fail := func(err error) (*http.Response, error) {
		stop()
		pc.c.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	if err := req.Write(pc.bw); err != nil {
		return fail(err)
	}
	if err := pc.bw.Flush(); err != nil {
		return fail(err)
	}
	resp, err := http.ReadResponse(pc.br, req)
	if err != nil {
		return fail(err)
	}
	resp.Body = &loopBody{rc: resp.Body, pc: pc, t: t, ctx: ctx, stop: stop, keep: !resp.Close && !req.Close}
	return resp, nil
}

// loopBody is an answer's body on its connection.
type loopBody struct {
	rc   io.ReadCloser
	pc   *loopConn
	t    *loopTransport
	ctx  context.Context
	stop func() bool
	keep bool // the connection may carry another request

	once sync.Once
}

func (b *loopBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	switch {
	case err == io.EOF:
		b.release(true)
	case err != nil:
		b.release(false)
		if b.ctx.Err() != nil {
			err = b.ctx.Err()
		}
	}
	return n, err
}

// Close before the end closes the connection: the runtime sees the request
// cancelled. (The framing body's own Close would read the rest of the
// answer first: the whole generation.)
func (b *loopBody) Close() error {
	b.release(false)
	return nil
}

// release hands the connection back (the body was read to its end) or
// closes it, once.
func (b *loopBody) release(done bool) {
	b.once.Do(func() {
		// stop is false once the caller's end has closed the
		// connection.
		if b.stop() && done && b.keep {
			b.t.put(b.pc)
			return
		}
		b.pc.c.Close()
	})
}
