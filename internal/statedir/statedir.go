// Package statedir prepares a daemon's private state directory.
package statedir

import (
	"fmt"
	"io/fs"
	"os"
)

// Ensure creates dir (mode 0700) if needed and makes sure only its owner
// can enter it: a directory that already exists with wider permissions
// (0755 from an earlier install or a hand-made mkdir) is tightened to 0700,
// since it holds the database with key hashes and the admin socket. It
// reports whether it tightened it, and refuses a path that is not a
// directory.
func Ensure(dir string) (tightened bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, fmt.Errorf("create state dir: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return false, fmt.Errorf("state dir: %w", err)
	}
	if !fi.IsDir() {
		return false, fmt.Errorf("state dir %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o077 == 0 {
		return false, nil
	}
	if err := os.Chmod(dir, fi.Mode().Perm()&^fs.FileMode(0o077)); err != nil {
		return false, fmt.Errorf("state dir %s is open to others (%v) and could not be tightened: %w", dir, fi.Mode().Perm(), err)
	}
	return true, nil
}
