package apikeys

import (
	"errors"
	"fmt"
	"testing"

	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/store/storetest"
)

// crashFS is the state directory on a filesystem that can lose power.
type crashFS struct{ storetest.CrashFS }

const crashDir = "state"

func (c crashFS) open(t *testing.T) (*store.Store, *Keyring) {
	t.Helper()
	st, err := store.Open(crashDir, store.Options{FS: c})
	if err != nil {
		t.Fatal(err)
	}
	k, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st, k
}

// newCrashFS returns a crashable filesystem holding an empty, durable state
// directory, as installed by the package.
func newCrashFS(t *testing.T) crashFS { return crashFS{storetest.NewCrashFS(t, crashDir)} }

// crash stops the database the way a power cut would. The keyring is
// abandoned, not closed, so it flushes nothing.
func (c crashFS) crash(st *store.Store) { c.Crash(func() { _ = st.Close() }) }

// TestCrashLosesNothingAcknowledged crashes after every acknowledged Create,
// Revoke and Flush and checks that every one of them survived.
func TestCrashLosesNothingAcknowledged(t *testing.T) {
	c := newCrashFS(t)
	type issued struct {
		secret  string
		key     Key
		revoked bool
		usage   Usage
	}
	var all []*issued

	verify := func(stage string, k *Keyring) {
		t.Helper()
		list := k.List()
		if len(list) != len(all) {
			t.Fatalf("%s: %d keys after crash, want %d", stage, len(list), len(all))
		}
		for i, is := range all {
			got, err := k.Authenticate(bearer(is.secret))
			switch {
			case is.revoked && !errors.Is(err, ErrRevoked):
				t.Fatalf("%s: revoked key %d authenticates after crash: %v", stage, i, err)
			case !is.revoked && (err != nil || got.ID != is.key.ID):
				t.Fatalf("%s: key %d after crash: %+v, %v", stage, i, got, err)
			}
			if l := list[i]; l.ID != is.key.ID || l.Usage != is.usage || l.Revoked() != is.revoked {
				t.Fatalf("%s: key %d after crash is %+v, want id %s usage %+v revoked %v",
					stage, i, l, is.key.ID, is.usage, is.revoked)
			}
		}
	}

	st, k := c.open(t)
	for round := range 4 {
		secret, key, err := k.Create(fmt.Sprintf("round %d", round))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, &issued{secret: secret, key: key})
		c.crash(st)
		st, k = c.open(t)
		verify(fmt.Sprintf("round %d create", round), k)

		if round%2 == 1 {
			victim := all[round-1]
			if err := k.Revoke(victim.key.ID); err != nil {
				t.Fatal(err)
			}
			victim.revoked = true
			c.crash(st)
			st, k = c.open(t)
			verify(fmt.Sprintf("round %d revoke", round), k)
		}

		k.RecordUsage(key.ID, 1, 10, 100)
		if err := k.Flush(); err != nil {
			t.Fatal(err)
		}
		all[round].usage = Usage{1, 10, 100}
		c.crash(st)
		st, k = c.open(t)
		verify(fmt.Sprintf("round %d flush", round), k)
	}
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}
