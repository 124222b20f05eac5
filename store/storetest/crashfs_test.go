package storetest

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble"
)

func TestCrashFSKeepsOnlySyncedWrites(t *testing.T) {
	fs := NewCrashFS(t, "var/lib/state", "other")
	write := func(name string, sync bool) {
		f, err := fs.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		if sync {
			if err := f.Sync(); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
	}
	write("var/lib/state/synced", true)
	// The synced file's directory entry is durable only with its directory.
	d, err := fs.OpenDir("var/lib/state")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	d.Close()
	write("var/lib/state/unsynced", false)
	stopped := false
	fs.Crash(func() {
		stopped = true
		// Writes while the power is failing are lost too.
		write("var/lib/state/during", true)
	})
	if !stopped {
		t.Fatal("Crash did not run stop")
	}
	for name, want := range map[string]bool{
		"var/lib/state/synced": true, "var/lib/state/unsynced": false, "var/lib/state/during": false,
		"var/lib/state": true, "other": true,
	} {
		_, err := fs.Stat(filepath.Clean(name))
		if got := err == nil; got != want {
			t.Errorf("after the crash %s exists = %v, want %v (%v)", name, got, want, err)
		}
	}
}

// A write Pebble did not sync does not survive a crash, so tests built on
// CrashFS can fail.
func TestCrashHarnessLosesUnsyncedWrites(t *testing.T) {
	fs := NewCrashFS(t, "state")
	db, err := pebble.Open("state", &pebble.Options{FS: fs, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("synced"), []byte("1"), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	if err := db.Set([]byte("unsynced"), []byte("1"), pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	fs.Crash(func() { _ = db.Close() })

	db, err = pebble.Open("state", &pebble.Options{FS: fs, Logger: quietPebble{}})
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

type quietPebble struct{}

func (quietPebble) Infof(string, ...any)         {}
func (quietPebble) Errorf(string, ...any)        {}
func (quietPebble) Fatalf(f string, args ...any) { panic(fmt.Sprintf(f, args...)) }
