// Package testutil holds the small helpers many of hearth's tests need:
// waiting for a condition, a free loopback port, a NOTIFY_SOCKET that
// collects sd_notify messages, a settable clock, a log buffer to share
// with a logger, and the root/tool prerequisite check.
package testutil

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
)

// WaitFor checks cond until it holds and fails the test, naming what it
// waited for, if it still does not hold after within. Checks start 1 ms
// apart and back off to 50 ms, so a quick condition is seen at once and a
// slow one costs little. Use it where a real process or the kernel is
// involved; code that only uses timers and channels is better tested in a
// testing/synctest bubble, without waiting at all.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	bo := backoff.Backoff{Min: time.Millisecond, Max: 50 * time.Millisecond}
	for checks := 1; !cond(); checks++ {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (%d checks)", within, what, checks)
		}
		time.Sleep(bo.Next())
	}
}

// FreeAddr returns "127.0.0.1:port" with a port nothing listens on, for
// programs that can only be told a port (prefer listening on port 0 and
// handing the listener over). The port is drawn at random from below the
// kernel's ephemeral range: a port from that range, which is what port 0
// gives, can be taken before the program binds it by any outgoing
// connection on the machine (many run in parallel while tests do), and a
// supervised Ollama that finds its port taken refuses to start. Only a
// program binding that very port could take one from below. Falls back
// to port 0 if no such port is found free.
func FreeAddr() (string, error) {
	a, err := freeTCPAddr()
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// FreePort is FreeAddr's port; it fails the test on error.
func FreePort(t testing.TB) int {
	t.Helper()
	a, err := freeTCPAddr()
	if err != nil {
		t.Fatal(err)
	}
	return a.Port
}

// Ports FreeAddr draws from: below the ephemeral range (ephemeralLow, or
// the kernel's setting) and above what services usually take.
const (
	lowestPort   = 10000
	ephemeralLow = 32768
)

func freeTCPAddr() (*net.TCPAddr, error) {
	if hi := ephemeralStart() - 1; hi > lowestPort {
		for range 64 {
			p := lowestPort + rand.IntN(hi-lowestPort+1)
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue // in use
			}
			defer ln.Close()
			return ln.Addr().(*net.TCPAddr), nil
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr), nil
}

// ephemeralStart is the first port of the kernel's ephemeral range.
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return ephemeralLow
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return ephemeralLow
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return ephemeralLow
	}
	return lo
}

// Integration marks a test that needs a real system (root, Ollama,
// PostgreSQL, nginx, sshd, network namespaces, Terraform): `go test -short`
// — `make check`, the unit tier — skips it; `make test` runs it, and there
// a missing system is a failure, never a skip.
func Integration(t testing.TB, needs string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("integration test (needs %s): make test runs it", needs)
	}
}

// RequireRoot fails the test unless it runs as root and every tool is in
// PATH: a missing privilege or tool must never read as a pass. Setting the
// environment variable optOut to 1 skips the test instead, for machines
// that explicitly cannot run it; "" offers no opt-out.
func RequireRoot(t testing.TB, optOut string, tools ...string) {
	t.Helper()
	Integration(t, "root")
	if optOut != "" && os.Getenv(optOut) == "1" {
		t.Skipf("%s=1: test explicitly disabled", optOut)
	}
	hint := ""
	if optOut != "" {
		hint = fmt.Sprintf(" (or set %s=1 to opt out)", optOut)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root%s", hint)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("this test needs %s%s: %v", tool, hint, err)
		}
	}
}

// TCPPair returns the two ends of a loopback TCP connection, both closed
// when the test ends.
func TCPPair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}
