package daemon

import (
	"context"
	"errors"
	"sync/atomic"
)

// errQueueFull is returned when every generation slot is busy and the
// waiting queue is at its bound; the API answers 429 with Retry-After.
var errQueueFull = errors.New("generation queue is full")

// limiter admits at most cap(slots) concurrent generations and lets at most
// maxQueue more wait for a slot. Waiters are served in arrival order (Go
// channel senders queue FIFO), so a burst does not starve early callers.
type limiter struct {
	slots    chan struct{}
	waiting  atomic.Int64
	maxQueue int64
}

func newLimiter(maxConcurrent, maxQueue int) *limiter {
	return &limiter{slots: make(chan struct{}, maxConcurrent), maxQueue: int64(maxQueue)}
}

// acquire takes a slot, waiting in the bounded queue if needed. It fails with
// errQueueFull at once when the queue is full, or with ctx's error if the
// caller goes away while waiting.
func (l *limiter) acquire(ctx context.Context) error {
	select {
	case l.slots <- struct{}{}:
		return nil
	default:
	}
	if l.waiting.Add(1) > l.maxQueue {
		l.waiting.Add(-1)
		return errQueueFull
	}
	defer l.waiting.Add(-1)
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l *limiter) release() { <-l.slots }

// active is the number of generations holding a slot.
func (l *limiter) active() int { return len(l.slots) }

// queued is the number of requests waiting for a slot.
func (l *limiter) queued() int { return int(l.waiting.Load()) }
