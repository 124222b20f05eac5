package systemd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startWatchdog runs Watchdog in the background and returns a stop function
// that cancels it and waits for it to return.
func startWatchdog(t *testing.T, n Notifier, probe func(context.Context) error) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Watchdog(ctx, n, probe, quietLog()) }()
	stopped := false
	stop = func() error {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Watchdog did not return after its context ended")
			return nil
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func setWatchdogEnv(t *testing.T, timeout time.Duration) {
	t.Setenv("WATCHDOG_USEC", strconv.FormatInt(timeout.Microseconds(), 10))
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
}

func TestWatchdogPingsWhileProbeSucceeds(t *testing.T) {
	sock := newNotifySocket(t)
	setWatchdogEnv(t, 200*time.Millisecond)
	var probes atomic.Int64
	stop := startWatchdog(t, SdNotifier{}, func(ctx context.Context) error {
		probes.Add(1)
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("probe has no deadline")
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		if got := sock.next(5 * time.Second); got != "WATCHDOG=1" {
			t.Fatalf("notification %d: got %q, want WATCHDOG=1", i, got)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Watchdog returned %v after cancel, want nil", err)
	}
	if probes.Load() < 3 {
		t.Fatalf("%d probes for 3 pings; every ping must follow a probe", probes.Load())
	}
}

// A hung daemon must miss its pings: the probe never succeeds, so systemd's
// timer runs out and it restarts the service.
func TestWatchdogHungProbeWithholdsPings(t *testing.T) {
	sock := newNotifySocket(t)
	setWatchdogEnv(t, 200*time.Millisecond)
	var probes atomic.Int64
	startWatchdog(t, SdNotifier{}, func(ctx context.Context) error {
		probes.Add(1)
		<-ctx.Done() // a request that never gets an answer
		return ctx.Err()
	})
	// Five watchdog timeouts: a live loop would have pinged about ten times.
	if msg, ok := sock.tryNext(time.Second); ok {
		t.Fatalf("got %q while the probe was hanging, want no notification", msg)
	}
	if probes.Load() < 2 {
		t.Fatalf("only %d probes ran; the loop must keep probing", probes.Load())
	}
}

// A probe that ignores its context blocks the loop: no pings until it
// returns, then pings resume.
func TestWatchdogProbeIgnoringContextBlocksPings(t *testing.T) {
	f := &Fake{}
	release := make(chan struct{})
	var calls atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- WatchdogEvery(ctx, f, 100*time.Millisecond, func(context.Context) error {
			if calls.Add(1) == 1 {
				<-release
			}
			return nil
		}, quietLog())
	}()
	time.Sleep(500 * time.Millisecond)
	if n := f.Count("WATCHDOG=1"); n != 0 {
		t.Fatalf("%d pings while the probe was stuck, want 0", n)
	}
	close(release)
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := f.WaitFor(wctx, "WATCHDOG=1"); err != nil {
		t.Fatalf("no ping after the probe returned: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestWatchdogResumesAfterProbeRecovers(t *testing.T) {
	f := &Fake{}
	setWatchdogEnv(t, 100*time.Millisecond)
	var calls atomic.Int64
	startWatchdog(t, f, func(context.Context) error {
		if calls.Add(1) <= 3 {
			return errors.New("503 from /healthz")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.WaitFor(ctx, "WATCHDOG=1"); err != nil {
		t.Fatal(err)
	}
	if c := calls.Load(); c < 4 {
		t.Fatalf("pinged after %d probes; the first three failed", c)
	}
}

func TestWatchdogDisabled(t *testing.T) {
	for name, env := range map[string][2]string{
		"no WATCHDOG_USEC":    {"", ""},
		"for another process": {"200000", strconv.Itoa(os.Getpid() + 1)},
	} {
		t.Run(name, func(t *testing.T) {
			t.Setenv("WATCHDOG_USEC", env[0])
			t.Setenv("WATCHDOG_PID", env[1])
			f := &Fake{}
			probed := false
			err := Watchdog(context.Background(), f, func(context.Context) error { probed = true; return nil }, quietLog())
			if err != nil || probed || len(f.Messages()) != 0 {
				t.Fatalf("got err=%v probed=%v messages=%q, want an immediate nil return and nothing sent", err, probed, f.Messages())
			}
		})
	}
}

func TestWatchdogRejectsBadSettings(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "soon")
	t.Setenv("WATCHDOG_PID", "")
	if err := Watchdog(context.Background(), &Fake{}, func(context.Context) error { return nil }, quietLog()); err == nil {
		t.Fatal("WATCHDOG_USEC=soon accepted")
	}
	if err := WatchdogEvery(context.Background(), &Fake{}, 0, func(context.Context) error { return nil }, quietLog()); err == nil {
		t.Fatal("zero timeout accepted")
	}
}
