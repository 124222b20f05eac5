package firewall

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Fake is a Firewall for other packages' tests. It validates like NFT,
// records every rule set it accepts, and can be told to fail.
type Fake struct {
	mu      sync.Mutex
	applied [][]Rule
	err     error
}

var _ Firewall = (*Fake)(nil)

// Apply validates rules and records their canonical form, or returns the
// error set with FailWith (recording nothing).
func (f *Fake) Apply(_ context.Context, rules []Rule) error {
	canon, err := CanonicalizeAll(rules)
	if err != nil {
		return fmt.Errorf("firewall: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	f.applied = append(f.applied, canon)
	return nil
}

// FailWith makes every later Apply return err; nil restores success.
func (f *Fake) FailWith(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

// Applied returns every rule set applied so far, oldest first.
func (f *Fake) Applied() [][]Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([][]Rule, len(f.applied))
	for i, rs := range f.applied {
		out[i] = slices.Clone(rs)
	}
	return out
}

// Rules returns the last applied rule set and whether there was one.
func (f *Fake) Rules() ([]Rule, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return nil, false
	}
	return slices.Clone(f.applied[len(f.applied)-1]), true
}

// Noop is the Firewall for hosts whose firewall hearth does not manage (for
// example dev mode): it validates and records rules but never touches the
// host.
type Noop struct {
	mu    sync.Mutex
	rules []Rule
	stats Stats
}

var _ Firewall = (*Noop)(nil)

// Apply validates rules and remembers their canonical form.
func (n *Noop) Apply(_ context.Context, rules []Rule) error {
	canon, err := CanonicalizeAll(rules)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.stats.ApplyFailures++
		return fmt.Errorf("firewall: %w", err)
	}
	n.rules = canon
	n.stats.Applies++
	n.stats.Rules = len(canon)
	n.stats.LastApply = time.Now()
	n.stats.LastSuccess = n.stats.LastApply
	return nil
}

// Rules returns the last accepted rule set (canonical).
func (n *Noop) Rules() []Rule {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.rules)
}

// Stats returns counters shaped like NFT's, so callers can report either.
func (n *Noop) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}
