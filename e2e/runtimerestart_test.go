package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// An Ollama restarted under hearthd by its operator (hearthd does not
// supervise it: --ollama-url) costs clients nothing once /readyz answers
// again: the connections hearthd kept to the old process are closed, and a
// generation that finds one closed goes out again on a new one rather than
// failing with 503.
func TestRuntimeRestartCostsNoRequest(t *testing.T) {
	inst := ollamatest.Start(t)
	h := attachedTo(t, inst)
	c := h.client(h.secret)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// Streams side by side, so hearthd keeps several connections to the
	// runtime, each a stale one after the restart.
	streams := func(round string, n int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				s := c.Chat.Completions.NewStreaming(ctx, userParams(inst.Model, "Count to ten.", 8))
				chunks := 0
				for s.Next() {
					chunks++
				}
				if err := s.Err(); err != nil || chunks == 0 {
					errs <- fmt.Errorf("%s, stream %d: %d chunks, %v", round, i, chunks, err)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	streams("before the restart", 6)
	if err := inst.Restart(); err != nil {
		t.Fatal(err)
	}
	h.waitReady(2 * time.Minute)
	for round := range 3 {
		streams(fmt.Sprintf("after the restart, round %d", round), 6)
	}
}
