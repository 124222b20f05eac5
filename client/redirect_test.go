package client

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/noredirect"
	"github.com/hearthd/hearth/internal/testutil"
)

// TestTokenNeverFollowsARedirect: an HTTPS control plane that redirects to
// plain HTTP on another port gets an error back, not the token sent there,
// and the call is not retried; with the caller's own HTTP client too, and
// for every redirect status.
func TestTokenNeverFollowsARedirect(t *testing.T) {
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusSeeOther,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		trap := testutil.NewRedirectTrap(t, status)
		ca := filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(ca, trap.CertPEM, 0o600); err != nil {
			t.Fatal(err)
		}
		follows := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
		for name, opts := range map[string][]Option{
			"own client": {WithCAFile(ca)},
			"caller's":   {WithCAFile(ca), WithHTTPClient(follows)},
		} {
			c, err := New(trap.URL, append(opts, WithToken("hct_secret"), WithRetries(3, time.Millisecond, time.Millisecond))...)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			before := trap.Redirected.Load()
			_, err = c.GetServer(ctx, "srv_x")
			if !noredirect.Is(err) {
				t.Fatalf("%d, %s: GET answered %v, want the redirect refused", status, name, err)
			}
			_, err = c.CreateSSHKey(ctx, CreateSSHKeyRequest{Name: "k", PublicKey: "ssh-ed25519 AAAA"})
			if !noredirect.Is(err) {
				t.Fatalf("%d, %s: POST answered %v, want the redirect refused", status, name, err)
			}
			if n := trap.Redirected.Load() - before; n != 2 {
				t.Errorf("%d, %s: %d requests for 2 calls: a refused redirect was retried", status, name, n)
			}
		}
		if got := trap.Caught(); len(got) != 0 {
			t.Fatalf("%d: requests reached the redirect's target: %q", status, got)
		}
	}
}
