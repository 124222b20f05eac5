package deployapi

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// watchPeerClose calls onClose as soon as the client closes its end of conn.
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
