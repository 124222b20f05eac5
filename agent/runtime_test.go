package agent_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/internal/backoff"
)

// startRuntime runs a runtime concern over models in the bubble until the
// test ends.
func startRuntime(t *testing.T, models *fakeModels, bo backoff.Backoff) *agent.Runtime {
	t.Helper()
	r := agent.NewRuntime(models, agent.RuntimeConfig{Default: "default", Backoff: bo}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

// A model present is served as is, one missing is pulled (progress shown
// while it lasts); a revision that changes nothing about the model is in
// force at once.
func TestRuntimeServesTheOrderedModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		models := newFakeModels("default", "a")
		r := startRuntime(t, models, backoff.Backoff{Min: time.Second, Max: time.Second})
		synctest.Wait()
		if st := r.State(); st != (agent.RuntimeState{Model: "default"}) {
			t.Fatalf("at start: %+v (nothing ordered yet: no revision)", st)
		}
		r.Want(3, "")
		if st := r.State(); st.Revision != 3 || st.Model != "default" {
			t.Fatalf("no model ordered: %+v", st)
		}

		r.Want(4, "a")
		synctest.Wait()
		if st := r.State(); st != (agent.RuntimeState{Concern: agent.Concern{Revision: 4}, Model: "a"}) {
			t.Fatalf("a present model: %+v", st)
		}
		// A pull: its progress is the state while it lasts.
		models.set(func(f *fakeModels) { f.hold = make(chan struct{}) })
		changed := r.Changed()
		r.Want(5, "b")
		<-models.pulling
		synctest.Wait()
		select {
		case <-changed:
		default:
			t.Fatal("the pull's start was not announced")
		}
		st := r.State()
		if st.Revision != 4 || st.Model != "a" || st.Progress != (agent.Progress{Status: "pulling 6a0746a1ec1a", Completed: 50, Total: 100}) {
			t.Fatalf("while pulling: %+v", st)
		}
		// A revision that changed only keys while the pull runs: the model
		// ordered is still b, not served yet.
		r.Want(6, "b")
		if st := r.State(); st.Revision != 4 {
			t.Fatalf("revision moved before b was served: %+v", st)
		}
		models.set(func(f *fakeModels) { close(f.hold); f.hold = nil })
		synctest.Wait()
		if st := r.State(); st != (agent.RuntimeState{Concern: agent.Concern{Revision: 6}, Model: "b"}) {
			t.Fatalf("after the pull: %+v", st)
		}
		r.Want(7, "b")
		if st := r.State(); st.Revision != 7 {
			t.Fatalf("a keys-only revision: %+v", st)
		}
		if got := models.Serves(); !slices.Equal(got, []string{"default", "a", "b"}) {
			t.Fatalf("serves %v", got)
		}
	})
}

// A model that cannot be served keeps the previous one, says why, and is
// retried with backoff until it works; another order abandons it at once.
func TestRuntimeRetriesWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		models := newFakeModels("default")
		r := startRuntime(t, models, backoff.Backoff{Min: time.Second, Max: 4 * time.Second})
		synctest.Wait()
		models.set(func(f *fakeModels) { f.missing["ghost"] = true })
		start := time.Now()
		r.Want(2, "ghost")
		synctest.Wait()
		st := r.State()
		if st.Error != "pull model ghost: file does not exist" || st.Model != "default" || st.Revision != 0 || st.Progress != (agent.Progress{}) {
			t.Fatalf("failing model: %+v", st)
		}
		// Attempts at 0, 1, 3, 7, 11, 15 s: doubling to the 4 s cap.
		time.Sleep(15*time.Second + time.Millisecond)
		synctest.Wait()
		if n := len(models.Serves()) - 1; n != 6 {
			t.Fatalf("%d attempts in %v, want 6", n, time.Since(start))
		}
		// It becomes pullable: the next retry serves it.
		models.set(func(f *fakeModels) { delete(f.missing, "ghost") })
		time.Sleep(4 * time.Second)
		synctest.Wait()
		if st := r.State(); st != (agent.RuntimeState{Concern: agent.Concern{Revision: 2}, Model: "ghost"}) {
			t.Fatalf("after recovery: %+v", st)
		}

		// Another model ordered while one is failing: no wait for the
		// backoff, and the old error is gone.
		models.set(func(f *fakeModels) { f.fail["broken"] = errors.New("load: out of memory") })
		r.Want(3, "broken")
		synctest.Wait()
		if st := r.State(); st.Error != "load: out of memory" {
			t.Fatalf("broken: %+v", st)
		}
		n := len(models.Serves())
		r.Want(4, "default")
		synctest.Wait()
		if st := r.State(); st != (agent.RuntimeState{Concern: agent.Concern{Revision: 4}, Model: "default"}) || len(models.Serves()) != n+1 {
			t.Fatalf("back to default: %+v after %d serves", st, len(models.Serves())-n)
		}
	})
}

// A pull of a model no longer wanted is abandoned; a lost model is loaded
// again.
func TestRuntimeAbandonsAndReloads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		models := newFakeModels("default", "a")
		r := startRuntime(t, models, backoff.Backoff{Min: time.Second, Max: time.Second})
		synctest.Wait()
		models.set(func(f *fakeModels) { f.hold = make(chan struct{}) })
		r.Want(2, "slow")
		<-models.pulling
		models.set(func(f *fakeModels) { f.hold = nil })
		r.Want(3, "a")
		synctest.Wait()
		if st := r.State(); st != (agent.RuntimeState{Concern: agent.Concern{Revision: 3}, Model: "a"}) || models.Served() != "a" {
			t.Fatalf("after abandoning the pull: %+v", st)
		}
		r.Lost()
		synctest.Wait()
		if got := models.Serves(); !slices.Equal(got, []string{"default", "slow", "a", "a"}) {
			t.Fatalf("serves %v", got)
		}
		if st := r.State(); st.Revision != 3 || st.Error != "" {
			t.Fatalf("after the reload: %+v", st)
		}
	})
}
