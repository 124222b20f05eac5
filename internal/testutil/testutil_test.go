package testutil

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// recorder is a testing.TB whose Fatal and Skip end only the goroutine
// running the helper and record why, so tests can check that a helper fails.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatal(args ...any) {
	r.fatal = fmt.Sprint(args...)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder in its own goroutine and returns the recorder
// once f has returned or stopped.
func run(t *testing.T, f func(tb testing.TB)) *recorder {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		checks := 0
		WaitFor(t, time.Minute, "three checks", func() bool { checks++; return checks == 3 })
		// 1 ms, then 2 ms between checks: the poll starts fast.
		if d := time.Since(start); d != 3*time.Millisecond {
			t.Fatalf("returned after %v, want 3ms", d)
		}
	})
}

func TestWaitForFailsNamingWhatItWaitedFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		checks := 0
		start := time.Now()
		r := run(t, func(tb testing.TB) {
			WaitFor(tb, 2*time.Second, "the moon to turn blue", func() bool { checks++; return false })
		})
		if !strings.Contains(r.fatal, "the moon to turn blue") || !strings.Contains(r.fatal, "2s") {
			t.Fatalf("failure %q does not say what and how long", r.fatal)
		}
		if d := time.Since(start); d < 2*time.Second || d > 2*time.Second+50*time.Millisecond {
			t.Fatalf("gave up after %v, want 2s", d)
		}
		// Backing off to 50 ms: about 45 checks in 2 s, not thousands.
		if checks > 60 {
			t.Fatalf("%d checks in 2s", checks)
		}
	})
}

func TestFreePort(t *testing.T) {
	port := FreePort(t)
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("port %d is not free: %v", port, err)
	}
	ln.Close()
	// Below the ephemeral range, where no outgoing connection takes it.
	if lo := ephemeralStart(); port < lowestPort || port >= lo {
		t.Fatalf("port %d is not in [%d, %d)", port, lowestPort, lo)
	}
	addr, err := FreeAddr()
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") || strings.HasSuffix(addr, ":0") {
		t.Fatalf("FreeAddr = %q, %v", addr, err)
	}
}

func TestNotifySocket(t *testing.T) {
	n := NewNotifySocket(t)
	c, err := net.Dial("unixgram", n.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for _, m := range []string{"STATUS=warming up", "READY=1\nSTATUS=serving", "WATCHDOG=1"} {
		if _, err := c.Write([]byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if got := n.Next(t, 5*time.Second); got != "STATUS=warming up" {
		t.Fatalf("first %q", got)
	}
	if got := n.Next(t, 5*time.Second); got != "READY=1\nSTATUS=serving" {
		t.Fatalf("second %q", got)
	}
	if i := n.WaitFor(t, 5*time.Second, "STATUS=serving"); i != 1 {
		t.Fatalf("STATUS=serving at %d, want 1 (second line of a datagram)", i)
	}
	if i := n.WaitFor(t, 5*time.Second, "WATCHDOG=1"); i != 2 {
		t.Fatalf("WATCHDOG=1 at %d", i)
	}
	if got := n.Next(t, 5*time.Second); got != "WATCHDOG=1" {
		t.Fatalf("third %q", got)
	}
	// Nothing more was sent: waiting fails the test, naming what it wanted.
	r := run(t, func(tb testing.TB) { n.Next(tb, 20*time.Millisecond) })
	if !strings.Contains(r.fatal, "next notification") {
		t.Fatalf("Next with nothing sent: %q", r.fatal)
	}
	r = run(t, func(tb testing.TB) { n.WaitFor(tb, 20*time.Millisecond, "STOPPING=1") })
	if !strings.Contains(r.fatal, "STOPPING=1") || !strings.Contains(r.fatal, "WATCHDOG=1") {
		t.Fatalf("WaitFor a message never sent: %q (want what it waited for and what came)", r.fatal)
	}
}

func TestRequireRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test checks the root case; run it as root")
	}
	if r := run(t, func(tb testing.TB) { RequireRoot(tb, "", "sh") }); r.fatal != "" || r.skip != "" {
		t.Fatalf("root with sh: fatal %q skip %q", r.fatal, r.skip)
	}
	r := run(t, func(tb testing.TB) { RequireRoot(tb, "HEARTH_TESTUTIL_OPT_OUT", "no-such-tool-hearth") })
	if !strings.Contains(r.fatal, "no-such-tool-hearth") || !strings.Contains(r.fatal, "HEARTH_TESTUTIL_OPT_OUT=1") {
		t.Fatalf("missing tool: %q", r.fatal)
	}
	t.Setenv("HEARTH_TESTUTIL_OPT_OUT", "1")
	r = run(t, func(tb testing.TB) { RequireRoot(tb, "HEARTH_TESTUTIL_OPT_OUT", "no-such-tool-hearth") })
	if r.fatal != "" || !strings.Contains(r.skip, "HEARTH_TESTUTIL_OPT_OUT=1") {
		t.Fatalf("opted out: fatal %q skip %q", r.fatal, r.skip)
	}
}
