package sshkeys

import (
	"context"
	"slices"
	"sync"
)

// Fake is an in-memory Keys for tests of other packages. Like File it
// validates every key and rejects the whole set if one is invalid; it records
// the last set that synced successfully.
type Fake struct {
	mu       sync.Mutex
	keys     []Key
	synced   bool
	err      error
	syncs    int
	failures int
	onSync   func([]Key, error)
}

var _ Keys = (*Fake)(nil)

// NewFake returns an empty Fake.
func NewFake() *Fake { return &Fake{} }

// Sync records keys, or fails with the error set by SetErr, or with the
// validation error File would return.
func (f *Fake) Sync(ctx context.Context, keys []Key) error {
	err := ctx.Err()
	if err == nil {
		_, err = validate(keys)
	}
	f.mu.Lock()
	if err == nil && f.err != nil {
		err = f.err
	}
	f.syncs++
	if err != nil {
		f.failures++
	} else {
		f.keys = slices.Clone(keys)
		f.synced = true
	}
	cb := f.onSync
	f.mu.Unlock()
	if cb != nil {
		cb(slices.Clone(keys), err)
	}
	return err
}

// SetErr makes every following Sync fail with err (nil to succeed again).
func (f *Fake) SetErr(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// OnSync registers fn to be called after every Sync with the keys passed and
// the result, e.g. to signal a channel in a test.
func (f *Fake) OnSync(fn func(keys []Key, err error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onSync = fn
}

// Keys returns the last successfully synced set and whether any Sync has
// succeeded yet.
func (f *Fake) Keys() ([]Key, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.keys), f.synced
}

// Syncs returns how many times Sync was called and how many of those failed.
func (f *Fake) Syncs() (calls, failures int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.syncs, f.failures
}
