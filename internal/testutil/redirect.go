package testutil

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// RedirectTrap is an HTTPS server on loopback that answers every request
// with a redirect (307 unless set) to a plain-HTTP server on another port,
// which records whatever reaches it: for tests that a client's credentials
// never follow a redirect.
type RedirectTrap struct {
	// URL is the HTTPS server's.
	URL string
	// CertPEM is its self-signed certificate, to trust as a CA; CertDER
	// the same, to pin.
	CertPEM, CertDER []byte
	// Redirected counts the requests the HTTPS server answered.
	Redirected atomic.Int64

	mu     sync.Mutex
	caught []string
}

// NewRedirectTrap starts the two servers, both closed when t ends.
func NewRedirectTrap(t testing.TB, status int) *RedirectTrap {
	t.Helper()
	if status == 0 {
		status = http.StatusTemporaryRedirect
	}
	r := &RedirectTrap{}
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.caught = append(r.caught, req.Method+" "+req.URL.String()+" Authorization: "+req.Header.Get("Authorization"))
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(plain.Close)
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.Redirected.Add(1)
		http.Redirect(w, req, plain.URL+req.URL.RequestURI(), status)
	}))
	t.Cleanup(tlsSrv.Close)
	r.URL = tlsSrv.URL
	r.CertDER = tlsSrv.Certificate().Raw
	r.CertPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.CertDER})
	return r
}

// Caught returns the requests that reached the plain-HTTP server, each
// with its Authorization header.
func (r *RedirectTrap) Caught() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.caught...)
}
