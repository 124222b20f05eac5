package sshkeys

import (
	"context"
	"os"
	"testing"

	"github.com/hearthd/hearth/internal/sshdtest"
	"github.com/hearthd/hearth/internal/testutil"
)

// TestSSHDLogin checks the writer against the real sshd: a synced key can
// log in, an unsynced or removed one cannot, and a line a human added by hand
// keeps working through every Sync.
func TestSSHDLogin(t *testing.T) {
	testutil.RequireRoot(t, "HEARTH_SKIP_ROOT_TESTS", "/usr/sbin/sshd", "ssh-keygen", "useradd", "userdel")
	// StrictModes stays on, as in production, so the test also proves sshd
	// accepts the modes and owners Sync produces.
	home := sshdtest.NewHome(t)
	u := home.User

	// Keys: "human" is added by hand, "managed" through Sync, "never" is
	// never authorised.
	humanSigner, humanLine := sshdtest.NewSigner(t)
	managedSigner, managedLine := sshdtest.NewSigner(t)
	otherSigner, otherLine := sshdtest.NewSigner(t)
	neverSigner, _ := sshdtest.NewSigner(t)

	// The human's own .ssh and authorized_keys, as a user would make them.
	akPath := home.WriteFile(t, ".ssh/authorized_keys", []byte("# my own key\n"+humanLine+" me@home\n"))

	sshd := sshdtest.Start(t, home.Base, u, akPath)

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
