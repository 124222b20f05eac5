package systemd

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
)

// newNotifySocket listens on a notification socket exported as
// $NOTIFY_SOCKET for the test.
func newNotifySocket(t *testing.T) *testutil.NotifySocket {
	t.Helper()
	n := testutil.NewNotifySocket(t)
	t.Setenv("NOTIFY_SOCKET", n.Path)
	return n
}

func TestSdNotifierSendsLifecycleInOrder(t *testing.T) {
	sock := newNotifySocket(t)
	var n Notifier = SdNotifier{}

	steps := []struct {
		send func() error
		want string
	}{
		{n.Ready, "READY=1"},
		{func() error { return n.Status("serving model hearth-tiny") }, "STATUS=serving model hearth-tiny"},
		{n.WatchdogPing, "WATCHDOG=1"},
		{n.Stopping, "STOPPING=1"},
	}
	for _, s := range steps {
		if err := s.send(); err != nil {
			t.Fatalf("send %q: %v", s.want, err)
		}
	}
	for _, s := range steps {
		if got := sock.Next(t, 5*time.Second); got != s.want {
			t.Fatalf("got %q, want %q", got, s.want)
		}
	}
}

func TestSdNotifierStatusCannotInjectAssignments(t *testing.T) {
	sock := newNotifySocket(t)
	if err := (SdNotifier{}).Status("pulling model\nREADY=1\r\nMAINPID=1"); err != nil {
		t.Fatal(err)
	}
	got := sock.Next(t, 5*time.Second)
	if strings.ContainsAny(got, "\r\n") {
		t.Fatalf("status carried a line break: %q", got)
	}
	if want := "STATUS=pulling model READY=1 MAINPID=1"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestSdNotifierReloadingCarriesMonotonicTimestamp(t *testing.T) {
	sock := newNotifySocket(t)
	if err := (SdNotifier{}).Reloading(); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(sock.Next(t, 5*time.Second), "\n")
	if len(lines) != 2 || lines[0] != "RELOADING=1" || !strings.HasPrefix(lines[1], "MONOTONIC_USEC=") {
		t.Fatalf("got %q, want RELOADING=1 and MONOTONIC_USEC=", lines)
	}
	usec, err := strconv.ParseInt(strings.TrimPrefix(lines[1], "MONOTONIC_USEC="), 10, 64)
	if err != nil || usec <= 0 {
		t.Fatalf("MONOTONIC_USEC %q is not a positive integer (%v)", lines[1], err)
	}
}

func TestSdNotifierWithoutSocketIsNoOp(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", "")
	n := SdNotifier{}
	for name, f := range map[string]func() error{
		"Ready": n.Ready, "Stopping": n.Stopping, "Reloading": n.Reloading, "WatchdogPing": n.WatchdogPing,
		"Status": func() error { return n.Status("x") },
	} {
		if err := f(); err != nil {
			t.Errorf("%s without NOTIFY_SOCKET: %v", name, err)
		}
	}
}

func TestSdNotifierReportsUnreachableSocket(t *testing.T) {
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "missing.sock"))
	err := (SdNotifier{}).Ready()
	if err == nil || !strings.Contains(err.Error(), "READY=1") {
		t.Fatalf("Ready to a missing socket: got %v, want an error naming READY=1", err)
	}
}

func TestFakeRecordsAndWaits(t *testing.T) {
	f := &Fake{}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.WaitFor(ctx, "STOPPING=1") }()

	_ = f.Ready()
	_ = f.Status("a\nb")
	_ = f.Reloading()
	_ = f.Stopping()
	if err := <-done; err != nil {
		t.Fatalf("WaitFor STOPPING=1: %v", err)
	}
	want := []string{"READY=1", "STATUS=a b", "RELOADING=1", "STOPPING=1"}
	got := f.Messages()
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("messages %q, want %q", got, want)
	}
	if f.Count("READY=1") != 1 || f.Count("WATCHDOG=1") != 0 {
		t.Fatalf("Count: READY=1 %d, WATCHDOG=1 %d", f.Count("READY=1"), f.Count("WATCHDOG=1"))
	}

	short, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if err := f.WaitFor(short, "WATCHDOG=1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitFor a message never sent: %v, want deadline exceeded", err)
	}

	f.Err = errors.New("boom")
	if err := f.Ready(); err == nil || f.Count("READY=1") != 2 {
		t.Fatalf("Fake.Err: got %v and %d READY=1, want the error and the message recorded", err, f.Count("READY=1"))
	}
}
