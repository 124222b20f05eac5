package deployapi

import (
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/testutil"
)

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) { return testutil.TCPPair(t) }

func TestPeerWatcherSeesTheClientGo(t *testing.T) {
	var w peerWatcher
	const n = 3
	clients, closed := make([]net.Conn, n), make([]chan struct{}, n)
	stops := make([]func(), n)
	for i := range n {
		c, s := tcpPair(t)
		clients[i], closed[i] = c, make(chan struct{})
		ch := closed[i]
		stops[i] = w.watch(s, func() { close(ch) })
	}
	// Bytes waiting in the socket (a pipelined request) are not a close.
	if _, err := clients[0].Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	clients[1].Close()
	select {
	case <-closed[1]:
	case <-time.After(10 * time.Second):
		t.Fatal("the closed client was not noticed")
	}
	// The one with data waiting is still watched: its close is noticed
	// too, though the bytes are still unread.
	select {
	case <-closed[0]:
		t.Fatal("a client that sent bytes was taken for closed")
	default:
	}
	clients[0].Close()
	select {
	case <-closed[0]:
	case <-time.After(10 * time.Second):
		t.Fatal("a close behind unread bytes was not noticed")
	}
	// A stopped watch calls nothing; the loop stays (parked) while
	// nothing is watched, and a later watch is served by it.
	stops[2]()
	clients[2].Close()
	for _, stop := range stops[:2] {
		stop()
	}
	select {
	case <-closed[2]:
		t.Fatal("a stopped watch called its callback")
	default:
	}
	running := func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.running
	}
	if !running() {
		t.Fatal("the watch loop ended while the watcher is open")
	}
	c, s := tcpPair(t)
	again := make(chan struct{})
	stopAgain := w.watch(s, func() { close(again) })
	c.Close()
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("a watch after an idle spell was not noticed")
	}
	stopAgain()
	// close ends the loop once nothing is watched; a watch after it
	// starts the loop again, which ends at the watch's stop.
	w.close()
	testutil.WaitFor(t, 10*time.Second, "the watch loop to end at close", func() bool { return !running() })
	c, s = tcpPair(t)
	last := make(chan struct{})
	stopLast := w.watch(s, func() { close(last) })
	c.Close()
	select {
	case <-last:
	case <-time.After(10 * time.Second):
		t.Fatal("a watch after close was not noticed")
	}
	stopLast()
	testutil.WaitFor(t, 10*time.Second, "the watch loop to end after the last stop", func() bool { return !running() })
}

// A kept connection's socket stays in the watcher's epoll instance between
// requests: the next request's watch re-arms it, a stopped watch's
// callback never runs, and the close is still seen. Also with the socket
// given as a keptConn, which looks its descriptor up once and carries it
// to the connection's next keptConn (keepAlive).
func TestPeerWatchRearmsAKeptConnection(t *testing.T) {
	for _, kept := range []bool{false, true} {
		t.Run(map[bool]string{false: "conn", true: "keptConn"}[kept], func(t *testing.T) {
			testPeerWatchRearms(t, kept)
		})
	}
}

func testPeerWatchRearms(t *testing.T, kept bool) {
	var w peerWatcher
	defer w.close()
	c, s := tcpPair(t)
	fd := fdOf(t, s)
	req1, req2 := net.Conn(s), net.Conn(s)
	if kept {
		k1 := &keptConn{Conn: s}
		req1 = k1
		defer func() {
			if k1.fd != fd {
				t.Errorf("keptConn's socket %d, want %d", k1.fd, fd)
			}
		}()
		// The next request's keptConn, as keepAlive makes it, once a
		// watch has looked the socket up.
		w.watch(req1, func() {})()
		req2 = &keptConn{Conn: s, fd: k1.fd}
	}
	first := make(chan struct{})
	w.watch(req1, func() { close(first) })() // a request that ended
	// Still in ep: adding it again is refused.
	if err := unix.EpollCtl(w.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLRDHUP}); err != unix.EEXIST {
		t.Fatalf("adding the socket again after the watch stopped: %v, want EEXIST (it stays in ep)", err)
	}
	second := make(chan struct{})
	stop := w.watch(req2, func() { close(second) })
	defer stop()
	c.Close()
	closedWithin(t, second, "the re-armed watch did not see the close")
	select {
	case <-first:
		t.Fatal("the stopped watch's callback ran")
	default:
	}
	// Closed, the socket left ep with it; a new one under the same number
	// is added afresh.
	s.Close()
	c2, s2 := tcpPair(t)
	third := make(chan struct{})
	req3 := net.Conn(s2)
	if kept {
		req3 = &keptConn{Conn: s2}
	}
	stop3 := w.watch(req3, func() { close(third) })
	defer stop3()
	c2.Close()
	closedWithin(t, third, "a new connection's watch did not see its close")
}

// closedWithin fails t with msg unless ch is closed within 10 s (a bound
// for a broken build, not a timing).
func closedWithin(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}

func fdOf(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	if err := rc.Control(func(s uintptr) { fd = int(s) }); err != nil {
		t.Fatal(err)
	}
	return fd
}
