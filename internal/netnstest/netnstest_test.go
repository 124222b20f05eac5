package netnstest

import (
	"net/netip"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/testutil"
)

// TestPairEcho: the two ends of a pair reach each other's echo servers over
// TCP and UDP, on both address families, and nothing listens where none was
// started.
func TestPairEcho(t *testing.T) {
	testutil.RequireRoot(t, "", "ip")
	srv4, srv6 := netip.MustParseAddr("10.232.0.1"), netip.MustParseAddr("fd00:232::1")
	cli4, cli6 := netip.MustParseAddr("10.232.0.2"), netip.MustParseAddr("fd00:232::2")
	p := NewPair(t, "hnt", []netip.Prefix{netip.PrefixFrom(srv4, 24), netip.PrefixFrom(srv6, 64)},
		[]netip.Prefix{netip.PrefixFrom(cli4, 24), netip.PrefixFrom(cli6, 64)})
	ListenEcho(t, p.Server,
		[]netip.AddrPort{netip.AddrPortFrom(netip.IPv6Unspecified(), 7)},
		[]netip.AddrPort{netip.AddrPortFrom(srv4, 7), netip.AddrPortFrom(srv6, 7)})

	// A reachable probe answers at once and a closed port is refused at
	// once, so the bound only stops a broken pair from hanging the test.
	const timeout = 15 * time.Second
	for _, c := range []struct {
		network  string
		src, dst netip.Addr
		port     uint16
		want     bool
	}{
		{"tcp", cli4, srv4, 7, true}, {"tcp", cli6, srv6, 7, true},
		{"udp", cli4, srv4, 7, true}, {"udp", cli6, srv6, 7, true},
		{"tcp", cli4, srv4, 8, false},
	} {
		err := Run(p.Client, func() error { return Echo(c.network, c.src, netip.AddrPortFrom(c.dst, c.port), timeout) })
		if (err == nil) != c.want {
			t.Errorf("%s %s -> %s:%d: err = %v, want reachable %v", c.network, c.src, c.dst, c.port, err, c.want)
		}
	}
}

// TestRunRestoresThread: f runs in the namespace, and Run's thread is back
// in its own namespace afterwards rather than left behind in it.
func TestRunRestoresThread(t *testing.T) {
	testutil.RequireRoot(t, "", "ip")
	p := NewPair(t, "hnt", nil, nil)
	var own, inside unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &own); err != nil {
		t.Fatal(err)
	}
	var tid int
	err := Run(p.Server, func() error {
		tid = unix.Gettid()
		return unix.Stat("/proc/thread-self/ns/net", &inside)
	})
	if err != nil {
		t.Fatal(err)
	}
	if inside.Ino == own.Ino {
		t.Fatal("f ran in the test's own namespace")
	}
	// The thread lives on (it was not discarded) and is home again.
	var after unix.Stat_t
	if err := unix.Stat("/proc/self/task/"+strconv.Itoa(tid)+"/ns/net", &after); err != nil {
		t.Fatalf("Run's thread is gone: %v", err)
	}
	if after.Ino != own.Ino {
		t.Fatal("Run's thread was left in the namespace")
	}
}
