package ollamatest

import (
	"context"
	"fmt"
	"time"

	"github.com/ollama/ollama/api"
)

// answers asks for one token of the tiny model within timeout.
// Answers reports whether the instance generates one token within
// timeout, asked directly (not through hearth): a test tells a runtime
// that answers nobody from one that fails only hearth's client.
func (i *Instance) Answers(timeout time.Duration) error { return i.answers(timeout) }

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

// Budgets of the check before a test gets a shared instance: its first
// one-token generation (the tiny model answers in milliseconds; the rest
// is for a loaded machine and the model's first load; a runtime that is
// only slow costs a restart, not a failure), and the one after a restart.
const (
	checkWithin   = 20 * time.Second
	restartWithin = 2 * time.Minute
)

// ensureAnswers makes sure the instance still generates, so that a
// runtime left stuck by one test is not handed to the next ones, which
// would each wait for it until the package times out. Both Ollama versions
// of the matrix get stuck so: a client that leaves a stream at the wrong
// moment costs the model one of its parallel slots for good
// (ollama/ollama#17131; 0.17.4 has one slot, 0.9.6 two on a CPU), and
// every later request waits for a slot. A stuck server is restarted
// whole (restart: its stacks and its runners' go to the log first):
// killing the runner does not do, since the lost slot is the server's and
// comes back only with a runner the server loads once no request holds
// the old one, and requests waiting for the slot hold it.
//
// stuck is why it had to be restarted (nil if it answered); err says that
// it still does not answer.
func (i *Instance) ensureAnswers(within time.Duration) (stuck, err error) {
	stuck = i.answers(within)
	if stuck == nil {
		return nil, nil
	}
	if err := i.restart(); err != nil {
		return stuck, fmt.Errorf("ollama %s at %s stopped answering (%v) and could not be restarted: %w", i.Version, i.URL, stuck, err)
	}
	if err := i.answers(restartWithin); err != nil {
		return stuck, fmt.Errorf("ollama %s at %s stopped answering (%v) and did not answer after a restart either (%v)", i.Version, i.URL, stuck, err)
	}
	return stuck, nil
}
