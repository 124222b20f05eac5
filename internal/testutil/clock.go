package testutil

import (
	"sync"
	"time"
)

// Clock is a settable clock for code that takes a `func() time.Time`
// (expiry, rate limits): it stands still until Add moves it. Safe for
// concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock at a fixed, arbitrary instant.
func NewClock() *Clock { return &Clock{t: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d.
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
