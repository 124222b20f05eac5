package main

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/testutil"
)

// TestTokenNeverFollowsARedirect: an HTTPS control plane that answers 307
// to plain HTTP on another port makes the command fail (exit 1, saying
// why) without the token reaching the redirect's target, and without a
// retry.
func TestTokenNeverFollowsARedirect(t *testing.T) {
	trap := testutil.NewRedirectTrap(t, http.StatusTemporaryRedirect)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, trap.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	h := &harness{t: t, env: map[string]string{"HEARTH_URL": trap.URL, "HEARTH_TOKEN": "hct_secret", "HEARTH_CA_FILE": ca,
		"HOME": home, "XDG_CONFIG_HOME": filepath.Join(home, "config")}}
	for _, args := range [][]string{
		{"server", "list"},
		{"server", "get", "srv_000000000000000000000000"},
		{"ssh-key", "add", "--name", "k", "--public-key", testKey},
	} {
		before := trap.Redirected.Load()
		r := h.fails(exitError, append(args, "-o", "table")...)
		if !strings.Contains(r.err, "redirect") || !strings.Contains(r.err, "not followed") {
			t.Errorf("hearth %s: stderr does not say the redirect was refused:\n%s", strings.Join(args, " "), r.err)
		}
		if n := trap.Redirected.Load() - before; n != 1 {
			t.Errorf("hearth %s: %d requests, want 1", strings.Join(args, " "), n)
		}
	}
	if got := trap.Caught(); len(got) != 0 {
		t.Fatalf("requests reached the redirect's target: %q", got)
	}
}
