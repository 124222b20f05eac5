package sshkeys

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/hearthd/hearth/internal/sshdtest"
)

// TestSSHDLogin checks the writer against the real sshd: a synced key can
// log in, an unsynced or removed one cannot, and a line a human added by hand
// keeps working through every Sync.
func TestSSHDLogin(t *testing.T) {
	requireRoot(t)
	// StrictModes stays on, as in production, so the test also proves sshd
	// accepts the modes and owners Sync produces. sshd checks the file and
	// every directory from it up to the user's home (inclusive), as the
	// user; so home lives in a root-owned 0755 directory, and the 0700
	// temp directories above it are opened up to 0755 for the user to
	// traverse. Nothing above home is g/o-writable-checked by sshd.
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(base, "home")
	u := sshdtest.AddUser(t, home)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, uid, gid); err != nil {
		t.Fatal(err)
	}

	// Keys: "human" is added by hand, "managed" through Sync, "never" is
	// never authorised.
	humanSigner, humanLine := sshdtest.NewSigner(t)
	managedSigner, managedLine := sshdtest.NewSigner(t)
	otherSigner, otherLine := sshdtest.NewSigner(t)
	neverSigner, _ := sshdtest.NewSigner(t)

	// The human's own .ssh and authorized_keys, as a user would make them.
	sshDir := filepath.Join(home, ".ssh")
	akPath := filepath.Join(sshDir, "authorized_keys")
	if err := os.Mkdir(sshDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(akPath, []byte("# my own key\n"+humanLine+" me@home\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sshDir, akPath} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}

	sshd := sshdtest.Start(t, base, u, akPath)

	f, err := New(Config{User: u.Username})
	if err != nil {
		t.Fatal(err)
	}
	if f.Path() != akPath {
		t.Fatalf("Path = %q, want %q", f.Path(), akPath)
	}
	ctx := context.Background()
	managed := Key{ID: "sk_managed", PublicKey: managedLine + " managed"}
	other := Key{ID: "sk_other", PublicKey: otherLine}

	sshd.ExpectLogin(t, "before sync", "hand-added", humanSigner, true)
	sshd.ExpectLogin(t, "before sync", "managed", managedSigner, false)

	if err := f.Sync(ctx, []Key{managed}); err != nil {
		t.Fatal(err)
	}
	sshd.ExpectLogin(t, "after adding", "managed", managedSigner, true)
	sshd.ExpectLogin(t, "after adding", "hand-added", humanSigner, true)
	sshd.ExpectLogin(t, "after adding", "unknown", neverSigner, false)

	if err := f.Sync(ctx, []Key{other}); err != nil {
		t.Fatal(err)
	}
	sshd.ExpectLogin(t, "after replacing", "managed", managedSigner, false)
	sshd.ExpectLogin(t, "after replacing", "other", otherSigner, true)
	sshd.ExpectLogin(t, "after replacing", "hand-added", humanSigner, true)

	if err := f.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	sshd.ExpectLogin(t, "after removing all", "other", otherSigner, false)
	sshd.ExpectLogin(t, "after removing all", "hand-added", humanSigner, true)

	got, err := os.ReadFile(akPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := "# my own key\n" + humanLine + " me@home\n"; string(got) != want {
		t.Fatalf("hand-written file not restored exactly:\n%s", got)
	}
}
