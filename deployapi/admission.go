package deployapi

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
)

// errQueueFull is returned when every generation slot is busy and the
// waiting queue is at its bound; the API answers 429 with Retry-After.
var errQueueFull = errors.New("generation queue is full")

// limiter admits at most maxConcurrent generations at once, at most
// perKey of them for one API key, and lets at most maxQueue more wait for
// a slot. It is fair across keys, so one runaway key cannot starve the
// others:
//
//   - A freed slot goes to the waiting key that runs the fewest
//     generations, ties broken by which key was served longest ago (round
//     robin); within a key, requests run in arrival order. A key that
//     floods the node gets the slots no one else wants, and another key's
//     request runs as soon as any slot frees.
//   - The waiting room is shared, but when it is full a newcomer takes the
//     place of the newest waiter of the key with the most waiters (that
//     request gets the 429 instead) as long as that key has more waiters
//     than the newcomer's would, so a flood cannot keep other keys out of
//     the queue either.
//   - perKey (by default maxConcurrent: no cap) bounds one key's running
//     generations even when slots are free.
//
// The scheduling is work-conserving: with one key busy it gets every slot.
type limiter struct {
	maxConcurrent, perKey, maxQueue int

	mu      sync.Mutex
	running int
	waiting int
	keys    map[string]*keyState // keys running or waiting
	free    []*keyState          // forgotten states for reuse: a request costs no allocation
	seq     uint64               // counts grants and arrivals, for the round robin

	waitingGauge atomic.Int64 // waiting, for the metrics gauge without the lock
}

// keyState is one key's share of the limiter.
type keyState struct {
	running    int
	waiters    []*waiter // arrival order
	lastServed uint64    // the grant count when it last got a slot; 0 never
	arrived    uint64    // order of arrival among the keys, for ties
}

// before reports whether ks goes before o for a free slot: fewer running,
// then served longer ago, then arrived earlier.
func (ks *keyState) before(o *keyState) bool {
	if ks.running != o.running {
		return ks.running < o.running
	}
	if ks.lastServed != o.lastServed {
		return ks.lastServed < o.lastServed
	}
	return ks.arrived < o.arrived
}

type waiter struct {
	ready chan error // buffered 1: nil when granted, errQueueFull when pushed out
	n     int        // slots wanted, granted together
}

func newLimiter(maxConcurrent, perKey, maxQueue int) *limiter {
	if perKey <= 0 || perKey > maxConcurrent {
		perKey = maxConcurrent
	}
	return &limiter{maxConcurrent: maxConcurrent, perKey: perKey, maxQueue: maxQueue, keys: map[string]*keyState{}}
}

// acquire takes a slot for key, waiting in the bounded queue if needed. It
// fails with errQueueFull at once when the queue is full (or later, when
// pushed out of it), or with ctx's error if the caller goes away while
// waiting.
func (l *limiter) acquire(ctx context.Context, key string) error { return l.acquireN(ctx, key, 1) }

// acquireN is acquire for n slots at once (a request with n choices),
// 1 ≤ n ≤ maxSlots(): they are granted together or not at all, so two
// multi-slot requests never each hold part of what they need while
// waiting for the rest. A waiter for n slots at the head of the fair
// order holds back the waiters behind it until n slots are free, so it is
// not starved by single-slot requests. Each slot is released on its own
// (release), as its generation ends.
func (l *limiter) acquireN(ctx context.Context, key string, n int) error {
	l.mu.Lock()
	ks := l.keys[key]
	if ks == nil {
		ks = l.newKeyState()
		l.keys[key] = ks
	}
	// Free slots may be kept for a waiter that needs more of them (a
	// multi-slot request at the head of the fair order): then the newcomer
	// waits behind it. Waiters held back only by their key's cap keep
	// nothing from it.
	if l.running+n <= l.maxConcurrent && ks.running+n <= l.perKey && len(ks.waiters) == 0 && l.fairest() == nil {
		l.grant(ks, n)
		l.mu.Unlock()
		return nil
	}
	if l.waiting >= l.maxQueue && !l.pushOut(ks) {
		l.forget(key, ks)
		l.mu.Unlock()
		return errQueueFull
	}
	w := &waiter{ready: make(chan error, 1), n: n}
	ks.waiters = append(ks.waiters, w)
	l.setWaiting(l.waiting + 1)
	l.dispatch() // slots may be free for it, behind the kept ones
	l.mu.Unlock()
	return l.wait(ctx, key, ks, w)
}

// wait waits for w, queued for key (ks), to be granted or refused, or for
// ctx to end; then it holds nothing.
func (l *limiter) wait(ctx context.Context, key string, ks *keyState, w *waiter) error {
	select {
	case err := <-w.ready:
		return err
	case <-ctx.Done():
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case err := <-w.ready: // decided while we were leaving
		if err == nil {
			l.releaseLocked(key, ks, w.n)
		}
	default:
		ks.waiters = removeWaiter(ks.waiters, w)
		l.setWaiting(l.waiting - 1)
		l.forget(key, ks)
	}
	return ctx.Err()
}

// requeue gives back one of key's slots and waits for one again, for a
// request that runs in steps (an embeddings batch in several runtime
// calls): the freed slot goes to whoever the fair order names first, so
// other requests get in between the steps, and the request takes a slot
// back at once when no one else wants it. It waits at the head of its
// key's waiters, and is never refused for a full waiting room: it was
// admitted already. On an error (ctx ended) it holds no slot.
func (l *limiter) requeue(ctx context.Context, key string) error {
	l.mu.Lock()
	ks := l.keys[key]
	l.running--
	ks.running--
	l.dispatch()
	if l.running < l.maxConcurrent && ks.running < l.perKey && len(ks.waiters) == 0 && l.fairest() == nil {
		l.grant(ks, 1)
		l.mu.Unlock()
		return nil
	}
	w := &waiter{ready: make(chan error, 1), n: 1}
	ks.waiters = append(ks.waiters, nil)
	copy(ks.waiters[1:], ks.waiters)
	ks.waiters[0] = w
	l.setWaiting(l.waiting + 1)
	l.dispatch()
	l.mu.Unlock()
	return l.wait(ctx, key, ks, w)
}

// release frees key's slot and hands it on.
func (l *limiter) release(key string) {
	l.mu.Lock()
	l.releaseLocked(key, l.keys[key], 1)
	l.mu.Unlock()
}

// maxSlots is the most slots one request may ask for: more could never
// be granted.
func (l *limiter) maxSlots() int { return min(l.maxConcurrent, l.perKey) }

func (l *limiter) releaseLocked(key string, ks *keyState, n int) {
	l.running -= n
	ks.running -= n
	l.dispatch()
	l.forget(key, ks)
}

// grant gives ks n slots. Callers hold mu.
func (l *limiter) grant(ks *keyState, n int) {
	l.running += n
	ks.running += n
	l.seq++
	ks.lastServed = l.seq
}

// dispatch hands free slots to waiters, fairest first. Callers hold mu.
func (l *limiter) dispatch() {
	for l.running < l.maxConcurrent && l.waiting > 0 {
		next := l.fairest()
		if next == nil {
			return // every waiting key is at its cap
		}
		w := next.waiters[0]
		if l.running+w.n > l.maxConcurrent {
			return // the fairest waiter wants more slots than are free: they are kept for it
		}
		next.waiters = next.waiters[1:]
		l.setWaiting(l.waiting - 1)
		l.grant(next, w.n)
		w.ready <- nil
	}
}

// fairest returns the waiting key that goes first for free slots, nil if
// every waiting key is at its cap. Callers hold mu. The scan is over the
// keys with waiters, at most maxQueue of them.
func (l *limiter) fairest() *keyState {
	if l.waiting == 0 {
		return nil
	}
	var next *keyState
	for _, ks := range l.keys {
		if len(ks.waiters) == 0 || ks.running+ks.waiters[0].n > l.perKey {
			continue
		}
		if next == nil || ks.before(next) {
			next = ks
		}
	}
	return next
}

// pushOut makes room in a full queue for a waiter of ks by refusing the
// newest waiter of the key with the most waiters, if that key has more
// than ks would. Callers hold mu.
func (l *limiter) pushOut(ks *keyState) bool {
	var victim *keyState
	for _, k := range l.keys {
		if victim == nil || len(k.waiters) > len(victim.waiters) ||
			(len(k.waiters) == len(victim.waiters) && k.arrived < victim.arrived) {
			victim = k
		}
	}
	if victim == nil || victim == ks || len(victim.waiters) <= len(ks.waiters)+1 {
		return false
	}
	w := victim.waiters[len(victim.waiters)-1]
	victim.waiters = victim.waiters[:len(victim.waiters)-1]
	l.setWaiting(l.waiting - 1)
	w.ready <- errQueueFull
	return true
}

func (l *limiter) newKeyState() *keyState {
	l.seq++
	if n := len(l.free); n > 0 {
		ks := l.free[n-1]
		l.free = l.free[:n-1]
		*ks = keyState{waiters: ks.waiters[:0], arrived: l.seq}
		return ks
	}
	return &keyState{arrived: l.seq}
}

// forget drops a key that neither runs nor waits. Callers hold mu.
func (l *limiter) forget(key string, ks *keyState) {
	if ks.running == 0 && len(ks.waiters) == 0 {
		delete(l.keys, key)
		if len(l.free) < 64 {
			l.free = append(l.free, ks)
		}
	}
}

func (l *limiter) setWaiting(n int) {
	l.waiting = n
	l.waitingGauge.Store(int64(n))
}

func removeWaiter(ws []*waiter, w *waiter) []*waiter {
	for i, x := range ws {
		if x == w {
			return append(ws[:i], ws[i+1:]...)
		}
	}
	return ws
}

// active is the number of generations holding a slot.
func (l *limiter) active() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.running
}

// queued is the number of requests waiting for a slot.
func (l *limiter) queued() int { return int(l.waitingGauge.Load()) }
