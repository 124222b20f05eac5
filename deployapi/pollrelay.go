package deployapi

import (
	"net"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/cacheline"
	"github.com/hearthd/hearth/internal/evloop"
	"github.com/hearthd/hearth/llm"
)

// A stream whose runtime connection the event loop watches (llm.Pollable)
// is relayed from the loop's goroutine: when the runtime's bytes arrive, the
// loop reads them, encodes the events and writes them to the client's
// socket, and goes back to waiting; no goroutine waits on the stream. Per
// token that is a read and a write, as nginx does it, where a goroutine
// relay also pays a read that finds the socket empty and a park and
// wake-up through the scheduler (BENCHMARKS.md, issue 15).
//
// The client's socket stays the server's (it is served again after the
// stream): the loop writes to its descriptor directly, and watches it only
// while a write waits for room. Everything else is as in relayRest: a burst
// of events is one chunk and one write, the completion is counted before
// its end is written, a write that makes no progress for WriteStallTimeout
// ends the stream, and the connection goes back to the server after it.
// The client's close is noticed by the peer watch, as for any stream.

// pollable reports whether the chat request's stream can be relayed from
// the event loop: the runtime is asked for a polled stream then
// (llm.Request.Polled).
func (a *API) pollable(ctx *fasthttp.RequestCtx, n int) bool {
	return a.cfg.Loop != nil && n == 1 && !ctx.IsTLS() && a.hijackable(ctx)
}

// pollRelay is one stream relayed from the loop.
type pollRelay struct {
	a    *API
	b    *sseBody
	p    llm.Pollable
	srv  *fasthttp.Server
	conn net.Conn // the client's connection, whose descriptor is fd
	fd   int
	next net.Conn // handed back to the server after the stream; nil: closed

	// Only on the loop's goroutine from start on:
	started  bool
	over     bool
	pending  []byte    // of the last burst, not written yet
	progress time.Time // of the last write while one waits for room
	wid      uint64    // the client's socket watched for room, 0 if not
	stall    *time.Timer
}

// startPollRelay relays b from the event loop if it can and reports
// whether it does; the hijack handler hc's function then returns at once.
func (a *API) startPollRelay(hc net.Conn, b *sseBody, srv *fasthttp.Server) bool {
	sg, ok := b.c.stream.(*single)
	if !ok {
		return false
	}
	p, ok := sg.s.(llm.Pollable)
	if !ok {
		return false
	}
	conn := hc
	if u, ok := hc.(interface{ UnsafeConn() net.Conn }); ok {
		conn = u.UnsafeConn()
	}
	var fd int
	if k, isKept := conn.(*keptConn); isKept {
		conn = k.Conn
		fd, ok = k.socket()
	} else {
		fd, ok = evloop.SocketFD(conn)
	}
	if !ok {
		return false
	}
	r := &pollRelay{a: a, b: b, p: p, srv: srv, conn: conn, fd: fd}
	if !p.Poll(r.ready, r.cacheLines()...) {
		return false
	}
	// What fasthttp's hijacked connection buffered must be read while it
	// lives: before this function returns. The loop ignores the stream
	// until start runs in its goroutine (ready before that is a no-op: start
	// reads what came meanwhile).
	if next, err := keepAlive(&a.readerField, hc, srv.IdleTimeout, srv.ReadTimeout); err == nil {
		r.next = next
	}
	if !a.cfg.Loop.Post(r.start) {
		// The loop is closed (shutdown): end the stream here.
		p.Unpoll()
		b.Close()
		conn.Close()
		return true
	}
	a.polled.Add(1)
	return true
}

// cacheLines are the objects ready reads at every token, for the loop to
// load before it calls ready (evloop.Loop.SetHot); the runtime's stream adds
// its own.
func (r *pollRelay) cacheLines() []unsafe.Pointer {
	hot := make([]unsafe.Pointer, 0, 64)
	hot = cacheline.Of(hot, r)
	hot = cacheline.Of(hot, r.b)
	hot = cacheline.Of(hot, r.b.c)
	if sg, ok := r.b.c.stream.(*single); ok {
		hot = cacheline.Of(hot, sg)
	}
	if k, ok := r.b.sink.(*chatSink); ok {
		hot = k.cacheLines(hot)
	}
	return hot
}

func (r *pollRelay) start() {
	r.started = true
	r.ready()
}

// ready runs on the loop's goroutine when the runtime may have sent more or
// the client's socket has room again.
func (r *pollRelay) ready() {
	if !r.started || r.over {
		return
	}
	defer func() {
		if v := recover(); v != nil { // recover.go
			r.a.logPanic(recovered(v))
			r.stop(false)
		}
	}()
	b := r.b
	if len(r.pending) > 0 && !r.flush() {
		return
	}
	for !b.finished {
		switch r.p.Ready() {
		case llm.PollWait:
			return
		case llm.PollBlock:
			r.toGoroutine()
			return
		}
		b.fillPolled()
		if len(b.buf) > b.room || b.finished {
			r.pending = b.frame()
			if b.finished {
				// Counted before the client can see the end, as in
				// relayRest.
				b.end()
			}
			if !r.flush() {
				return
			}
		}
	}
	r.stop(true)
}

// flush writes the pending burst and reports whether it is all written.
// With no room it waits for the loop's word; a failed write (the client
// is gone) ends the stream.
func (r *pollRelay) flush() bool {
	for len(r.pending) > 0 {
		n, err := evloop.Write(r.fd, r.pending)
		switch {
		case n > 0:
			r.pending = r.pending[n:]
			r.progress = time.Now()
		case err == unix.EINTR:
		case err == unix.EAGAIN:
			r.waitRoom()
			return false
		default:
			r.stop(false)
			return false
		}
	}
	r.b.put()
	return true
}

// waitRoom has the loop call ready when the client's socket has room, and
// bounds the wait by WriteStallTimeout.
func (r *pollRelay) waitRoom() {
	if r.wid == 0 {
		id, err := r.a.cfg.Loop.Watch(r.fd, unix.EPOLLOUT|unix.EPOLLRDHUP, func(uint32) { r.ready() })
		if err != nil {
			r.a.log.Warn("stream: watch the client's socket", "err", err)
			r.stop(false)
			return
		}
		r.wid = id
	}
	if r.stall == nil {
		r.progress = time.Now()
		r.stall = time.AfterFunc(r.a.cfg.WriteStallTimeout, func() { r.a.cfg.Loop.Post(r.checkStall) })
	}
}

// checkStall ends the stream if its writes made no progress for
// WriteStallTimeout.
func (r *pollRelay) checkStall() {
	if r.over || len(r.pending) == 0 {
		r.stall = nil
		return
	}
	stall := r.a.cfg.WriteStallTimeout
	if wait := stall - time.Since(r.progress); wait > 0 {
		r.stall.Reset(wait)
		return
	}
	r.a.log.Debug("stream: client stopped reading", "stalled", stall)
	r.stop(false)
}

// toGoroutine relays the rest from a goroutine (relayRest): the stream can
// only go on by waiting in Recv (a line longer than the read buffer).
func (r *pollRelay) toGoroutine() {
	r.over = true
	r.unwatch()
	r.p.Unpoll()
	r.b.deadline = time.Now().Add(r.a.cfg.WriteStallTimeout)
	go func() {
		ok := r.b.relayRest(r.conn)
		r.b.Close()
		r.a.handBack(r.conn, r.next, ok)
	}()
}

func (r *pollRelay) unwatch() {
	if r.wid != 0 {
		r.a.cfg.Loop.Unwatch(r.fd, r.wid)
		r.wid = 0
	}
	if r.stall != nil {
		r.stall.Stop()
		r.stall = nil
	}
}

// stop ends the relay: the completion ends (if the stream has not), and
// the connection goes back to the server if the whole response was
// written, or is closed.
func (r *pollRelay) stop(ok bool) {
	if r.over {
		return
	}
	r.over = true
	r.unwatch()
	r.b.Close()
	r.a.handBack(r.conn, r.next, ok)
	// The goroutine that serves the connection's next request starts now,
	// not after the rest of the loop's events.
	r.a.cfg.Loop.Yield()
}

// handBack hands the connection of a stream that ended back to the server
// (next, from keepAlive), or closes it (conn) if the stream did not end
// well, was not to be kept (next nil), or the drain began.
func (a *API) handBack(conn, next net.Conn, ok bool) {
	if !ok || next == nil || a.draining.Load() {
		conn.Close()
		return
	}
	a.serveKept(a.srv.Load(), next)
}

// serveKept serves next, a connection kept after a stream, again.
func (a *API) serveKept(srv *fasthttp.Server, next net.Conn) {
	k := kept(next)
	if !a.kept.add(k) {
		next.Close() // the drain began meanwhile
		return
	}
	// Another goroutine (of the pool), so that fasthttp releases this
	// request's context now rather than when the connection closes.
	a.serving.Go(func() {
		k.served(srv.ServeConn(next))
		a.kept.remove(k)
	})
}
