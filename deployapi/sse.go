package deployapi

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

func setSSEHeaders(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
}

// streamSSE answers with the completion as server-sent events encoded by
// sink, on any connection (TLS or not, kept alive or not): the body is
// sseBody, which fasthttp pulls and writes as HTTP/1.1 chunks, one flushed
// chunk per Read. c.done is called once the stream has ended.
func (c *completion) streamSSE(ctx *fasthttp.RequestCtx, sink streamSink) {
	setSSEHeaders(ctx)
	if c.api.draining.Load() {
		ctx.SetConnectionClose()
	}
	b := newSSEBody(c, ctx.Conn(), sink)
	// The head goes out at once, with the opening if the format has one:
	// the client knows it was admitted before the first token.
	ctx.Response.ImmediateHeaderFlush = len(b.buf) == 0
	ctx.SetBodyStream(b, -1)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// sseBody is a streamed completion as the response body fasthttp pulls:
// the connection's own goroutine receives each event from the runtime,
// encodes it and writes it, with no pipe and no goroutine in between (as a
// reverse proxy's copy loop does). Each Read returns what is ready: it
// waits for one event, then takes every event the runtime already has
// (Buffered), so a burst of tokens costs one write and a lone token is
// written at once.
type sseBody struct {
	c    *completion
	conn net.Conn
	held *heldConn // conn's, nil if not served from Listener
	sink streamSink

	bp       *[]byte // pooled, held while buf has bytes to hand over
	buf      []byte  // *bp's contents; starts with the opening
	off      int     // buf[off:] is not read yet
	started  bool    // the first Read came
	finished bool    // the end is in buf
	closed   bool
	live     int       // choices not ended yet
	ev       llm.Event // the event fill handles

	deadline time.Time // the write deadline set last
	once     sync.Once
}

func newSSEBody(c *completion, conn net.Conn, sink streamSink) *sseBody {
	b := &sseBody{c: c, conn: conn, held: heldOf(conn), sink: sink, live: len(c.choices)}
	b.get()
	b.buf = sink.begin(b.buf)
	if len(b.buf) == 0 {
		b.put()
	}
	b.deadline = time.Now().Add(c.api.cfg.WriteStallTimeout)
	_ = conn.SetWriteDeadline(b.deadline)
	return b
}

// Read hands fasthttp the next part of the stream. The pooled buffer is
// held only while it has bytes to hand over: between tokens a stream holds
// none (thousands of streams wait on their runtime most of the time). A
// panic on the way fails this stream only (recover.go): fasthttp then
// closes the connection without more of the answer.
func (b *sseBody) Read(p []byte) (n int, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = recovered(v)
			b.c.api.logPanic(err)
		}
	}()
	first := !b.started
	b.started = true
	if b.off == len(b.buf) || first && !b.finished && b.c.stream.Buffered() {
		// The first Read takes the events already in with the opening:
		// the head, the opening and the first tokens go out as one write.
		if b.off == len(b.buf) && (b.finished || b.closed) {
			return 0, io.EOF
		}
		now := b.fill()
		// The write-stall timeout: a client that stops reading must not
		// pin a generation slot forever. The deadline is the connection's
		// own (one timer), moved once a quarter of it has passed.
		if stall := b.c.api.cfg.WriteStallTimeout; b.deadline.Sub(now) < stall*3/4 {
			b.deadline = now.Add(stall)
			_ = b.conn.SetWriteDeadline(b.deadline)
		}
	}
	n = copy(p, b.buf[b.off:])
	b.off += n
	if b.off == len(b.buf) {
		b.put()
		if b.finished && b.held != nil {
			b.held.hold() // this chunk goes out with the body's end (Close)
		}
	}
	return n, nil
}

// get takes a pooled buffer for the next part, put returns it.
func (b *sseBody) get() {
	if b.bp == nil {
		b.bp = b.c.api.bufs.Get().(*[]byte)
		b.buf, b.off = (*b.bp)[:0], 0
	}
}

func (b *sseBody) put() {
	if b.bp != nil {
		*b.bp = b.buf[:0]
		b.c.api.bufs.Put(b.bp)
		b.bp, b.buf, b.off = nil, nil, 0
	}
}

// maxBurst bounds the bytes one Read gathers from events the runtime
// already has.
const maxBurst = 32 << 10

// fill appends the next burst of events to buf and returns the time the
// last one arrived.
func (b *sseBody) fill() time.Time {
	c := b.c
	b.get()
	for {
		// Into b.ev: a local would move to the heap (the sinks take its
		// address through an interface), one allocation per token.
		var i int
		var err error
		i, b.ev, err = c.stream.Recv()
		ev := &b.ev
		now := time.Now() // one clock read per event, for metrics and the write deadline
		if isEOF(err) {
			b.finish()
			return now
		}
		if err != nil {
			// The response has started: report the failure in the stream's
			// own format, then end it cleanly.
			if !c.api.logPanic(err) && c.gctx.Err() == nil {
				c.api.log.Warn("generation failed mid-stream", "err", err)
			}
			b.buf = b.sink.fail(b.buf, openai.RuntimeError(err))
			b.finish()
			return now
		}
		c.seen(i, ev, now)
		b.buf = b.sink.event(b.buf, c, i, ev)
		if ev.Done {
			c.end(i, *ev)
			b.buf = b.sink.choiceEnd(b.buf, c, i)
			if b.live--; b.live == 0 {
				b.buf = b.sink.finish(b.buf, c)
				b.finish()
				return now
			}
		}
		if len(b.buf) > b.off && (!c.stream.Buffered() || len(b.buf)-b.off >= maxBurst) {
			return now
		}
	}
}

// finish notes that the end of the stream is in buf, and ends the
// completion: it is counted before the client can see its end, so a client
// that then reads the metrics or its usage finds it there.
func (b *sseBody) finish() {
	b.finished = true
	b.end()
}

// Close ends the completion: fasthttp calls it once the body is written,
// when writing it failed (the client is gone: closing the stream stops the
// generation), and when it resets a response it never wrote.
func (b *sseBody) Close() error {
	b.end()
	if b.held != nil {
		b.held.release()
	}
	_ = b.conn.SetWriteDeadline(time.Time{})
	b.put()
	return nil
}

// end ends the completion once: the generation stops if it runs yet, and
// it is counted (metrics, the key's usage) and its slot freed.
func (b *sseBody) end() {
	b.once.Do(func() {
		b.closed = true
		b.c.stream.Close()
		b.c.done()
	})
}

// Listener returns ln, the deployment API's listener (TLS or not), with
// each connection able to hold a stream's last bytes back (heldConn): the
// server must serve from it.
func Listener(ln net.Listener) net.Listener { return heldListener{ln} }

type heldListener struct{ net.Listener }

func (l heldListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	h := &heldConn{Conn: c}
	if tc, ok := c.(*tls.Conn); ok {
		return heldTLSConn{h, tc}, nil
	}
	return h, nil
}

// heldConn sends a stream's last chunk and the end of its chunked body in
// one write. fasthttp flushes each chunk on its own, and a client that
// stops reading at the stream's last event ([DONE]: the Go SDK) keeps its
// connection only if it read the end of the body with it (Go's client
// reuses a connection whose body was read to the end); over TLS each write
// is a record, read on its own. So from the stream's last Read (hold) to
// its Close (release), writes are held and then sent as one. Only the
// connection's own goroutine writes, holds and releases.
type heldConn struct {
	net.Conn
	holding bool
	held    []byte
}

func (c *heldConn) Write(p []byte) (int, error) {
	if c.holding {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

func (c *heldConn) hold() { c.holding = true }

func (c *heldConn) release() {
	c.holding = false
	if len(c.held) > 0 {
		_, _ = c.Conn.Write(c.held) // a failure is the next write's too
		c.held = nil
	}
}

// NetConn lets the peer watch reach the socket.
func (c *heldConn) NetConn() net.Conn { return c.Conn }

// heldTLSConn is a held TLS connection: fasthttp knows a TLS connection by
// these methods (RequestCtx.IsTLS).
type heldTLSConn struct {
	*heldConn
	tc *tls.Conn
}

func (c heldTLSConn) Handshake() error                     { return c.tc.Handshake() }
func (c heldTLSConn) ConnectionState() tls.ConnectionState { return c.tc.ConnectionState() }

// heldOf is c's heldConn, nil for a connection not from Listener.
func heldOf(c net.Conn) *heldConn {
	switch h := c.(type) {
	case *heldConn:
		return h
	case heldTLSConn:
		return h.heldConn
	}
	return nil
}
