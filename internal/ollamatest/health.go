package ollamatest

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/internal/proctest"
)

// answers asks for one token of the tiny model within timeout.
func (i *Instance) answers(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stream := false
	err := i.Client().Generate(ctx, &api.GenerateRequest{
		Model: i.Model, Prompt: "hi", Stream: &stream,
		Options: map[string]any{"num_predict": 1},
	}, func(api.GenerateResponse) error { return nil })
	if err != nil {
		return fmt.Errorf("one-token generation: %w", err)
	}
	return nil
}

// checkShared makes sure a shared instance still generates before a test
// gets it, so that a runtime left stuck by one test (a runner that never
// releases its sequence after a cancellation has been seen with 0.17.4)
// fails that test's own checks rather than hanging every later test until
// the package times out. A stuck runner is sent SIGQUIT: the Go runtime
// prints every goroutine's stack into ollama serve's log (shown when a test
// fails), and the server starts a fresh runner on the next request.
func checkShared(t testing.TB, inst *Instance) { t.Helper(); checkAnswers(t, inst, 45*time.Second) }

// checkAnswers is checkShared with the time the first try is given.
func checkAnswers(t testing.TB, inst *Instance, within time.Duration) {
	t.Helper()
	err := inst.answers(within)
	if err == nil {
		return
	}
	for _, pid := range proctest.Children(inst.PID()) {
		_ = syscall.Kill(pid, syscall.SIGQUIT)
		_ = syscall.Kill(pid, syscall.SIGCONT) // in case it was stopped
	}
	if err2 := inst.answers(2 * time.Minute); err2 != nil {
		t.Fatalf("ollamatest: shared Ollama %s at %s stopped answering (%v) and did not recover after its runner was restarted (%v); log tail:\n%s",
			inst.Version, inst.URL, err, err2, inst.LogTail(32<<10))
	}
	t.Logf("ollamatest: shared Ollama %s at %s had stopped answering (%v); its runner was restarted. Runner stacks (log tail):\n%s",
		inst.Version, inst.URL, err, inst.LogTail(32<<10))
}
