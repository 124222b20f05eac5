// Package storetest helps test code that keeps its state in a store: a
// Pebble filesystem that can lose power.
package storetest

import (
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/vfs"
)

// CrashFS is Pebble's strict in-memory filesystem, for tests of what
// survives a power cut: Crash drops every write that was not synced.
type CrashFS struct{ *vfs.MemFS }

// NewCrashFS returns an empty CrashFS holding dirs, created and synced so
// that they survive a crash like the state directory a package installs.
func NewCrashFS(t testing.TB, dirs ...string) CrashFS {
	t.Helper()
	fs := vfs.NewStrictMem()
	// A directory survives once the directory holding its entry is synced.
	sync := map[string]bool{"": true}
	for _, d := range dirs {
		if err := fs.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		for p := filepath.Dir(filepath.Clean(d)); p != "." && p != "/"; p = filepath.Dir(p) {
			sync[p] = true
		}
	}
	for d := range sync {
		f, err := fs.OpenDir(d)
		if err != nil {
			t.Fatal(err)
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	return CrashFS{fs}
}

// Crash cuts the power: syncs are ignored from now on, stop runs (close the
// database, let in-flight writers finish: their commits go nowhere), and
// then everything not synced before the cut is gone.
func (c CrashFS) Crash(stop func()) {
	c.SetIgnoreSyncs(true)
	stop()
	c.ResetToSyncedState()
	c.SetIgnoreSyncs(false)
}
