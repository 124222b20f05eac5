package sshdtest

import (
	"os"
	"testing"

	"github.com/hearthd/hearth/internal/testutil"
)

// TestStartLogin: the user logs in with a key from the authorized_keys file
// given to Start, and is refused with any other.
func TestStartLogin(t *testing.T) {
	testutil.RequireRoot(t, "", "/usr/sbin/sshd", "ssh-keygen", "useradd", "userdel")
	h := NewHome(t)
	known, line := NewSigner(t)
	stranger, _ := NewSigner(t)
	ak := h.WriteFile(t, "authorized_keys", []byte(line+"\n"))
	if fi, err := os.Stat(ak); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("authorized_keys %v, %v: want mode 0600", fi.Mode(), err)
	}
	u := h.User
	s := Start(t, h.Base, u, ak)
	if s.User != u {
		t.Fatalf("User = %v, want %v", s.User, u)
	}
	s.ExpectLogin(t, "start", "authorised", known, true)
	s.ExpectLogin(t, "start", "unknown", stranger, false)
}
