// Package backoff computes the pauses between retries: exponential from a
// minimum to a cap, optionally jittered, and resettable once things work
// again. The node agent, the Ollama supervisor, model warm-up and the
// accept loop all retry this way.
//
// It is hand-written rather than taken from a library (cenkalti/backoff is
// the usual one) because the library draws jitter from the global random
// source, which tests cannot pin, gives up after 15 minutes unless told
// otherwise, and would be a dependency for twenty lines.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is a sequence of pauses: Min, 2·Min, 4·Min, … up to Max. The zero
// value pauses 0 every time; set Min and Max. A Backoff is not safe for
// concurrent use: give each retry loop its own.
type Backoff struct {
	Min, Max time.Duration
	// Jitter draws each pause uniformly from [d/2, d] ("equal jitter")
	// instead of d, so that many clients that failed together do not retry
	// in lockstep, while the pause still grows.
	Jitter bool
	// Rand returns a uniform number in [0, n); nil is math/rand/v2's
	// Int64N. Tests set it to pin the jitter.
	Rand func(n int64) int64

	cur time.Duration
}

// Next returns the pause before the next attempt and moves the sequence on.
func (b *Backoff) Next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.Min
	case b.cur > b.Max/2: // doubling would pass the cap (or overflow)
		b.cur = b.Max
	default:
		b.cur *= 2
	}
	b.cur = max(min(b.cur, b.Max), b.Min)
	if !b.Jitter || b.cur < 2 {
		return b.cur
	}
	draw := b.Rand
	if draw == nil {
		draw = rand.Int64N
	}
	half := b.cur / 2
	return half + time.Duration(draw(int64(b.cur-half)+1))
}

// Reset starts the sequence over at Min, after an attempt that succeeded.
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep pauses for d, or less if ctx ends first; it then returns ctx's error.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
