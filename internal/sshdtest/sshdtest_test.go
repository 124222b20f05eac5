package sshdtest

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// TestStartLogin: the user logs in with a key from the authorized_keys file
// given to Start, and is refused with any other.
func TestStartLogin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (useradd, sshd)")
	}
	// StrictModes: home and everything up to it must not be writable by
	// others, and the temp directories above must be traversable.
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(base, "home")
	u := AddUser(t, home)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	ak := filepath.Join(home, "authorized_keys")
	known, line := NewSigner(t)
	stranger, _ := NewSigner(t)
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ak, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{home, ak} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	s := Start(t, base, u, ak)
	if s.User != u {
		t.Fatalf("User = %v, want %v", s.User, u)
	}
	s.ExpectLogin(t, "start", "authorised", known, true)
	s.ExpectLogin(t, "start", "unknown", stranger, false)
}
