package nodeapi_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/certreload/certtest"
	"github.com/hearthd/hearth/nodeapi"
)

// tlsControl is an HTTPS stand-in for the control plane with a
// certificate from a test CA, counting the requests that reach it.
type tlsControl struct {
	url    string
	caFile string
	pin    string // of its leaf
	hits   *atomic.Int64
}

func startTLSControl(t *testing.T) tlsControl {
	t.Helper()
	ca := certtest.NewCA(t)
	certPEM, keyPEM := ca.Issue(t, 2, time.Now().Add(time.Hour))
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	hits := &atomic.Int64{}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	ts.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	dir := t.TempDir()
	caFile := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(cert.Certificate[0])
	return tlsControl{url: ts.URL, caFile: caFile, pin: hex.EncodeToString(sum[:]), hits: hits}
}

// TestClientTLS: the node's client trusts the control plane by its CA
// file, by a pinned fingerprint, or both, and refuses a certificate that
// matches neither before sending anything.
func TestClientTLS(t *testing.T) {
	ctl := startTLSControl(t)
	other := startTLSControl(t) // another CA, another leaf
	for _, tc := range []struct {
		name   string
		tls    nodeapi.TLS
		refuse string // "" if the request goes through
	}{
		{"CA file", nodeapi.TLS{CAFile: ctl.caFile}, ""},
		{"pin", nodeapi.TLS{CertSHA256: []string{ctl.pin}}, ""},
		{"pin among others, upper case with colons", nodeapi.TLS{CertSHA256: []string{other.pin, colons(strings.ToUpper(ctl.pin))}}, ""},
		{"CA file and pin", nodeapi.TLS{CAFile: ctl.caFile, CertSHA256: []string{ctl.pin}}, ""},
		{"system roots", nodeapi.TLS{}, "certificate signed by unknown authority"},
		{"another CA", nodeapi.TLS{CAFile: other.caFile}, "certificate signed by unknown authority"},
		{"wrong pin", nodeapi.TLS{CertSHA256: []string{other.pin}}, "matches no pinned fingerprint"},
		{"right CA, wrong pin", nodeapi.TLS{CAFile: ctl.caFile, CertSHA256: []string{other.pin}}, "matches no pinned fingerprint"},
		{"right pin, wrong CA", nodeapi.TLS{CAFile: other.caFile, CertSHA256: []string{ctl.pin}}, "certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hc, err := nodeapi.NewHTTPClient(tc.tls)
			if err != nil {
				t.Fatal(err)
			}
			c := nodeapi.NewClient(ctl.url, hc)
			c.SetCredential("hcn_secret")
			before := ctl.hits.Load()
			err = c.ReportObserved(context.Background(), nodeapi.Observed{})
			switch {
			case tc.refuse == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refuse != "" && (err == nil || !strings.Contains(err.Error(), tc.refuse)):
				t.Fatalf("error %v, want %q", err, tc.refuse)
			case tc.refuse != "" && ctl.hits.Load() != before:
				t.Fatal("the request reached the server")
			}
		})
	}
	if _, err := nodeapi.NewHTTPClient(nodeapi.TLS{CAFile: filepath.Join(t.TempDir(), "missing.pem")}); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
	if _, err := nodeapi.NewHTTPClient(nodeapi.TLS{CAFile: os.Args[0]}); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("a CA file without certificates: %v", err)
	}
}

func colons(hexs string) string {
	var parts []string
	for i := 0; i < len(hexs); i += 2 {
		parts = append(parts, hexs[i:i+2])
	}
	return strings.Join(parts, ":")
}

func TestParsePins(t *testing.T) {
	pin := strings.Repeat("ab", 32)
	got, err := nodeapi.ParsePins(" " + colons(strings.ToUpper(pin)) + " ,, " + strings.Repeat("cd", 32))
	if err != nil || len(got) != 2 || got[0] != pin || got[1] != strings.Repeat("cd", 32) {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := nodeapi.ParsePins(""); err != nil || len(got) != 0 {
		t.Fatalf("empty: %v %v", got, err)
	}
	for _, bad := range []string{"abc", strings.Repeat("ab", 31), strings.Repeat("zz", 32), pin + "ab"} {
		if _, err := nodeapi.ParsePins(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestClientRefusesPlainHTTPOffLoopback: no credential is ever sent over
// plain HTTP to another machine; loopback is fine.
func TestClientRefusesPlainHTTPOffLoopback(t *testing.T) {
	for _, u := range []string{"http://10.0.0.1:8400", "http://control.example.com", "http://[2001:db8::1]:8400", "http://0.0.0.0:8400"} {
		c := nodeapi.NewClient(u, &http.Client{Transport: roundTripFunc(func(*http.Request) (*http.Response, error) {
			t.Fatalf("%s: a request was sent", u)
			return nil, nil
		})})
		if _, err := c.Enroll(context.Background(), "hce_secret", nodeapi.EnrollRequest{}); err == nil || !strings.Contains(err.Error(), "plain HTTP") {
			t.Errorf("%s: %v", u, err)
		}
		if err := nodeapi.CheckURL(u); err == nil {
			t.Errorf("CheckURL(%s) passed", u)
		}
	}
	for _, u := range []string{"http://127.0.0.1:8400", "http://localhost:8400", "http://[::1]:8400", "https://10.0.0.1:8400"} {
		if err := nodeapi.CheckURL(u); err != nil {
			t.Errorf("CheckURL(%s): %v", u, err)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
