// Package connlimit bounds the connections a listener keeps open: in all,
// and per source address.
//
// golang.org/x/net/netutil.LimitListener caps the total only, by blocking
// Accept; a per-source cap needs the peer's address at Accept, so both
// caps live here in one small wrapper.
package connlimit

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
)

// Listener is a net.Listener that keeps at most Total connections open
// (Accept waits for one to close beyond that) and at most PerSource from
// one IP address (more are closed at once, before any byte is read).
type Listener struct {
	net.Listener
	perSource int
	slots     chan struct{}

	mu     sync.Mutex
	bySrc  map[netip.Addr]int
	closed chan struct{}
	once   sync.Once
}

// New wraps ln; a limit of 0 or less is no limit.
func New(ln net.Listener, total, perSource int) *Listener {
	l := &Listener{Listener: ln, perSource: perSource, bySrc: map[netip.Addr]int{}, closed: make(chan struct{})}
	if total > 0 {
		l.slots = make(chan struct{}, total)
	}
	return l
}

// Accept returns the next connection within the limits.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		if l.slots != nil {
			select {
			case l.slots <- struct{}{}:
			case <-l.closed:
				return nil, net.ErrClosed
			}
		}
		c, err := l.Listener.Accept()
		if err != nil {
			l.release()
			return nil, err
		}
		src := sourceOf(c)
		if !l.take(src) {
			c.Close()
			l.release()
			continue
		}
		return &conn{Conn: c, l: l, src: src}, nil
	}
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// Open returns the connections open now from src.
func (l *Listener) Open(src netip.Addr) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bySrc[src]
}

func (l *Listener) take(src netip.Addr) bool {
	if l.perSource <= 0 || !src.IsValid() {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bySrc[src] >= l.perSource {
		return false
	}
	l.bySrc[src]++
	return true
}

func (l *Listener) done(src netip.Addr) {
	if l.perSource > 0 && src.IsValid() {
		l.mu.Lock()
		if l.bySrc[src]--; l.bySrc[src] <= 0 {
			delete(l.bySrc, src)
		}
		l.mu.Unlock()
	}
	l.release()
}

func (l *Listener) release() {
	if l.slots != nil {
		<-l.slots
	}
}

func sourceOf(c net.Conn) netip.Addr {
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

type conn struct {
	net.Conn
	l    *Listener
	src  netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.done(c.src) })
	return err
}

// NetConn is the connection accepted, as tls.Conn's, for code that looks
// beneath the wrappers (a socket's descriptor, its close watched).
func (c *conn) NetConn() net.Conn { return c.Conn }

// SyscallConn is the accepted connection's, so the wrapper hides no
// socket from code that reads or watches it directly.
func (c *conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("connection %T has no descriptor", c.Conn)
	}
	return sc.SyscallConn()
}
