package ollama

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/runtime"
)

// runnerTicks is the model runners' CPU time so far; see
// ollamatest.RunnerCPUTicks.
func runnerTicks(t *testing.T, parent int) (ticks int64, runners int) {
	t.Helper()
	return ollamatest.RunnerCPUTicks(parent)
}

// TestRealCancelStopsGeneration proves that stopping a stream stops the
// model runner within 100 ms: while a long generation runs, the runner burns
// CPU; from 100 ms after the stop on, over a window at least as long as one
// in which it burned 10+ ticks while generating, it burns (almost) none.
func TestRealCancelStopsGeneration(t *testing.T) {
	inst := ollama.Get(t)
	b := realBackend(t, inst)
	for _, how := range []string{"context", "close"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := b.Chat(ctx, &runtime.Request{Messages: userSays("go on"), Options: runtime.Options{MaxTokens: ptr(20000)}})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()

			// Keep reading, so the runner is never held back by a
			// full connection.
			type end struct {
				tokens int
				err    error
				at     time.Time
			}
			ended := make(chan end, 1)
			go func() {
				n := 0
				for {
					ev, err := s.Recv()
					if err != nil {
						ended <- end{n, err, time.Now()}
						return
					}
					if ev.Done {
						ended <- end{n, errors.New("generation finished before it was stopped"), time.Now()}
						return
					}
					n++
				}
			}()

			// Measure how long the runner needs for 10 ticks of CPU
			// while it generates.
			start, runners := runnerTicks(t, inst.PID())
			if runners == 0 {
				t.Fatal("no ollama runner process found")
			}
			t0 := time.Now()
			for {
				now, _ := runnerTicks(t, inst.PID())
				if now-start >= 10 {
					break
				}
				if time.Since(t0) > 20*time.Second {
					t.Fatalf("runner used only %d ticks in 20s while generating", now-start)
				}
				time.Sleep(10 * time.Millisecond)
			}
			busy := time.Since(t0)
			window := max(busy, 500*time.Millisecond)

			stopped := time.Now()
			if how == "context" {
				cancel()
			} else {
				s.Close()
			}
			time.Sleep(100*time.Millisecond - time.Since(stopped))
			after, _ := runnerTicks(t, inst.PID())
			time.Sleep(window)
			later, _ := runnerTicks(t, inst.PID())
			if used := later - after; used > 2 {
				t.Fatalf("runner used %d ticks in the %v after the stop (+100ms); it used 10 in %v while generating", used, window, busy)
			}

			e := <-ended
			if e.tokens == 0 || e.err == nil || e.at.Sub(stopped) > time.Second {
				t.Fatalf("stream: %d tokens, ended %v after the stop with %v", e.tokens, e.at.Sub(stopped), e.err)
			}
			if how == "context" && !errors.Is(e.err, context.Canceled) {
				t.Fatalf("Recv error %v, want context.Canceled", e.err)
			}
			t.Logf("%d tokens before the stop; idle window %v", e.tokens, window)
		})
	}
	// The runner is still usable after the stops.
	_, final := generate(t, b, runtime.Options{MaxTokens: ptr(5)})
	if final.CompletionTokens != 5 {
		t.Fatalf("after cancellation: %+v", final)
	}
}
