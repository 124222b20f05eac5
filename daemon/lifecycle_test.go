package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"

	"go.uber.org/goleak"
)

// leakOptions make goleak report the goroutines a test leaves behind:
// those running when it started are not its own, nor are fasthttp's
// process-wide Date header clock (started once) and its worker pool
// cleaner, which sees the pool stopped only after its sleep
// (MaxIdleWorkerDuration, 10 s) and then ends, holding nothing of ours.
func leakOptions() []goleak.Option {
	return []goleak.Option{goleak.IgnoreCurrent(),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.updateServerDate.func1"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*workerPool).Start.func2")}
}

// noLeaks checks, once the test and its cleanups are done, that it left
// no goroutine behind.
func noLeaks(t *testing.T) {
	opts := leakOptions()
	t.Cleanup(func() { goleak.VerifyNone(t, opts...) })
}

// recorder notes the order in which components stopped.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// until returns a component run that waits for its stop, then records it.
func (r *recorder) until(name string) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		r.add(name)
		return nil
	}
}

// Shutdown goes phase by phase: nothing behind the API is told to stop
// while it drains, and the runtime goes last. In a synctest bubble
// "nothing has stopped yet" is a fact once every goroutine is blocked, not
// a guess after a sleep.
func TestGroupStopsPhaseByPhase(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		var rec recorder
		draining, drained := make(chan struct{}), make(chan struct{})
		g := group{log: slog.New(slog.DiscardHandler)}
		g.add(component{name: "runtime", phase: phaseRuntime, run: rec.until("runtime")})
		g.add(component{name: "agent", phase: phaseBack, run: rec.until("agent")})
		g.add(component{name: "metrics", phase: phaseBack, run: rec.until("metrics")})
		g.add(component{name: "api", phase: phaseFront, critical: true, run: func(ctx context.Context) error {
			<-ctx.Done()
			close(draining)
			<-drained
			rec.add("api")
			return nil
		}})
		g.add(component{name: "readiness", phase: phaseFront, run: rec.until("readiness")})

		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.run(ctx) }()
		synctest.Wait()
		if ev := rec.get(); len(ev) != 0 {
			t.Fatalf("stopped before being asked: %v", ev)
		}
		cancel()
		<-draining
		synctest.Wait()
		if ev := rec.get(); !slices.Equal(ev, []string{"readiness"}) {
			t.Fatalf("while the API drains, stopped: %v", ev)
		}
		close(drained)
		if err := <-done; err != nil {
			t.Fatalf("run: %v", err)
		}
		ev := rec.get()
		if len(ev) != 5 || ev[1] != "api" || ev[4] != "runtime" ||
			!slices.Contains(ev[2:4], "agent") || !slices.Contains(ev[2:4], "metrics") {
			t.Fatalf("stop order %v", ev)
		}
	})
}

// A critical component that ends on its own stops the node with its error;
// everything else is still stopped in order before run returns.
func TestGroupCriticalComponentStopsTheNode(t *testing.T) {
	noLeaks(t)
	var rec recorder
	failed := errors.New("accept: too many open files")
	g := group{log: slog.New(slog.DiscardHandler)}
	g.add(component{name: "deployment API", phase: phaseFront, critical: true, run: func(context.Context) error { return failed }})
	g.add(component{name: "agent", phase: phaseBack, run: rec.until("agent")})
	g.add(component{name: "runtime", phase: phaseRuntime, run: rec.until("runtime")})
	if err := g.run(context.Background()); !errors.Is(err, failed) {
		t.Fatalf("run: %v, want %v", err, failed)
	}
	if ev := rec.get(); !slices.Equal(ev, []string{"agent", "runtime"}) {
		t.Fatalf("stop order %v", ev)
	}
}

// Any other component that ends on its own is logged, and the node goes on
// until it is stopped.
func TestGroupLogsAComponentThatStops(t *testing.T) {
	noLeaks(t)
	synctest.Test(t, func(t *testing.T) {
		var logs bytes.Buffer
		var rec recorder
		g := group{log: slog.New(slog.NewTextHandler(&logs, nil))}
		g.add(component{name: "enforcement", phase: phaseBack, run: func(context.Context) error {
			return errors.New("enrollment refused")
		}})
		g.add(component{name: "watchdog", phase: phaseBack, run: func(context.Context) error { return nil }})
		g.add(component{name: "deployment API", phase: phaseFront, critical: true, run: rec.until("api")})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- g.run(ctx) }()
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("the node stopped with a non-critical component: %v", err)
		default:
		}
		if !strings.Contains(logs.String(), `msg="enforcement stopped" err="enrollment refused"`) || strings.Contains(logs.String(), "watchdog") {
			t.Fatalf("logs: %s", logs.String())
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("run: %v", err)
		}
		if ev := rec.get(); !slices.Equal(ev, []string{"api"}) {
			t.Fatalf("stopped: %v", ev)
		}
	})
}
