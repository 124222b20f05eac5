package testutil

import (
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// NotifySocket stands in for systemd's notification socket: a unixgram
// socket in a temp dir that collects sd_notify datagrams in order. Pass
// Path as $NOTIFY_SOCKET to the code under test.
type NotifySocket struct {
	Path string

	mu      sync.Mutex
	msgs    []string
	changed chan struct{} // closed and replaced on every datagram
	read    int           // datagrams Next has returned
}

// NewNotifySocket listens on a fresh notification socket until the test ends.
func NewNotifySocket(t testing.TB) *NotifySocket {
	t.Helper()
	n := &NotifySocket{Path: filepath.Join(t.TempDir(), "notify.sock"), changed: make(chan struct{})}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: n.Path, Net: "unixgram"})
	if err != nil {
		t.Fatalf("listen %s: %v", n.Path, err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, strings.TrimSpace(string(buf[:k])))
			close(n.changed)
			n.changed = make(chan struct{})
			n.mu.Unlock()
		}
	}()
	return n
}

// Messages returns every datagram received so far, oldest first.
func (n *NotifySocket) Messages() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// Next returns the datagram after the one it returned last, failing the
// test if none arrives within the given time.
func (n *NotifySocket) Next(t testing.TB, within time.Duration) string {
	t.Helper()
	i, msg := n.await(t, within, "the next notification", func(msgs []string) int {
		if n.read < len(msgs) {
			return n.read
		}
		return -1
	})
	n.read = i + 1
	return msg
}

// WaitFor waits for a datagram with a line starting with prefix ("READY=1",
// "STATUS=") and returns its index in Messages; it fails the test if none
// arrives within the given time.
func (n *NotifySocket) WaitFor(t testing.TB, within time.Duration, prefix string) int {
	t.Helper()
	i, _ := n.await(t, within, "a notification "+prefix, func(msgs []string) int {
		for i, m := range msgs {
			for _, line := range strings.Split(m, "\n") {
				if strings.HasPrefix(line, prefix) {
					return i
				}
			}
		}
		return -1
	})
	return i
}

// await blocks until find returns an index into the datagrams received,
// and returns it with its datagram.
func (n *NotifySocket) await(t testing.TB, within time.Duration, what string, find func([]string) int) (int, string) {
	t.Helper()
	timeout := time.NewTimer(within)
	defer timeout.Stop()
	for {
		n.mu.Lock()
		i, changed := find(n.msgs), n.changed
		msg := ""
		if i >= 0 {
			msg = n.msgs[i]
		}
		n.mu.Unlock()
		if i >= 0 {
			return i, msg
		}
		select {
		case <-changed:
		case <-timeout.C:
			t.Fatalf("no %s within %v; got %q", what, within, n.Messages())
			return -1, ""
		}
	}
}
