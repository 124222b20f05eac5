package nodeapi_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/noredirect"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/nodeapi"
)

// TestCredentialsNeverFollowARedirect: a control plane, pinned by its
// certificate (--control-cert-sha256), that redirects to plain HTTP on
// another port gets neither the enrollment token nor the node credential
// sent there: the enrollment, the poll and the report fail.
func TestCredentialsNeverFollowARedirect(t *testing.T) {
	for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		trap := testutil.NewRedirectTrap(t, status)
		hc, err := nodeapi.NewHTTPClient(nodeapi.TLS{CertSHA256: []string{nodeapi.CertSHA256(trap.CertDER)}})
		if err != nil {
			t.Fatal(err)
		}
		c := nodeapi.NewClient(trap.URL, hc)
		ctx := context.Background()
		if _, err := c.Enroll(ctx, "het_enrollment", nodeapi.EnrollRequest{Hostname: "n1"}); !noredirect.Is(err) {
			t.Fatalf("%d: enroll: %v, want the redirect refused", status, err)
		}
		c.SetCredential("hnc_credential")
		if _, _, err := c.Desired(ctx, 0, time.Second); !noredirect.Is(err) {
			t.Fatalf("%d: poll: %v, want the redirect refused", status, err)
		}
		if err := c.ReportObserved(ctx, nodeapi.Observed{}); !noredirect.Is(err) {
			t.Fatalf("%d: report: %v, want the redirect refused", status, err)
		}
		if n := trap.Redirected.Load(); n != 3 {
			t.Fatalf("%d: %d requests reached the control plane, want 3", status, n)
		}
		if got := trap.Caught(); len(got) != 0 {
			t.Fatalf("%d: requests reached the redirect's target: %q", status, got)
		}
	}
}
