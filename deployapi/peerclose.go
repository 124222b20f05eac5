package deployapi

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// watchPeerClose calls onClose as soon as the client closes its end of conn,
// with a goroutine of its own: peerWatcher's fallback where an epoll
// instance cannot be had.
//
// fasthttp has no per-request context that ends when the client goes away,
// and a streaming response only notices a dead peer on a failed write, which
// may come long after (a slow first token, a request still queued). So while
// a generation runs we wait for the socket to become readable through Go's
// netpoller and peek at it without consuming anything: zero bytes means the
// peer closed. Bytes waiting (a pipelined request, noise, or over TLS a
// close_notify alert; encrypted records all look alike) prove nothing
// either way, so then we wait on for the FIN itself (POLLRDHUP), which the
// kernel reports even with unread data queued; the bytes stay in the socket
// for fasthttp to read after the response.
//
// The returned stop must be called before the connection is used for
// reading again; it interrupts the watch and waits for it to end.
func watchPeerClose(conn net.Conn, onClose func()) (stop func()) {
	rc := rawConn(conn)
	if rc == nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		err := rc.Read(func(fd uintptr) bool {
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return false // nothing yet: park in the netpoller
			}
			if err == nil && n > 0 {
				pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
				if _, perr := unix.Poll(pfd, 0); perr != nil || pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP) == 0 {
					return false // data but no FIN yet: park until the next event
				}
			}
			return true // FIN, reset or hang-up
		})
		if err == nil {
			onClose()
		}
	}()
	return func() {
		// A deadline in the past wakes the parked Read; then clear it so the
		// next request on this keep-alive connection reads normally.
		_ = conn.SetReadDeadline(time.Unix(1, 0))
		<-done
		_ = conn.SetReadDeadline(time.Time{})
	}
}

func rawConn(c net.Conn) syscall.RawConn {
	for range 4 { // unwrap TLS and wrapper conns a few levels deep
		switch v := c.(type) {
		case *tls.Conn:
			c = v.NetConn()
			continue
		case syscall.Conn:
			rc, err := v.SyscallConn()
			if err != nil {
				return nil
			}
			return rc
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
			continue
		}
		return nil
	}
	return nil
}

// peerWatcher watches every request's socket for the client's close from
// one goroutine, instead of one goroutine per request (watchPeerClose): an
// epoll instance of its own holds the sockets (EPOLLRDHUP, one shot) and
// sits in Go's netpoller, so the goroutine parks like any network read and
// runs only when a client goes. With thousands of streams that is a
// goroutine stack per stream saved. The goroutine stays parked while
// nothing is watched (ending it then cost a wake-up, an exit and a new
// goroutine per request at one stream) and ends at close.
//
// The kernel reports EPOLLRDHUP for the FIN even with unread data queued,
// and EPOLLHUP/EPOLLERR for a reset, so a pipelined request or a TLS alert
// waiting in the socket proves nothing, as in watchPeerClose.
type peerWatcher struct {
	mu      sync.Mutex
	ep      *os.File // the epoll instance, pollable by Go's netpoller
	epfd    int      // ep's descriptor (ep.Fd would make it blocking)
	wake    int      // an eventfd in ep: wakes the loop to see it is idle
	active  map[uint32]func()
	next    uint32
	running bool
	closing bool  // close was called: the goroutine ends once nothing is watched
	err     error // setting up failed: watch falls back to watchPeerClose
}

// wakeID is the eventfd's id in ep; sockets get ids from 1.
const wakeID = 0

func (w *peerWatcher) setup() error {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return fmt.Errorf("epoll non-blocking: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return fmt.Errorf("eventfd: %w", err)
	}
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: wakeID}); err != nil {
		unix.Close(epfd)
		unix.Close(wake)
		return fmt.Errorf("epoll_ctl eventfd: %w", err)
	}
	// A non-blocking descriptor becomes a pollable File: an epoll
	// instance is readable while it has events ready.
	w.ep, w.epfd, w.wake, w.active = os.NewFile(uintptr(epfd), "peer-watch"), epfd, wake, map[uint32]func(){}
	return nil
}

// watch calls onClose as soon as the client closes its end of conn. The
// returned stop must be called before conn is read again; onClose may
// still run once if the close and stop cross.
func (w *peerWatcher) watch(conn net.Conn, onClose func()) (stop func()) {
	// A kept connection knows its socket (keptConn.socket): no lookup.
	var rc syscall.RawConn
	fd := -1
	if k, ok := conn.(*keptConn); ok {
		if s, ok := k.socket(); ok {
			fd = s
		}
	}
	if fd < 0 {
		if rc = rawConn(conn); rc == nil {
			return func() {}
		}
	}
	w.mu.Lock()
	if w.ep == nil && w.err == nil {
		w.err = w.setup()
	}
	if w.err != nil {
		w.mu.Unlock()
		return watchPeerClose(conn, onClose)
	}
	id := w.nextID()
	var err error
	if rc == nil {
		err = w.arm(fd, id)
	} else {
		var addErr error
		if err = rc.Control(func(s uintptr) { addErr = w.arm(int(s), id) }); err == nil {
			err = addErr
		}
	}
	if err != nil {
		w.mu.Unlock()
		return watchPeerClose(conn, onClose)
	}
	w.active[id] = onClose
	if !w.running {
		w.running = true
		go w.loop()
	}
	w.mu.Unlock()
	return func() {
		// The socket stays in ep, disarmed once its one shot fires: the
		// next request on the connection re-arms it (arm), and closing the
		// connection takes it out (the kernel drops a closed file from
		// every epoll instance). A close that fires for a stopped watch
		// finds no callback.
		w.mu.Lock()
		delete(w.active, id)
		end := len(w.active) == 0 && w.closing
		w.mu.Unlock()
		if end {
			w.wakeLoop()
		}
	}
}

// arm has ep report the client's close of fd once, as id. A kept
// connection's socket is in ep already from its last request: re-arming it
// is one system call a request where adding and removing it was two, and
// cheaper ones (no epoll item allocated and freed). ENOENT means it is not
// (a new connection, or another socket under a reused number, which the
// kernel never confuses with the old one: it finds items by file).
func (w *peerWatcher) arm(fd int, id uint32) error {
	ev := unix.EpollEvent{Events: unix.EPOLLRDHUP | unix.EPOLLONESHOT, Fd: int32(id)}
	err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_MOD, fd, &ev)
	if err == unix.ENOENT {
		err = unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &ev)
	}
	return err
}

// close ends the goroutine once nothing is watched (now, if nothing is).
// A watch after close starts it again, to end at its stop.
func (w *peerWatcher) close() {
	w.mu.Lock()
	w.closing = true
	wake := w.running
	w.mu.Unlock()
	if wake {
		w.wakeLoop()
	}
}

func (w *peerWatcher) wakeLoop() {
	var one [8]byte
	one[0] = 1 // native endianness: amd64 and arm64 are little-endian
	_, _ = unix.Write(w.wake, one[:])
}

// nextID returns an id no active watch has; w.mu is held.
func (w *peerWatcher) nextID() uint32 {
	for {
		w.next++
		if _, used := w.active[w.next]; w.next != wakeID && !used {
			return w.next
		}
	}
}

// loop runs the callbacks of closed sockets until nothing is watched.
func (w *peerWatcher) loop() {
	rc, err := w.ep.SyscallConn()
	if err != nil {
		w.mu.Lock()
		w.running = false
		w.mu.Unlock()
		return
	}
	evs := make([]unix.EpollEvent, 64)
	var fired []func()
	for {
		fired = fired[:0]
		err := rc.Read(func(epfd uintptr) bool {
			n, err := unix.EpollWait(int(epfd), evs, 0)
			if err != nil || n <= 0 {
				return false // nothing ready: park until ep is readable
			}
			w.mu.Lock()
			for _, ev := range evs[:n] {
				id := uint32(ev.Fd)
				if id == wakeID {
					var b [8]byte
					_, _ = unix.Read(w.wake, b[:])
					continue
				}
				if f, ok := w.active[id]; ok {
					delete(w.active, id)
					fired = append(fired, f)
				}
			}
			w.mu.Unlock()
			return true
		})
		for _, f := range fired {
			f()
		}
		w.mu.Lock()
		if err != nil || len(w.active) == 0 && w.closing {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}
