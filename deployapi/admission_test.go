package deployapi

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
)

// acquirer runs acquire calls in goroutines of a synctest bubble and
// records which key got a slot. Each step is followed by synctest.Wait, so
// what a step decided is recorded before the next one.
type acquirer struct {
	l       *limiter
	granted chan string
	refused chan string
	cancels []context.CancelFunc
}

// newAcquirer returns an acquirer over l whose waiters are abandoned when
// the test ends (a bubble must end with no goroutine blocked).
func newAcquirer(t *testing.T, l *limiter) *acquirer {
	a := &acquirer{l: l, granted: make(chan string, 100), refused: make(chan string, 100)}
	t.Cleanup(func() {
		for _, c := range a.cancels {
			c()
		}
		synctest.Wait()
	})
	return a
}

// try starts an acquire for key; cancel abandons it.
func (a *acquirer) try(key string) (cancel context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancels = append(a.cancels, cancel)
	go func() {
		switch err := a.l.acquire(ctx, key); {
		case err == nil:
			a.granted <- key
		case errors.Is(err, errQueueFull):
			a.refused <- key
		}
	}()
	synctest.Wait()
	return cancel
}

// drain returns the keys recorded on ch since the last call.
func drain(ch chan string) []string {
	synctest.Wait()
	var out []string
	for {
		select {
		case k := <-ch:
			out = append(out, k)
		default:
			return out
		}
	}
}

// A key that floods the node gets the slots nobody else wants; another
// key's request takes the next slot that frees, ahead of the flood's
// queue, and keys alternate from then on.
func TestLimiterIsFairAcrossKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(2, 0, 8)
		a := newAcquirer(t, l)
		for range 6 {
			a.try("flood")
		}
		if got := drain(a.granted); !slices.Equal(got, []string{"flood", "flood"}) || l.queued() != 4 {
			t.Fatalf("granted %v, %d queued", got, l.queued())
		}
		a.try("polite")
		a.try("polite")
		if got := drain(a.granted); len(got) != 0 {
			t.Fatalf("granted %v with every slot busy", got)
		}
		// One of the flood's generations ends: the polite key, running
		// nothing, goes first although the flood queued earlier.
		l.release("flood")
		if got := drain(a.granted); !slices.Equal(got, []string{"polite"}) {
			t.Fatalf("after a release: %v", got)
		}
		// Both keys run one now: one that ends hands its slot to the other
		// key, whichever key it was.
		l.release("polite")
		if got := drain(a.granted); !slices.Equal(got, []string{"polite"}) {
			t.Fatalf("polite ended with both running one: %v", got)
		}
		l.release("flood")
		if got := drain(a.granted); !slices.Equal(got, []string{"flood"}) {
			t.Fatalf("the flood ended with both running one: %v", got)
		}
		// The polite key has no waiter left: the flood gets what frees.
		l.release("polite")
		l.release("flood")
		if got := drain(a.granted); !slices.Equal(got, []string{"flood", "flood"}) || l.queued() != 1 {
			t.Fatalf("granted %v, %d queued", got, l.queued())
		}
	})
}

// A full waiting room does not keep other keys out: a newcomer takes the
// place of the newest waiter of the key with the most waiters.
func TestLimiterPushesOutTheFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(1, 0, 3)
		a := newAcquirer(t, l)
		for range 4 { // one runs, three wait
			a.try("flood")
		}
		a.try("flood")
		if got := drain(a.refused); !slices.Equal(got, []string{"flood"}) {
			t.Fatalf("the flood's 5th request: refused %v", got)
		}
		a.try("polite")
		if got := drain(a.refused); !slices.Equal(got, []string{"flood"}) || l.queued() != 3 {
			t.Fatalf("polite key against a full queue: refused %v, %d queued", got, l.queued())
		}
		a.try("other")
		if got := drain(a.refused); !slices.Equal(got, []string{"flood"}) {
			t.Fatalf("a third key: refused %v", got)
		}
		// Now every key has one waiter: the next newcomer of any of them
		// is refused itself.
		a.try("polite")
		if got := drain(a.refused); !slices.Equal(got, []string{"polite"}) {
			t.Fatalf("no key has more waiters than the newcomer's: refused %v", got)
		}
		drain(a.granted)
		for _, want := range []string{"polite", "other", "flood"} {
			l.release(map[string]string{"polite": "flood", "other": "polite", "flood": "other"}[want])
			if got := drain(a.granted); !slices.Equal(got, []string{want}) {
				t.Fatalf("granted %v, want %s", got, want)
			}
		}
	})
}

// perKey caps one key's generations even with slots free; a waiter that
// leaves gives its place back.
func TestLimiterPerKeyCapAndCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(4, 2, 4)
		a := newAcquirer(t, l)
		a.try("k")
		a.try("k")
		cancel := a.try("k")
		if got := drain(a.granted); !slices.Equal(got, []string{"k", "k"}) || l.active() != 2 || l.queued() != 1 {
			t.Fatalf("granted %v, %d active, %d queued", got, l.active(), l.queued())
		}
		a.try("j")
		if got := drain(a.granted); !slices.Equal(got, []string{"j"}) {
			t.Fatalf("another key with slots free: %v", got)
		}
		cancel()
		synctest.Wait()
		if l.queued() != 0 {
			t.Fatalf("%d queued after the waiter left", l.queued())
		}
		for _, k := range []string{"k", "k", "j"} {
			l.release(k)
		}
		if l.active() != 0 || len(l.keys) != 0 {
			t.Fatalf("%d active, %d keys tracked after everything ended", l.active(), len(l.keys))
		}
	})
}
