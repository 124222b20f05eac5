// Package netnstest builds throwaway network namespaces for tests that check
// real kernel networking: a pair of namespaces joined by a veth, code run
// inside a namespace, and one-byte echo servers and probes to see what
// traffic gets through. It needs root and iproute2.
package netnstest

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/testutil"
)

// Run runs f on an OS thread that has joined the named network namespace
// (one under /run/netns, as `ip netns add` makes). Sockets f creates live in
// that namespace for good, and processes f starts begin in it.
//
// The thread returns to its own namespace and is unlocked afterwards rather
// than discarded: a child started with Pdeathsig is signalled when the
// thread that started it exits, and code outside f may start one from any
// thread. Only if the way back fails does the thread stay locked, and the
// runtime then discards it; so a child f starts with Pdeathsig must not be
// meant to outlive f.
func Run(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = f()
		// Only a thread back in its own namespace may run other
		// goroutines; if that fails it stays locked and the runtime
		// discards it.
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Pair is a server and a client namespace joined by a veth pair whose ends
// are both named veth0.
type Pair struct {
	Server, Client string
}

// NewPair creates the namespaces prefix-s-ID and prefix-c-ID (ID random),
// with loopback up, joins them by veth0 and gives each end its addresses;
// IPv6 ones skip duplicate address detection so they are usable at once.
// The namespaces, and whatever still runs in them, go when the test ends.
func NewPair(t testing.TB, prefix string, server, client []netip.Prefix) Pair {
	t.Helper()
	testutil.Integration(t, "network namespaces")
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(rnd[:])
	p := Pair{Server: prefix + "-s-" + id, Client: prefix + "-c-" + id}
	for _, ns := range []string{p.Server, p.Client} {
		ip(t, "netns", "add", ns)
		t.Cleanup(func() { deleteNS(t, ns) })
		ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	ip(t, "-n", p.Server, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", p.Client)
	for ns, addrs := range map[string][]netip.Prefix{p.Server: server, p.Client: client} {
		for _, a := range addrs {
			args := []string{"-n", ns, "addr", "add", a.String(), "dev", "veth0"}
			if a.Addr().Is6() {
				args = append(args, "nodad")
			}
			ip(t, args...)
		}
		ip(t, "-n", ns, "link", "set", "veth0", "up")
	}
	for _, ns := range []string{p.Server, p.Client} {
		waitOperUp(t, ns, "veth0")
	}
	return p
}

// waitOperUp waits until dev in ns is operationally up. The kernel attaches
// a device's real queueing discipline only when it sees the carrier come up,
// which it does in deferred work that can lag by a second; until then every
// packet is dropped, so a probe sent at once would time out (and a lost
// IPv6 neighbour solicitation delays the next one further). The bound is
// only a backstop for a device that never comes up.
func waitOperUp(t testing.TB, ns, dev string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", dev).CombinedOutput()
		if err != nil {
			t.Fatalf("ip -n %s link show %s: %v\n%s", ns, dev, err, out)
		}
		if strings.Contains(string(out), "state UP") && !strings.Contains(string(out), "NO-CARRIER") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s in %s not up after 30s: %s", dev, ns, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ip runs the ip command; the test fails, showing its output, if it fails.
func ip(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// deleteNS kills whatever still runs in the namespace (children of the
// processes a test started there) and deletes it. The test process itself
// is never killed, should one of its threads still be listed.
func deleteNS(t testing.TB, ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		t.Errorf("delete netns %s: %v\n%s", ns, err, out)
	}
}

// ListenEcho starts, inside ns, TCP servers on tcp that echo one byte per
// connection and UDP servers on udp that echo every datagram; they close
// when the test ends.
func ListenEcho(t testing.TB, ns string, tcp, udp []netip.AddrPort) {
	t.Helper()
	var closers []io.Closer
	err := Run(ns, func() error {
		for _, a := range tcp {
			ln, err := net.Listen("tcp", a.String())
			if err != nil {
				return err
			}
			closers = append(closers, ln)
			go serveTCPEcho(ln)
		}
		for _, a := range udp {
			pc, err := net.ListenPacket("udp", a.String())
			if err != nil {
				return err
			}
			closers = append(closers, pc)
			go serveUDPEcho(pc)
		}
		return nil
	})
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

func serveTCPEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, 1)
			if _, err := io.ReadFull(c, buf); err == nil {
				_, _ = c.Write(buf)
			}
		}()
	}
}

func serveUDPEcho(pc net.PacketConn) {
	buf := make([]byte, 64)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

// Echo sends one byte over network ("tcp" or "udp") from src to dst and
// waits up to timeout for it to come back. Called inside Run, it probes
// from that namespace.
func Echo(network string, src netip.Addr, dst netip.AddrPort, timeout time.Duration) error {
	d := net.Dialer{Timeout: timeout}
	if network == "tcp" {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	} else {
		d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
	}
	c, err := d.Dial(network, dst.String())
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{'h'}); err != nil {
		return err
	}
	buf := make([]byte, 1)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if buf[0] != 'h' {
		return fmt.Errorf("echo returned %q", buf)
	}
	return nil
}
