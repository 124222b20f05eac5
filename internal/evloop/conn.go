package evloop

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/cacheline"
)

// ErrWouldBlock is what Read and Write return in polled mode (Poll) when
// the socket has nothing to read or no room to write: wait for the
// handler's next call.
var ErrWouldBlock = errors.New("evloop: operation would block")

// ErrInterrupted is what a blocking Read (having read nothing) or Write
// returns when a channel given to Interrupt became ready while it waited.
var ErrInterrupted = errors.New("evloop: interrupted")

// Conn is a TCP connection watched by a Loop instead of Go's netpoller.
//
// In blocking mode (the default) it is a net.Conn whose Read and Write wait
// for the loop's word when the socket is not ready. In polled mode (Poll)
// they never wait: they return ErrWouldBlock, and the loop calls the
// handler given to Poll, in its goroutine, whenever the socket may be ready.
// Close may be called from any goroutine at any time: the descriptor is
// closed once no read or write is using it, so its number is never reused
// under one.
type Conn struct {
	l             *Loop
	fd            int
	id            uint64
	local, remote net.Addr

	mu     sync.Mutex
	ops    int // reads and writes using fd now
	closed bool
	fdDone bool

	polled atomic.Pointer[func()] // polled mode's handler
	failed atomic.Bool            // a read or write failed for good (not ErrWouldBlock)

	// ev is twice the events the loop delivered (Edge), plus one once an
	// event said the peer closed or the socket failed (HungUp). Written by
	// the loop only; atomic so that a blocking read can take it (drained).
	ev atomic.Uint64
	// drained is Edge when the last read emptied the socket, or ^0
	// (Drained); only the reading goroutine writes it.
	drained uint64

	rd, wr chan struct{} // blocking mode: the loop's word, one pending at most
	gone   chan struct{} // closed by Close

	// A blocking Read or Write that has to wait returns ErrInterrupted
	// when one of these is ready (Interrupt); only the goroutine that
	// reads and writes uses them.
	intr, intrLate <-chan struct{}
	later          bool // Later; only the reading goroutine uses it
}

var _ net.Conn = (*Conn)(nil)

// Detach takes c, a TCP connection, out of Go's netpoller and returns it
// watched by l: the descriptor is duplicated and c closed (which removes it
// from the netpoller and leaves the socket open, held by the duplicate).
// On an error c is closed all the same.
func (l *Loop) Detach(c net.Conn) (*Conn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("evloop: detach %T: not a socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("evloop: detach: %w", err)
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) {
		fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		derr = err
	}
	local, remote := c.LocalAddr(), c.RemoteAddr()
	c.Close()
	if derr != nil {
		return nil, fmt.Errorf("evloop: detach: dup: %w", derr)
	}
	// Non-blocking already (it was Go's), which is a property of the socket
	// both descriptors shared; set all the same, it costs one call a
	// connection.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("evloop: detach: %w", err)
	}
	pc := &Conn{l: l, fd: fd, local: local, remote: remote, drained: ^uint64(0),
		rd: make(chan struct{}, 1), wr: make(chan struct{}, 1), gone: make(chan struct{})}
	id, err := l.Watch(fd, unix.EPOLLIN|unix.EPOLLOUT|unix.EPOLLRDHUP, pc.ready)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	pc.id = id
	return pc, nil
}

// ready is the loop's handler of the socket's events.
func (c *Conn) ready(events uint32) {
	ev := c.ev.Load() + 2
	if events&(unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		ev |= 1
	}
	c.ev.Store(ev)
	if h := c.polled.Load(); h != nil {
		(*h)()
		return
	}
	if events&(unix.EPOLLIN|unix.EPOLLRDHUP|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		notify(c.rd)
		// A blocking read waits for a request's first line.
		c.l.Yield()
	}
	if events&(unix.EPOLLOUT|unix.EPOLLHUP|unix.EPOLLERR) != 0 {
		notify(c.wr)
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Poll switches c to polled mode with h as its handler: from now on the
// loop calls h in its goroutine whenever the socket may be readable or
// writable, or c was closed. A nil h switches back to blocking mode. Call it
// from the loop's goroutine, or while nothing reads or writes c: the handler
// and blocking reads must not overlap.
//
// hot are the cache lines h reads at every call (cacheline.Of), which the
// loop loads with c's own before it calls h (Loop.SetHot); they stay
// referenced until the next Poll.
func (c *Conn) Poll(h func(), hot ...unsafe.Pointer) {
	if h == nil {
		c.polled.Store(nil)
		c.l.SetHot(c.id, nil)
		return
	}
	c.polled.Store(&h)
	// c, the box polled points to, and h's closure (a func value is a
	// pointer to it) are what ready reads before it calls h. A small
	// array: a stream's Poll runs on a goroutine fasthttp starts for it,
	// whose stack had to grow for a buffer of hotMax (1–2 % of hearthd's
	// CPU at c=1 000 went to copying stacks there).
	var buf [connLines + 2]unsafe.Pointer
	own := cacheline.Of(buf[:0], c)
	own = append(own, unsafe.Pointer(&h), *(*unsafe.Pointer)(unsafe.Pointer(&h)))
	c.l.setHot(c.id, own, hot)
}

// connLines bounds the cache lines a Conn spans, wherever it starts.
const connLines = (unsafe.Sizeof(Conn{})+cacheline.Size-2)/cacheline.Size + 1

// Edge counts the events the loop delivered for c. A polled reader that
// read less than it asked for has emptied the socket, unless HungUp: until
// Edge changes (edge-triggered, the loop delivers an event when more
// arrives) another read would find it empty.
func (c *Conn) Edge() uint64 { return c.ev.Load() >> 1 }

// Drained is Edge as it was when the last Read emptied the socket (read
// less than it asked for, the peer not hung up), or ^0 when it did not: a
// polled reader that takes over from blocking reads (its handler run
// after them) starts from it, and saves a read that would find the socket
// empty.
func (c *Conn) Drained() uint64 { return c.drained }

// HungUp reports whether an event the loop delivered said that the peer
// closed its end, or that the socket failed. A short read then does not
// mean that the socket is empty: the close is still to be read, and no
// other event will say so (edge-triggered: the bytes and the close may
// come in one event).
func (c *Conn) HungUp() bool { return c.ev.Load()&1 != 0 }

// Loop is the loop watching c.
func (c *Conn) Loop() *Loop { return c.l }

// Failed reports whether a read or write of c failed for good: the peer
// closed or reset the connection, or c was closed. A read then returns the
// error at once.
func (c *Conn) Failed() bool { return c.failed.Load() }

// acquire marks a read or write using fd; false once c is closed.
func (c *Conn) acquire() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.ops++
	return true
}

func (c *Conn) release() {
	c.mu.Lock()
	c.ops--
	last := c.closed && c.ops == 0 && !c.fdDone
	if last {
		c.fdDone = true
	}
	c.mu.Unlock()
	if last {
		unix.Close(c.fd)
	}
}

// Read reads what the socket holds, waiting for it in blocking mode.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if c.later {
		c.later = false
		if err := c.await(); err != nil {
			return 0, err
		}
	}
	for {
		if !c.acquire() {
			c.failed.Store(true)
			return 0, net.ErrClosed
		}
		// Taken before the read: an event after it is one the read may
		// not have seen the bytes of.
		ev := c.ev.Load()
		n, err := Read(c.fd, p)
		for err == unix.EINTR {
			n, err = Read(c.fd, p)
		}
		c.release()
		switch {
		case n > 0:
			c.drained = ^uint64(0)
			if n < len(p) && ev&1 == 0 {
				c.drained = ev >> 1
			}
			return n, nil
		case err == nil:
			c.failed.Store(true)
			return 0, io.EOF
		case err == unix.EAGAIN:
			if c.polled.Load() != nil {
				return 0, ErrWouldBlock
			}
			if err := c.await(); err != nil {
				return 0, err
			}
		default:
			c.failed.Store(true)
			return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.local, Addr: c.remote, Err: os.NewSyscallError("read", err)}
		}
	}
}

// await waits for the loop's word that the socket may be readable, or
// Close, or an interrupt (ErrInterrupted).
func (c *Conn) await() error {
	select {
	case <-c.rd:
	case <-c.gone:
	case <-c.intr:
		return ErrInterrupted
	case <-c.intrLate:
		return ErrInterrupted
	}
	return nil
}

// Later says that the socket is empty and its next bytes are still to
// come, as the answer to a request just written: the next blocking Read
// waits for the loop's word before it reads, which saves a read that
// would find nothing. A word the loop gave before is enough (the bytes
// may be in already), and a stale one costs only that read. Only the
// goroutine that reads may call it.
func (c *Conn) Later() { c.later = true }

// Interrupt makes a blocking Read that has to wait give up with
// ErrInterrupted, having read nothing, when done or late closes, and a
// blocking Write likewise, with what it wrote; nil channels clear it. For
// a caller that waits for an answer in its own goroutine but must return
// on its context or a deadline (late) while the connection stays open and
// the answer's bytes untouched. Only the goroutine that reads and writes
// may call it.
func (c *Conn) Interrupt(done, late <-chan struct{}) {
	c.intr, c.intrLate = done, late
}

// Write writes p, waiting for room in blocking mode. In polled mode it
// returns what it wrote and ErrWouldBlock when the socket is full.
func (c *Conn) Write(p []byte) (int, error) {
	written := 0
	for written < len(p) {
		if !c.acquire() {
			c.failed.Store(true)
			return written, net.ErrClosed
		}
		n, err := Write(c.fd, p[written:])
		for err == unix.EINTR {
			n, err = Write(c.fd, p[written:])
		}
		c.release()
		if n > 0 {
			written += n
			continue
		}
		if err == unix.EAGAIN {
			if c.polled.Load() != nil {
				return written, ErrWouldBlock
			}
			select {
			case <-c.wr:
			case <-c.gone:
			case <-c.intr:
				return written, ErrInterrupted
			case <-c.intrLate:
				return written, ErrInterrupted
			}
			continue
		}
		if err == nil {
			err = io.ErrShortWrite
		}
		c.failed.Store(true)
		return written, &net.OpError{Op: "write", Net: "tcp", Source: c.local, Addr: c.remote, Err: os.NewSyscallError("write", err)}
	}
	return written, nil
}

// Close closes the connection: a blocked Read or Write returns, and in
// polled mode the handler is called once more (on the loop's goroutine) so it
// sees it.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.gone)
	last := c.ops == 0
	if last {
		c.fdDone = true
	}
	c.mu.Unlock()
	c.failed.Store(true)
	c.l.forget(c.id)
	if last {
		unix.Close(c.fd) // which also takes it out of epoll
	}
	if h := c.polled.Load(); h != nil {
		c.l.Post(*h)
	}
	return nil
}

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// Deadlines are not kept: the runtime's transport, the one user, ends a
// request by closing its connection (its context), never by a deadline.
func (c *Conn) SetDeadline(time.Time) error      { return nil }
func (c *Conn) SetReadDeadline(time.Time) error  { return nil }
func (c *Conn) SetWriteDeadline(time.Time) error { return nil }
