package apikeys

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/hearthd/hearth/internal/ids"
)

// ManagedPrefix starts the id of every key the management API issues.
const ManagedPrefix = "dk_"

// Managed is a key issued by the management API, as the desired state
// carries it: the hash of its secret, never the secret.
type Managed struct {
	ID   string
	Name string
	// SHA256 is the hex SHA-256 of the whole secret ("hearth_live_…").
	SHA256            string
	ExpiresAt         *time.Time
	RequestsPerMinute int
	TokensPerMinute   int
}

// SetManaged replaces the whole set of managed keys with keys, in one
// synced batch, and swaps the index: a key missing from keys is refused by
// the next request, a new one accepted by it. A key that stays keeps its
// usage and what it used of its limits. Local keys are left alone. An
// invalid set changes nothing.
func (k *Keyring) SetManaged(keys []Managed) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	old := k.idx.Load()
	ix := newIndex()
	for _, e := range old.byID {
		if e.key.Source != SourceManaged {
			ix.add(e)
		}
	}
	b := k.st.NewBatch()
	type written struct {
		c *counters
		u Usage
	}
	var changed []written
	for i, m := range keys {
		e, err := k.managedEntry(m, old)
		if err != nil {
			b.Discard()
			return fmt.Errorf("managed API key %d (%s): %w", i, m.ID, err)
		}
		if _, dup := ix.byID[m.ID]; dup {
			b.Discard()
			return fmt.Errorf("managed API key %d: id %s is listed twice", i, m.ID)
		}
		if other, dup := ix.byHash[e.hash]; dup {
			b.Discard()
			return fmt.Errorf("managed API key %s has the secret of key %s", m.ID, other.key.ID)
		}
		ix.add(e)
		if prev := old.byID[m.ID]; prev == nil || !sameManaged(prev, e) {
			u := e.usage.load()
			if err := b.Put(keyPrefix+m.ID, e.record(u)); err != nil {
				b.Discard()
				return fmt.Errorf("store managed API key %s: %w", m.ID, err)
			}
			changed = append(changed, written{e.usage, u})
		}
	}
	removed := 0
	gone := map[string]*entry{}
	for id, e := range old.byID {
		if e.key.Source == SourceManaged && ix.byID[id] == nil {
			b.Delete(keyPrefix + id)
			gone[id] = e
			removed++
		}
	}
	// What a key that leaves did up to now is still reported.
	if err := k.sealLocked(gone, true); err != nil {
		b.Discard()
		return fmt.Errorf("store managed API keys: %w", err)
	}
	if len(changed) == 0 && removed == 0 {
		b.Discard()
		return nil
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("store managed API keys: %w", err)
	}
	for _, w := range changed {
		w.c.flushed = w.u
	}
	k.idx.Store(ix)
	k.log.Info("managed API keys replaced", "keys", len(keys), "changed", len(changed), "removed", removed)
	return nil
}

// managedEntry validates m and returns its entry, sharing the usage and
// limiter of the key it replaces.
func (k *Keyring) managedEntry(m Managed, old *index) (*entry, error) {
	if !validManagedID(m.ID) {
		return nil, fmt.Errorf("id must be %s followed by 1 to 64 letters or digits", ManagedPrefix)
	}
	h, err := hex.DecodeString(m.SHA256)
	if err != nil || len(h) != sha256.Size {
		return nil, fmt.Errorf("hash must be 64 hex digits (a SHA-256)")
	}
	if m.RequestsPerMinute < 0 || m.TokensPerMinute < 0 {
		return nil, fmt.Errorf("limits must not be negative")
	}
	key := Key{ID: m.ID, Name: m.Name, Source: SourceManaged, CreatedAt: k.now().UTC(),
		RequestsPerMinute: m.RequestsPerMinute, TokensPerMinute: m.TokensPerMinute}
	if m.ExpiresAt != nil {
		t := m.ExpiresAt.UTC()
		key.ExpiresAt = &t
	}
	hash := [sha256.Size]byte(h)
	prev := old.byID[m.ID]
	if prev == nil || prev.hash != hash || prev.key.Source != SourceManaged {
		return k.newEntry(key, hash, &counters{}), nil
	}
	key.CreatedAt = prev.key.CreatedAt
	e := *prev
	e.key = key
	e.expires = 0
	if key.ExpiresAt != nil {
		e.expires = key.ExpiresAt.UnixNano()
	}
	switch {
	case key.RequestsPerMinute == 0 && key.TokensPerMinute == 0:
		e.limits = nil
	case e.limits == nil:
		e.limits = newLimiter(key.RequestsPerMinute, key.TokensPerMinute, k.now())
	default:
		e.limits.set(key.RequestsPerMinute, key.TokensPerMinute, k.now())
	}
	return &e, nil
}

// sameManaged reports whether a managed key's stored record would not
// change.
func sameManaged(a, b *entry) bool {
	x, y := a.key, b.key
	return x.Name == y.Name && a.hash == b.hash && a.expires == b.expires &&
		x.RequestsPerMinute == y.RequestsPerMinute && x.TokensPerMinute == y.TokensPerMinute
}

func validManagedID(id string) bool {
	rest, ok := strings.CutPrefix(id, ManagedPrefix)
	if !ok || len(rest) == 0 || len(rest) > 64 {
		return false
	}
	for i := range len(rest) {
		if !ids.IsBase62(rest[i]) {
			return false
		}
	}
	return true
}

// Wipe removes every key — managed and local, revoked ones too — with its
// usage, in one synced batch: what the node does when its tenant leaves.
// Requests with any of them are refused from then on.
func (k *Keyring) Wipe() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	// The tenant's use up to now is reported after the wipe: sealed
	// buckets hold counts, no secret, and go once the control plane has
	// them.
	if err := k.sealLocked(k.idx.Load().byID, true); err != nil {
		return fmt.Errorf("wipe API keys: %w", err)
	}
	b := k.st.NewBatch()
	n := 0
	// The store, not the index: nothing of a key may survive, not even a
	// record the index never loaded.
	err := k.st.Scan(keyPrefix, "", false, func(key string, _ []byte) (bool, error) {
		b.Delete(key)
		n++
		return true, nil
	})
	if err != nil {
		b.Discard()
		return fmt.Errorf("wipe API keys: %w", err)
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("wipe API keys: %w", err)
	}
	k.idx.Store(newIndex())
	k.log.Info("API keys wiped", "keys", n)
	return nil
}
