package ollama

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/llm"
)

// TestRealCancelStopsGeneration proves that stopping a stream stops the
// model runner within 100 ms: while a long generation runs, the runner burns
// CPU; from 100 ms after the stop on, over a window at least as long as one
// in which it burned 10+ ticks while generating, it burns (almost) none.
func TestRealCancelStopsGeneration(t *testing.T) {
	ollama.ForEach(t, testRealCancelStopsGeneration)
}

func testRealCancelStopsGeneration(t *testing.T, inst *ollamatest.Instance) {
	b := realBackend(t, inst)
	for _, how := range []string{"context", "close"} {
		t.Run(how, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, err := b.Chat(ctx, &llm.Request{Messages: userSays("go on"), Options: llm.Options{MaxTokens: ptr(20000)}})
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

			stopped := ollamatest.ExpectRunnerStops(t, inst.PID(), func() {
				if how == "context" {
					cancel()
				} else {
					s.Close()
				}
			})

			e := <-ended
			if e.tokens == 0 || e.err == nil || e.at.Sub(stopped) > time.Second {
				t.Fatalf("stream: %d tokens, ended %v after the stop with %v", e.tokens, e.at.Sub(stopped), e.err)
			}
			if how == "context" && !errors.Is(e.err, context.Canceled) {
				t.Fatalf("Recv error %v, want context.Canceled", e.err)
			}
			t.Logf("%d tokens before the stop", e.tokens)
		})
	}
	// The runner is still usable after the stops, unless Ollama itself lost
	// a parallel slot (ollama/ollama#17131: a client leaving a stream at the
	// wrong moment does it, on both versions). Then it answers no one, not
	// even a request of its own, and the next test's Get restarts it; a
	// runtime that answers directly but not through the backend fails.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := b.Chat(ctx, &llm.Request{Messages: userSays("tell me a story"), Options: llm.Options{MaxTokens: ptr(5)}})
	if err != nil {
		if direct := inst.Answers(10 * time.Second); direct != nil {
			t.Logf("after the stops Ollama answers no one (through the backend: %v; directly: %v): it lost a slot, ollama/ollama#17131", err, direct)
			return
		}
		t.Fatalf("after cancellation: %v, though Ollama answers a request of its own", err)
	}
	defer s.Close()
	if r := collect(s); r.err != nil || r.final.CompletionTokens != 5 {
		t.Fatalf("after cancellation: %+v, %v", r.final, r.err)
	}
}

// TestRealAbandonedRequestEndsOnTheRuntime: a request abandoned before its
// first token (here by a first-byte timeout far shorter than the prompt
// takes) reports RuntimeDone only once the runner has stopped: from then
// on it burns no CPU.
func TestRealAbandonedRequestEndsOnTheRuntime(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		b := realBackend(t, inst)
		generate(t, b, llm.Options{MaxTokens: ptr(1)}) // loaded
		nb := *b
		nb.cfg.FirstByteTimeout = time.Microsecond
		nb.watch = newWatch(nb.cfg.FirstByteTimeout, 0, nil, testLogger(t)) // the deadlines' timer
		slow := &nb
		_, err := slow.Chat(context.Background(), &llm.Request{Messages: userSays(strings.Repeat("go on and on ", 150)), Options: llm.Options{MaxTokens: ptr(20000)}})
		var ab llm.Abandoned
		if !errors.Is(err, llm.ErrTimeout) || !errors.As(err, &ab) {
			t.Fatalf("err = %v, want an abandoned timeout", err)
		}
		select {
		case <-ab.RuntimeDone():
		case <-time.After(time.Minute):
			t.Fatal("not done within a minute")
		}
		before, _ := inst.RunnerCPUTicks()
		time.Sleep(500 * time.Millisecond) // the window CPU use is measured over
		if after, _ := inst.RunnerCPUTicks(); after-before > 2 {
			t.Fatalf("runner used %d ticks after RuntimeDone", after-before)
		}
	})
}
