package main

import (
	"crypto/tls"
	"net/http"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/certreload/certtest"
)

// TestTLSServesAEADOnly: over TLS 1.2 the control plane negotiates AEAD
// cipher suites only, and HTTP/2 (which needs one) is still served.
func TestTLSServesAEADOnly(t *testing.T) {
	ca := certtest.NewCA(t)
	files := certtest.NewDir(t)
	c, k := ca.Issue(t, 1, time.Now().Add(time.Hour))
	files.Renew(t, c, k)
	addr := serveWith(t, "--tls-cert", files.Cert(), "--tls-key", files.Key())
	certtest.RequireAEADOnly(t, addr, ca.Pool)

	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, MaxVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("https://" + addr + "/v1/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/2 over TLS 1.2: %s %s", resp.Proto, resp.Status)
	}
}
