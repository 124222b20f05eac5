package deployapi

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/llm"
)

// A stream is written on the client's connection itself, in a goroutine
// that holds only what a stream needs: fasthttp, answering with a body it
// pulls, holds a 4 KiB copy buffer and its write buffer for the whole
// response (minutes), which at thousands of streams was most of what
// hearthd held beyond nginx (BENCHMARKS.md). The handler hijacks the
// connection (fasthttp writes nothing), the stream writes the head and the
// chunked body as the runtime produces it, and then hands the keep-alive
// connection back to the server (ServeConn), so a client reuses it as
// before. HTTP/1.0 and Connection: close requests keep the pulled body.

// hijackable reports whether the response to ctx can be written on the
// connection directly.
func (a *API) hijackable(ctx *fasthttp.RequestCtx) bool {
	return a.srv.Load() != nil && ctx.Request.Header.IsHTTP11() &&
		!ctx.Request.Header.ConnectionClose() && !ctx.Response.Header.ConnectionClose()
}

// hijackStream answers ctx with b written on the connection (hijackable).
func (a *API) hijackStream(ctx *fasthttp.RequestCtx, b *sseBody) {
	srv := a.srv.Load()
	ctx.Response.Header.SetContentLength(-1) // Transfer-Encoding: chunked
	if a.draining.Load() {
		ctx.Response.Header.SetConnectionClose()
	}
	// The head and the first events are written from here, without waiting
	// for the handler to return and the hijack's goroutine to start (which
	// under load waits its turn to run), when nothing of an earlier response
	// can still sit in fasthttp's write buffer: on the connection's first
	// request, which after a stream is every request (ServeConn below starts
	// the connection afresh). fasthttp names itself in a header only after
	// the handler, so the head does it here.
	early := ctx.ConnRequestNum() == 1
	headOK := false
	if early {
		if len(ctx.Response.Header.Server()) == 0 {
			ctx.Response.Header.SetServer(srv.Name)
		}
		headOK = a.writeHeadSafe(b, ctx.Conn(), ctx.Response.Header.Header())
	}
	// fasthttp starts the hijack handler once this handler returns; should
	// it not (the connection failed in between), the completion must still
	// end, or its slot would stay taken. On a connection kept after a
	// stream, which after the first stream is every request's, serveKept
	// sees that when the server returns it; elsewhere a timer does.
	k := keptOf(ctx.Conn())
	var start func() bool
	if k != nil {
		k.hijackAsked(b)
	} else {
		start = startWithin(a.cfg.WriteStallTimeout, func() { b.Close() })
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(hc net.Conn) {
		if k != nil && !k.hijackStarts() || k == nil && !start() {
			hc.Close()
			return
		}
		defer func() {
			if v := recover(); v != nil { // recover.go
				a.logPanic(recovered(v))
				hc.Close()
				b.Close()
			}
		}()
		// ctx stays valid until this function returns.
		keep := !ctx.Response.Header.ConnectionClose()
		ok := headOK
		if !early {
			ok = b.writeHead(hc, ctx.Response.Header.Header())
		}
		// From the event loop (pollrelay.go) where the stream allows it,
		// and the connection is to be kept (a closing one is rare and
		// takes the path below).
		if ok && b.finished {
			a.whole.Add(1)
		}
		if ok && !b.finished && keep && !a.draining.Load() && a.startPollRelay(hc, b, srv) {
			return
		}
		ok = ok && b.relayRest(hc)
		b.Close() // the completion ends, and the peer watch with it
		if !ok || !keep || a.draining.Load() {
			hc.Close()
			return
		}
		next, err := keepAlive(&a.readerField, hc, srv.IdleTimeout, srv.ReadTimeout)
		if err != nil {
			hc.Close()
			return
		}
		a.serveKept(srv, next)
	})
}

// startWithin returns start, which reports whether its caller may begin:
// true at its first call, unless d passed before it, in which case expire
// has run instead.
func startWithin(d time.Duration, expire func()) (start func() bool) {
	var started atomic.Bool
	t := time.AfterFunc(d, func() {
		if started.CompareAndSwap(false, true) {
			expire()
		}
	})
	return func() bool {
		if !started.CompareAndSwap(false, true) {
			return false
		}
		t.Stop()
		return true
	}
}

// writeHeadSafe is writeHead in the handler: a panic fails this stream
// (recover.go), which the hijack then closes, as one in the hijack's own
// goroutine would.
func (a *API) writeHeadSafe(b *sseBody, conn net.Conn, head []byte) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			a.logPanic(recovered(v))
			ok = false
		}
	}()
	return b.writeHead(conn, head)
}

// writeHead writes the response head on conn with the opening and the
// events the runtime has sent already, and reports whether it could;
// relayRest then writes the rest of the stream.
func (b *sseBody) writeHead(conn net.Conn, head []byte) bool {
	b.deadline = time.Now().Add(b.c.api.cfg.WriteStallTimeout)
	if conn.SetWriteDeadline(b.deadline) != nil {
		return false
	}
	// The head goes out at once, with the opening if the format has one
	// and the first events if they are in already (a generation starts
	// once the runtime's first line is): one write, not two.
	first := append(make([]byte, 0, len(head)+512), head...)
	if b.c.stream.Buffered() {
		b.fill()
	}
	if len(b.buf) > b.room || b.finished {
		first = append(first, b.frame()...)
		if b.finished {
			b.end()
		}
	}
	b.put()
	_, err := conn.Write(first)
	return err == nil
}

// relayRest writes the stream after its head (writeHead) as HTTP/1.1
// chunks, one write per burst of events, on conn, and reports whether it
// wrote the whole response.
func (b *sseBody) relayRest(conn net.Conn) bool {
	stall := b.c.api.cfg.WriteStallTimeout
	// Set again: fasthttp clears the connection's deadlines before the
	// hijack when the head was written from the handler.
	if conn.SetWriteDeadline(b.deadline) != nil {
		return false
	}
	for !b.finished {
		b.put()
		if w, ok := b.c.stream.(llm.Waiter); ok {
			w.Wait()
		}
		now := b.fill()
		if b.deadline.Sub(now) < stall*3/4 { // as in Read
			b.deadline = now.Add(stall)
			_ = conn.SetWriteDeadline(b.deadline)
		}
		if len(b.buf) > b.room || b.finished {
			out := b.frame()
			if b.finished {
				// Counted before the client can see the end: a client that
				// then reads the metrics or its usage finds it there.
				b.end()
			}
			if _, err := conn.Write(out); err != nil {
				b.put()
				return false
			}
		}
	}
	b.put()
	_ = conn.SetWriteDeadline(time.Time{})
	return true
}

// chunkRoom is the room kept before a burst's bytes for its chunk-size
// line: up to 8 hex digits and CRLF (a burst is far below 4 GiB).
const chunkRoom = 10

// frame makes buf[room:] one HTTP/1.1 chunk in place, followed by the
// last chunk once the stream has finished, and returns the bytes to write.
func (b *sseBody) frame() []byte {
	n := len(b.buf) - b.room
	if n == 0 {
		b.buf = append(b.buf, "0\r\n\r\n"...)
		return b.buf[b.room:]
	}
	var size [8]byte
	hex := strconv.AppendUint(size[:0], uint64(n), 16)
	start := b.room - len(hex) - 2
	copy(b.buf[start:], hex)
	b.buf[b.room-2], b.buf[b.room-1] = '\r', '\n'
	b.buf = append(b.buf, '\r', '\n')
	if b.finished {
		b.buf = append(b.buf, "0\r\n\r\n"...)
	}
	return b.buf[start:]
}

// keepAlive is the connection to hand back to the server after a stream
// written on hc, fasthttp's hijacked connection, or an error if reading
// what the client sent meanwhile failed.
//
// fasthttp's hijacked connection reads through the request's read buffer
// when that still holds bytes (the client pipelined its next request) and
// from the connection otherwise, and its buffer lives only as long as the
// hijack handler. Handing the wrapper back would also wrap it again at the
// next stream, one layer per request on a long-lived connection. So the
// connection itself is handed back, with any bytes the buffer held read
// out first. fasthttp does not say which case it is, so its wrapper's
// reader is looked at with reflect (readsFrom); where that does not find
// the connection itself (a buffer, or a fasthttp that names the field
// otherwise), the buffer is read out with the connection's read deadline
// already past (buffered), which returns the buffered bytes and never waits
// for the client: the stream relayed from the loop calls keepAlive before
// its first token, and a wait there for the client's next request would
// hold the stream until the idle timeout.
func keepAlive(rf *readerField, hc net.Conn, idle, read time.Duration) (net.Conn, error) {
	if idle <= 0 {
		idle = read
	}
	c := hc
	if u, ok := hc.(interface{ UnsafeConn() net.Conn }); ok {
		c = u.UnsafeConn()
	}
	var pending []byte
	if c != hc && !rf.readsFrom(hc, c) {
		var err error
		if pending, err = buffered(hc, c); err != nil {
			return nil, err
		}
		if idle <= 0 {
			_ = c.SetReadDeadline(time.Time{})
		}
	}
	if idle > 0 {
		_ = c.SetReadDeadline(time.Now().Add(idle))
	}
	// A connection kept before is unwrapped: one layer at most.
	var (
		rc syscall.RawConn
		fd int
	)
	switch k := c.(type) {
	case *keptConn:
		c, pending, rc, fd = k.Conn, append(pending, k.pending...), k.rc, k.fd
	case keptTLSConn:
		c, pending = k.Conn, append(pending, k.pending...)
	}
	k := &keptConn{Conn: c, idle: idle, pending: pending, rc: rc, fd: fd}
	k.first.Store(true)
	if tc, ok := c.(*tls.Conn); ok {
		return keptTLSConn{k, tc}, nil
	}
	return k, nil
}

// buffered returns what hc, fasthttp's hijacked connection over c, holds
// in its read buffer, without waiting for c: with c's read deadline in the
// past, a read that finds the buffer empty fails at once (Go checks the
// deadline before the system call), and bytes still in the socket stay
// there for the server. It leaves c's read deadline past.
func buffered(hc, c net.Conn) ([]byte, error) {
	if err := c.SetReadDeadline(time.Unix(1, 0)); err != nil {
		return nil, fmt.Errorf("read a pipelined request: %w", err)
	}
	var pending []byte
	var buf [4096]byte
	for {
		n, err := hc.Read(buf[:])
		pending = append(pending, buf[:n]...)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			return pending[:len(pending):len(pending)], nil
		case err != nil:
			return nil, fmt.Errorf("read a pipelined request: %w", err)
		case n == 0:
			return pending[:len(pending):len(pending)], nil
		}
	}
}

// readerField finds the reader field of fasthttp's hijacked connection
// once per type, for readsFrom: reflect's FieldByName walked the type at
// every stream (~1 % of the CPU at c=1 000) and took the hijack's
// goroutine past its first 2 KiB of stack. The zero value is ready; nil
// looks the field up each time.
type readerField struct {
	mu  sync.Mutex
	typ reflect.Type
	idx int // -1: the type has no such field
}

// index is the index of t's field r, or -1.
func (rf *readerField) index(t reflect.Type) int {
	if rf == nil {
		return readerIndex(t)
	}
	rf.mu.Lock()
	defer rf.mu.Unlock()
	if rf.typ != t {
		rf.typ, rf.idx = t, readerIndex(t)
	}
	return rf.idx
}

// readerIndex looks the field up. Not inlined: FieldByName's result is
// ~300 bytes of frame, which in index was on the stack of every stream's
// hijack goroutine, found or not, and took it past the stack it starts
// with (a copy of the stack per stream).
//
//go:noinline
func readerIndex(t reflect.Type) int {
	if f, ok := t.FieldByName("r"); ok && len(f.Index) == 1 {
		return f.Index[0]
	}
	return -1
}

// readsFrom reports whether fasthttp's hijacked connection hc reads
// straight from c (its reader is c, not a buffer in front of it).
func (rf *readerField) readsFrom(hc, c net.Conn) bool {
	v := reflect.ValueOf(hc)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return false
	}
	idx := rf.index(v.Elem().Type())
	if idx < 0 {
		return false
	}
	r := v.Elem().Field(idx)
	if r.Kind() != reflect.Interface || r.IsNil() {
		return false
	}
	r, cv := r.Elem(), reflect.ValueOf(c)
	return r.Type() == cv.Type() && r.Kind() == reflect.Pointer && r.Pointer() == cv.Pointer()
}

// keptConn is a connection handed back to the server after a stream. The
// server applies its ReadTimeout, not its IdleTimeout, to the first
// request of a connection it is given; here that request follows a
// previous one, so until it starts to arrive the idle timeout applies, as
// on any keep-alive connection.
type keptConn struct {
	net.Conn
	idle    time.Duration
	pending []byte      // read before the connection's own bytes
	first   atomic.Bool // no byte read yet
	// idleSet, once the connection is handed back, holds it until its
	// next request starts to arrive (keptSet).
	idleSet *keptSet
	// rc is Conn's raw connection (raw), carried to the connection's next
	// keptConn; ahead is the pooled buffer pending is in, and aheadN,
	// aheadErr its read's result (readAhead, readOnce).
	rc       syscall.RawConn
	ahead    *[aheadSize]byte
	aheadN   int
	aheadErr error
	// fd is Conn's socket once asked for (socket), carried to the next
	// keptConn of the connection; 0: not known yet.
	fd int
	// hijack is where the hijack of a stream asked for on the connection
	// stands (hijackAsked), hijackBody that stream.
	hijack     atomic.Int32
	hijackBody *sseBody
}

// socket returns k's socket descriptor (not for TLS), looked up once per
// connection: the peer watch and the event loop's relay want it at every
// request, and each lookup through the connection allocates.
func (k *keptConn) socket() (int, bool) {
	if k.fd > 0 {
		return k.fd, true
	}
	rc := k.raw()
	if rc == nil {
		return 0, false
	}
	fd := -1
	if rc.Control(func(s uintptr) { fd = int(s) }) != nil || fd <= 0 {
		return 0, false
	}
	k.fd = fd
	return fd, true
}

// raw returns Conn's raw connection, looked up once per connection; nil
// where it has none (TLS).
func (k *keptConn) raw() syscall.RawConn {
	if k.rc == nil {
		if sc, ok := k.Conn.(syscall.Conn); ok {
			if rc, err := sc.SyscallConn(); err == nil {
				k.rc = rc
			}
		}
	}
	return k.rc
}

// kept returns the keptConn in c, as keepAlive returns it.
func kept(c net.Conn) *keptConn {
	if t, ok := c.(keptTLSConn); ok {
		return t.keptConn
	}
	return c.(*keptConn)
}

// keptOf is kept for any connection the server serves: nil for one that
// was not handed back after a stream.
func keptOf(c net.Conn) *keptConn {
	switch k := c.(type) {
	case *keptConn:
		return k
	case keptTLSConn:
		return k.keptConn
	}
	return nil
}

// Where the hijack of a stream asked for on a kept connection stands
// (keptConn.hijack).
const (
	hijackNone int32 = iota
	hijackAsked
	hijackStarted
	hijackDropped
)

// hijackAsked notes that b's handler asked the server to hijack k: the
// hijack's handler then starts (hijackStarts), or the server returns
// without starting it and serveKept ends b (served).
func (k *keptConn) hijackAsked(b *sseBody) {
	k.hijackBody = b
	k.hijack.Store(hijackAsked)
}

// hijackStarts reports whether the hijack's handler may begin: false if
// served ended its stream already.
func (k *keptConn) hijackStarts() bool {
	return k.hijack.CompareAndSwap(hijackAsked, hijackStarted)
}

// served is called when the server's ServeConn of k returned err. fasthttp
// starts a hijack's handler, and then returns nil, unless setting up the
// connection for it failed, which it returns: the stream then never starts
// and is ended here. The timer that startWithin would set a request
// instead is a timer added and stopped, and four allocations, on every
// request's path.
func (k *keptConn) served(err error) {
	if err != nil && k.hijack.CompareAndSwap(hijackAsked, hijackDropped) {
		k.hijackBody.Close()
	}
}

// keptSet holds the connections handed back after a stream that wait for
// their next request, so that a drain closes them: fasthttp's Shutdown
// closes a waiting connection only once it has waited 5 s, and it never
// sees one handed back after it returned; such a connection would stay
// open, a goroutine reading it, until the client or the idle timeout
// closed it.
type keptSet struct {
	mu       sync.Mutex
	draining bool
	conns    map[*keptConn]struct{}
	ahead    sync.Pool // *[aheadSize]byte: keptConn.readAhead's buffers
}

// add holds k until its next request arrives or it closes, and reports
// whether it may be served: false once the drain began.
func (s *keptSet) add(k *keptConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	if s.conns == nil {
		s.conns = make(map[*keptConn]struct{})
	}
	s.conns[k] = struct{}{}
	k.idleSet = s
	return true
}

func (s *keptSet) remove(k *keptConn) {
	s.mu.Lock()
	delete(s.conns, k)
	s.mu.Unlock()
}

// drain refuses every later add and closes the connections waiting now.
// One whose request has started to arrive is left to the server, which
// closes it after its response.
func (s *keptSet) drain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.draining = true
	for k := range s.conns {
		_ = k.Conn.Close()
	}
	clear(s.conns)
}

func (k *keptConn) SetReadDeadline(t time.Time) error {
	if k.first.Load() && k.idle > 0 && !t.IsZero() {
		t = time.Now().Add(k.idle)
	}
	return k.Conn.SetReadDeadline(t)
}

func (k *keptConn) Read(p []byte) (int, error) {
	if len(k.pending) > 0 {
		n := copy(p, k.pending)
		k.pending = k.pending[n:]
		if len(k.pending) == 0 && k.ahead != nil {
			k.idleSet.ahead.Put(k.ahead)
			k.ahead, k.pending = nil, nil
		}
		k.started()
		return n, nil
	}
	if len(p) == 1 && k.idleSet != nil {
		if n, ok, err := k.readAhead(p); ok {
			return n, err
		}
	}
	n, err := k.Conn.Read(p)
	if n > 0 {
		k.started()
	}
	return n, err
}

// aheadSize is readAhead's buffer: a chat request's head and a short body.
const aheadSize = 4096

// readAhead serves fasthttp's one-byte read, with which it waits for a
// connection's next request (one byte, so that an idle connection holds
// no buffer), without the second system call fasthttp then makes for the
// rest: a pooled buffer is taken only once the socket is readable, and
// what came with the first byte is read into it in the same call and
// served to the reads that follow. ok is false where the connection
// offers no raw access (TLS): read it as usual.
func (k *keptConn) readAhead(p []byte) (n int, ok bool, err error) {
	rc := k.raw()
	if rc == nil {
		return 0, false, nil
	}
	k.aheadN, k.aheadErr = 0, nil
	err = rc.Read(k.readOnce)
	buf := k.ahead
	switch {
	case err != nil: // the deadline, or closed
	case k.aheadErr != nil:
		err = &net.OpError{Op: "read", Net: "tcp", Source: k.LocalAddr(), Addr: k.RemoteAddr(), Err: os.NewSyscallError("read", k.aheadErr)}
	case k.aheadN == 0:
		err = io.EOF
	}
	if err != nil {
		if buf != nil {
			k.idleSet.ahead.Put(buf)
			k.ahead = nil
		}
		return 0, true, err
	}
	p[0] = buf[0]
	if k.aheadN > 1 {
		k.pending = buf[1:k.aheadN]
	} else {
		k.idleSet.ahead.Put(buf)
		k.ahead = nil
	}
	k.started()
	return 1, true, nil
}

// readOnce is readAhead's attempt at the socket fd, into a pooled buffer
// (k.ahead) that it gives back if it finds nothing; false: wait for the
// socket to be readable.
func (k *keptConn) readOnce(fd uintptr) bool {
	buf, _ := k.idleSet.ahead.Get().(*[aheadSize]byte)
	if buf == nil {
		buf = new([aheadSize]byte)
	}
	var n int
	var err error
	for {
		n, err = unix.Read(int(fd), buf[:])
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EAGAIN {
		k.idleSet.ahead.Put(buf)
		return false
	}
	k.ahead, k.aheadN, k.aheadErr = buf, max(n, 0), err
	return true
}

// started notes that the next request has begun to arrive.
func (k *keptConn) started() {
	if k.first.Load() {
		k.first.Store(false)
		if k.idleSet != nil {
			k.idleSet.remove(k)
		}
	}
}

// NetConn lets the peer watch reach the socket.
func (k *keptConn) NetConn() net.Conn { return k.Conn }

// keptTLSConn is a kept TLS connection: fasthttp knows a TLS connection
// by these methods (RequestCtx.IsTLS).
type keptTLSConn struct {
	*keptConn
	tc *tls.Conn
}

func (k keptTLSConn) Handshake() error                     { return k.tc.Handshake() }
func (k keptTLSConn) ConnectionState() tls.ConnectionState { return k.tc.ConnectionState() }
