package apikeys

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/store"
)

func newClock() *testutil.Clock { return testutil.NewClock() }

// openClocked opens a keyring in dir on clk; both close when the test
// ends unless closed before with closeKeyring.
func openClocked(t *testing.T, dir string, clk *testutil.Clock) (*store.Store, *Keyring) {
	t.Helper()
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := OpenWith(st, Options{Now: clk.Now})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { closeKeyring(t, st, k) })
	return st, k
}

// closeKeyring closes k and st, once.
func closeKeyring(t *testing.T, st *store.Store, k *Keyring) {
	t.Helper()
	k.mu.Lock()
	closed := k.closed
	k.mu.Unlock()
	if closed {
		return
	}
	if err := k.Close(); err != nil {
		t.Error(err)
	}
	if err := st.Close(); err != nil {
		t.Error(err)
	}
}

// issued is a managed key as the management API makes it: a secret and
// the record that carries only its hash.
func issued(t *testing.T, id string) (string, Managed) {
	t.Helper()
	secret, sum := newToken()
	return secret, Managed{ID: id, Name: "name of " + id, SHA256: hex.EncodeToString(sum[:])}
}

func TestManagedKeysReplaceTheWholeSet(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	st, k := openClocked(t, dir, clk)
	localSecret, local := mustCreate(t, k, "break-glass")
	s1, m1 := issued(t, "dk_one")
	s2, m2 := issued(t, "dk_two")

	if err := k.SetManaged([]Managed{m1, m2}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{s1, s2, localSecret} {
		if _, err := k.Authenticate(bearer(s)); err != nil {
			t.Fatalf("key works after SetManaged: %v", err)
		}
	}
	got, _ := k.Authenticate(bearer(s1))
	if got.ID != "dk_one" || got.Source != SourceManaged || got.Name != "name of dk_one" || got.Hint != "" {
		t.Fatalf("managed key %+v", got)
	}
	k.RecordUsage("dk_one", 1, 10, 5)
	clk.Add(time.Minute)
	k.RecordUsage("dk_one", 1, 1, 1)

	// The next set drops dk_two and renames dk_one: dk_two is refused at
	// once, dk_one keeps its usage, the local key is untouched.
	m1.Name = "renamed"
	if err := k.SetManaged([]Managed{m1}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(bearer(s2)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("removed managed key: %v", err)
	}
	one, err := k.Get("dk_one")
	if err != nil || one.Name != "renamed" || one.Usage != (Usage{2, 11, 6}) || one.LastUsedAt == nil || !one.LastUsedAt.Equal(clk.Now()) {
		t.Fatalf("kept key %+v %v", one, err)
	}
	if _, err := k.Authenticate(bearer(localSecret)); err != nil {
		t.Fatalf("local key after a managed set: %v", err)
	}
	// A managed key is not the box's to revoke.
	if err := k.Revoke("dk_one"); !errors.Is(err, ErrManaged) {
		t.Fatalf("revoke of a managed key: %v", err)
	}
	if err := k.Revoke(local.ID); err != nil {
		t.Fatal(err)
	}

	// Persisted: a restarted node enforces them before any control plane
	// answers, usage and last use included.
	closeKeyring(t, st, k)
	_, k2 := openClocked(t, dir, clk)
	if _, err := k2.Authenticate(bearer(s1)); err != nil {
		t.Fatalf("managed key after reopen: %v", err)
	}
	if _, err := k2.Authenticate(bearer(s2)); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("removed managed key after reopen: %v", err)
	}
	if one, _ := k2.Get("dk_one"); one.Usage != (Usage{2, 11, 6}) || one.LastUsedAt == nil || one.Source != SourceManaged {
		t.Fatalf("kept key after reopen %+v", one)
	}

	// The empty set removes every managed key, and only them.
	if err := k2.SetManaged(nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range k2.List() {
		if key.Source == SourceManaged {
			t.Fatalf("managed key left: %+v", key)
		}
	}
	if len(k2.List()) != 1 {
		t.Fatalf("keys %+v, want the local one", k2.List())
	}
}

func TestManagedKeysRejectAnInvalidSet(t *testing.T) {
	_, k := openClocked(t, t.TempDir(), newClock())
	s1, good := issued(t, "dk_good")
	if err := k.SetManaged([]Managed{good}); err != nil {
		t.Fatal(err)
	}
	_, other := issued(t, "dk_other")
	bad := map[string][]Managed{
		"id":        {{ID: "key_local", SHA256: good.SHA256}},
		"id chars":  {{ID: "dk_a/b", SHA256: other.SHA256}},
		"hash":      {{ID: "dk_x", SHA256: "abc"}},
		"duplicate": {other, other},
		"same hash": {other, {ID: "dk_twin", SHA256: other.SHA256}},
		"limits":    {{ID: "dk_neg", SHA256: other.SHA256, RequestsPerMinute: -1}},
	}
	for name, set := range bad {
		if err := k.SetManaged(set); err == nil {
			t.Errorf("%s: an invalid set was accepted", name)
		}
		// Nothing changed: the previous set is still in force.
		if _, err := k.Authenticate(bearer(s1)); err != nil {
			t.Fatalf("%s: the previous set is gone: %v", name, err)
		}
		if _, err := k.Get("dk_other"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s: part of an invalid set was applied", name)
		}
	}
}

// The node refuses an expired key by its expires_at itself, without
// waiting for the control plane to drop it.
func TestManagedKeyExpires(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	secret, m := issued(t, "dk_temp")
	exp := clk.Now().Add(time.Hour)
	m.ExpiresAt = &exp
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Hour - time.Nanosecond)
	if _, err := k.Authenticate(bearer(secret)); err != nil {
		t.Fatalf("a nanosecond before expiry: %v", err)
	}
	clk.Add(time.Nanosecond)
	if _, err := k.Authenticate(bearer(secret)); !errors.Is(err, ErrExpired) || Reason(err) != "expired" {
		t.Fatalf("at expiry: %v", err)
	}
	// Extending it works again at once.
	later := exp.Add(time.Hour)
	m.ExpiresAt = &later
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(bearer(secret)); err != nil {
		t.Fatalf("after extending: %v", err)
	}
}

func TestWipeRemovesEveryKeyAndItsUsage(t *testing.T) {
	clk := newClock()
	dir := t.TempDir()
	st, k := openClocked(t, dir, clk)
	localSecret, local := mustCreate(t, k, "local")
	revoked, rk := mustCreate(t, k, "revoked")
	if err := k.Revoke(rk.ID); err != nil {
		t.Fatal(err)
	}
	managed, m := issued(t, "dk_m")
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	k.RecordUsage(local.ID, 1, 2, 3)
	k.RecordUsage("dk_m", 1, 2, 3)
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}

	if err := k.Wipe(); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{localSecret, revoked, managed} {
		if _, err := k.Authenticate(bearer(s)); !errors.Is(err, ErrUnknownKey) {
			t.Fatalf("key after wipe: %v", err)
		}
	}
	if l := k.List(); len(l) != 0 {
		t.Fatalf("keys after wipe: %+v", l)
	}
	n := 0
	if err := st.Scan(keyPrefix, "", false, func(string, []byte) (bool, error) { n++; return true, nil }); err != nil || n != 0 {
		t.Fatalf("%d records left in the store (%v)", n, err)
	}
	// Usage recorded for a wiped key by a request still in flight is
	// dropped, not resurrected by a flush.
	k.RecordUsage(local.ID, 1, 1, 1)
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}
	if has, _ := st.Has(keyPrefix + local.ID); has {
		t.Fatal("a flush brought back a wiped key")
	}
	// The same managed key issued again starts from zero.
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if got, _ := k.Get("dk_m"); got.Usage != (Usage{}) || got.LastUsedAt != nil {
		t.Fatalf("usage survived the wipe: %+v", got)
	}
	if _, err := k.Authenticate(bearer(managed)); err != nil || strings.Contains(managed, m.SHA256) {
		t.Fatal(err)
	}
}

// Authenticating a managed key that expires, and admitting and charging a
// limited one, allocate nothing either.
func TestManagedHotPathDoesNotAllocate(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	secret, m := issued(t, "dk_hot")
	exp := clk.Now().Add(time.Hour)
	m.ExpiresAt, m.RequestsPerMinute, m.TokensPerMinute = &exp, 1e9, 1e9
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	h := bearer(secret)
	allocs := testing.AllocsPerRun(200, func() {
		key, _ := k.Authenticate(h)
		_ = k.Admit(key.ID, 0)
		k.RecordUsage(key.ID, 1, 3, 4)
	})
	if allocs != 0 {
		t.Fatalf("managed key: %.1f allocations per request", allocs)
	}
}

func hashOf(secret string) string {
	s := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(s[:])
}

// The hash the management API sends is the SHA-256 of the whole secret,
// the same the keyring computes from the header.
func TestManagedHashIsSHA256OfTheSecret(t *testing.T) {
	_, k := openClocked(t, t.TempDir(), newClock())
	secret, _ := newToken()
	if err := k.SetManaged([]Managed{{ID: "dk_x", Name: "x", SHA256: hashOf(secret)}}); err != nil {
		t.Fatal(err)
	}
	if got, err := k.Authenticate(bearer(secret)); err != nil || got.ID != "dk_x" {
		t.Fatalf("%+v %v", got, err)
	}
}
