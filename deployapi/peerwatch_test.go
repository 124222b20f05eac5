package deployapi

import (
	"net"
	"testing"
	"time"

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
