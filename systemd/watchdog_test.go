package systemd

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
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
		if got := sock.Next(t, 5*time.Second); got != "WATCHDOG=1" {
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
	setWatchdogEnv(t, 200*time.Millisecond)
	synctest.Test(t, func(t *testing.T) {
		f := &Fake{}
		var probes atomic.Int64
		startWatchdog(t, f, func(ctx context.Context) error {
			probes.Add(1)
			<-ctx.Done() // a request that never gets an answer
			return ctx.Err()
		})
		// Five watchdog timeouts: a live loop would have pinged ten times.
		time.Sleep(time.Second)
		synctest.Wait()
		if msgs := f.Messages(); len(msgs) != 0 {
			t.Fatalf("got %q while the probe was hanging, want no notification", msgs)
		}
		// A probe every 100 ms, each given up after 50 ms.
		if n := probes.Load(); n < 10 {
			t.Fatalf("only %d probes in 1s; the loop must keep probing", n)
		}
	})
}

// A probe that ignores its context blocks the loop: no pings until it
// returns, then pings resume.
func TestWatchdogProbeIgnoringContextBlocksPings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &Fake{}
		stuck := make(chan struct{})
		release := sync.OnceFunc(func() { close(stuck) })
		var calls atomic.Int64
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- WatchdogEvery(ctx, f, 100*time.Millisecond, func(context.Context) error {
				if calls.Add(1) == 1 {
					<-stuck
				}
				return nil
			}, quietLog())
		}()
		defer func() {
			release()
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(500 * time.Millisecond)
		synctest.Wait()
		if n := f.Count("WATCHDOG=1"); n != 0 || calls.Load() != 1 {
			t.Fatalf("%d pings and %d probes while the first probe was stuck, want 0 and 1", n, calls.Load())
		}
		release()
		synctest.Wait()
		if n := f.Count("WATCHDOG=1"); n == 0 {
			t.Fatal("no ping right after the probe returned")
		}
		before := f.Count("WATCHDOG=1")
		time.Sleep(time.Second)
		// One every 50 ms (the one due at the second's end may or may not
		// be in yet).
		if n := f.Count("WATCHDOG=1") - before; n < 19 || n > 20 {
			t.Fatalf("%d pings in the second after, want one every 50 ms", n)
		}
	})
}

func TestWatchdogResumesAfterProbeRecovers(t *testing.T) {
	setWatchdogEnv(t, 100*time.Millisecond)
	synctest.Test(t, func(t *testing.T) {
		f := &Fake{}
		var calls atomic.Int64
		start := time.Now()
		startWatchdog(t, f, func(context.Context) error {
			if calls.Add(1) <= 3 {
				return errors.New("503 from /healthz")
			}
			return nil
		})
		if err := f.WaitFor(context.Background(), "WATCHDOG=1"); err != nil {
			t.Fatal(err)
		}
		// Probes every 50 ms: the fourth, the first to succeed, at 150 ms.
		if c, d := calls.Load(), time.Since(start); c != 4 || d != 150*time.Millisecond {
			t.Fatalf("first ping after %d probes at %v, want after 4 at 150ms", c, d)
		}
	})
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
