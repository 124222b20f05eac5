package apikeys

import (
	"math"
	"sync"
	"time"
)

// Quota is what a key's rate limits say about one request, in the terms of
// OpenAI's x-ratelimit-* headers.
type Quota struct {
	// Allowed reports whether the request may run. When it may not,
	// RetryAfter is how long until it would.
	Allowed    bool
	RetryAfter time.Duration
	// Requests and Tokens are the two per-minute limits; a zero Limit is
	// unlimited (and gets no headers). They are what is left after the
	// request and its reservation.
	Requests, Tokens Window
	// Reserved is how many tokens an allowed request holds of the key's
	// tokens per minute until Release gives them back.
	Reserved int64
}

// Limited reports whether the key has a limit at all.
func (q Quota) Limited() bool { return q.Requests.Limit > 0 || q.Tokens.Limit > 0 }

// Window is one per-minute limit as the headers show it: the limit, what
// is left of it now, and how long until it is whole again.
type Window struct {
	Limit, Remaining int64
	Reset            time.Duration
}

// limiter enforces a key's requests_per_minute and tokens_per_minute. Each
// is a token bucket holding up to a minute's worth, refilled continuously
// (as OpenAI's limits behave: using half the limit leaves the other half
// now and the whole of it a minute later).
//
// A request is admitted while a whole request and a whole token are left,
// and reserves its estimated tokens (prompt and most output, at most the
// whole limit) at once, so requests that arrive together cannot all start
// on the same tokens: a burst overshoots by at most the last admitted
// request's reservation. Its real tokens are charged when it ends — only
// then are they known — and the reservation given back, so the bucket may
// go below zero; the key then waits until a token is back. Hand-written
// rather than golang.org/x/time/rate: that limiter cannot charge more than
// its burst after the fact, which a long generation does.
type limiter struct {
	mu       sync.Mutex
	req, tok bucket
}

// bucket is one token bucket; its level may go negative.
type bucket struct {
	limit float64 // per minute, also the capacity; 0 = unlimited
	level float64
	at    time.Time // when level was last brought up to date
}

func newLimiter(rpm, tpm int, now time.Time) *limiter {
	l := &limiter{}
	l.set(rpm, tpm, now)
	return l
}

// set changes the limits, keeping what was used of them: a key whose limit
// is raised keeps its level (capped at the new limit), one that becomes
// limited starts full.
func (l *limiter) set(rpm, tpm int, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.req.set(float64(rpm), now)
	l.tok.set(float64(tpm), now)
}

func (b *bucket) set(limit float64, now time.Time) {
	if b.limit == 0 {
		b.level = limit
	}
	b.refill(now)
	b.limit = limit
	b.level = min(b.level, limit)
}

func (b *bucket) refill(now time.Time) {
	if b.limit > 0 && now.After(b.at) {
		b.level = min(b.limit, b.level+now.Sub(b.at).Minutes()*b.limit)
	}
	b.at = now
}

// wait is how long until the level reaches need.
func (b *bucket) wait(need float64) time.Duration {
	if b.limit == 0 || b.level >= need {
		return 0
	}
	return minutes((need - b.level) / b.limit)
}

func (b *bucket) window() Window {
	if b.limit == 0 {
		return Window{}
	}
	return Window{Limit: int64(b.limit), Remaining: int64(max(0, math.Floor(b.level))),
		Reset: minutes((b.limit - b.level) / b.limit)}
}

func minutes(m float64) time.Duration {
	return time.Duration(math.Ceil(m * float64(time.Minute)))
}

// admit takes one request if both limits allow it (a whole request and a
// whole token are left), and reserves reserve tokens of it, at most the
// whole limit: a reservation beyond it would hold the key back longer
// without holding back anyone else.
func (l *limiter) admit(reserve int64, now time.Time) Quota {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.req.refill(now)
	l.tok.refill(now)
	q := Quota{RetryAfter: max(l.req.wait(1), l.tok.wait(1))}
	if q.Allowed = q.RetryAfter == 0; q.Allowed {
		if l.req.limit > 0 {
			l.req.level--
		}
		if l.tok.limit > 0 && reserve > 0 {
			q.Reserved = int64(min(float64(reserve), l.tok.limit))
			l.tok.level -= float64(q.Reserved)
		}
	}
	q.Requests, q.Tokens = l.req.window(), l.tok.window()
	return q
}

// release gives back n reserved tokens, never above the limit (which may
// have been lowered since).
func (l *limiter) release(n int64, now time.Time) { l.add(n, now) }

// charge takes n tokens after a generation, however many are left.
func (l *limiter) charge(n int64, now time.Time) { l.add(-n, now) }

// add moves the token level by n, up to the limit.
func (l *limiter) add(n int64, now time.Time) {
	if n == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tok.limit == 0 {
		return
	}
	l.tok.refill(now)
	l.tok.level = min(l.tok.limit, l.tok.level+float64(n))
}
