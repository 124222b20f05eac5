package apikeys

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/vfs"
	"github.com/hearthd/hearth/store"
)

// crashFS is a Pebble in-memory filesystem that can lose everything not
// synced, as a power cut would.
type crashFS struct {
	fs *vfs.MemFS
}

const crashDir = "state"

func (c crashFS) open(t *testing.T) (*store.Store, *Keyring) {
	t.Helper()
	st, err := store.Open(crashDir, store.Options{FS: c.fs})
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
func newCrashFS(t *testing.T) crashFS {
	t.Helper()
	fs := vfs.NewStrictMem()
	if err := fs.MkdirAll(crashDir, 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := fs.OpenDir("")
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if err := root.Sync(); err != nil {
		t.Fatal(err)
	}
	return crashFS{fs: fs}
}

// crash stops the database the way a power cut would: nothing written from
// now on is synced, and whatever was not synced is gone. The keyring is
// abandoned, not closed, so it flushes nothing.
func (c crashFS) crash(st *store.Store) {
	c.fs.SetIgnoreSyncs(true)
	_ = st.Close()
	c.fs.ResetToSyncedState()
	c.fs.SetIgnoreSyncs(false)
}

// TestCrashHarnessLosesUnsyncedWrites shows the harness below can fail: a
// write Pebble did not sync does not survive a simulated crash.
func TestCrashHarnessLosesUnsyncedWrites(t *testing.T) {
	fs := newCrashFS(t).fs
	db, err := pebble.Open(crashDir, &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("synced"), []byte("1"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("unsynced"), []byte("1"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	fs.SetIgnoreSyncs(true)
	_ = db.Close()
	fs.ResetToSyncedState()
	fs.SetIgnoreSyncs(false)

	db, err = pebble.Open(crashDir, &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, c, err := db.Get([]byte("synced")); err != nil {
		t.Fatalf("synced write lost: %v", err)
	} else {
		c.Close()
	}
	if _, c, err := db.Get([]byte("unsynced")); !errors.Is(err, pebble.ErrNotFound) {
		if err == nil {
			c.Close()
		}
		t.Fatalf("unsynced write survived the crash (err %v): the harness cannot detect loss", err)
	}
}

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

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)         {}
func (quietPebble) Errorf(string, ...any)        {}
func (quietPebble) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
