package certreload_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/internal/certreload"
	"github.com/hearthd/hearth/internal/certreload/certtest"
)

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestTLSConfig(t *testing.T) {
	ca := certtest.NewCA(t)
	d := certtest.NewDir(t)
	c, k := ca.Issue(t, 7, time.Now().Add(time.Hour))
	d.Renew(t, c, k)
	r, err := certreload.New(d.Cert(), d.Key(), discardLog())
	if err != nil {
		t.Fatal(err)
	}
	cfg := r.TLSConfig("http/1.1")
	if cfg.MinVersion != tls.VersionTLS12 || len(cfg.NextProtos) != 1 || cfg.NextProtos[0] != "http/1.1" {
		t.Fatalf("tls config %+v", cfg)
	}

	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = conn.(*tls.Conn).Handshake()
				conn.Close()
			}()
		}
	}()
	certtest.RequireAEADOnly(t, ln.Addr().String(), ca.Pool)
	// TLS 1.1 is refused; 1.2 and 1.3 are served, with HTTP/1.1 over ALPN.
	old := &tls.Config{RootCAs: ca.Pool, MaxVersion: tls.VersionTLS11, MinVersion: tls.VersionTLS10}
	if conn, err := tls.Dial("tcp", ln.Addr().String(), old); err == nil {
		conn.Close()
		t.Fatal("TLS 1.1 handshake succeeded")
	}
	for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
			RootCAs: ca.Pool, MinVersion: v, MaxVersion: v, NextProtos: []string{"h2", "http/1.1"},
		})
		if err != nil {
			t.Fatalf("version %x: %v", v, err)
		}
		st := conn.ConnectionState()
		conn.Close()
		if st.NegotiatedProtocol != "http/1.1" || st.PeerCertificates[0].SerialNumber.Int64() != 7 {
			t.Fatalf("version %x: alpn %q serial %v", v, st.NegotiatedProtocol, st.PeerCertificates[0].SerialNumber)
		}
	}
}

func TestNewCertReloaderErrors(t *testing.T) {
	ca := certtest.NewCA(t)
	dir := t.TempDir()
	c1, k1 := ca.Issue(t, 1, time.Now().Add(time.Hour))
	_, k2 := ca.Issue(t, 2, time.Now().Add(time.Hour))
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key, otherKey := write("c.pem", c1), write("k.pem", k1), write("k2.pem", k2)
	garbage := write("g.pem", []byte("not PEM"))
	missing := filepath.Join(dir, "absent.pem")

	for _, tc := range []struct {
		name, cert, key string
		want            []string
	}{
		{"missing cert", missing, key, []string{"read certificate", missing}},
		{"missing key", cert, missing, []string{"read key", missing}},
		{"mismatched key", cert, otherKey, []string{cert, otherKey, "does not match"}},
		{"garbage cert", garbage, key, []string{garbage}},
		{"garbage key", cert, garbage, []string{garbage}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := certreload.New(tc.cert, tc.key, discardLog())
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if strings.Contains(err.Error(), "PRIVATE KEY-----") {
				t.Errorf("error echoes key material: %q", err)
			}
		})
	}

	// An expired certificate still starts (a renewal may be on its way),
	// but is reported.
	ce, ke := ca.Issue(t, 9, time.Now().Add(-time.Minute))
	var logBuf bytes.Buffer
	r, err := certreload.New(write("ce.pem", ce), write("ke.pem", ke), slog.New(slog.NewTextHandler(&logBuf, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if r.Certificate().SerialNumber.Int64() != 9 || !strings.Contains(logBuf.String(), "expired") {
		t.Fatalf("expired certificate: serial %v, log %q", r.Certificate().SerialNumber, logBuf.String())
	}
}

func TestReloadKeepsCurrentOnBadRenewal(t *testing.T) {
	ca := certtest.NewCA(t)
	dir := t.TempDir()
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	put := func(certPEM, keyPEM []byte) {
		t.Helper()
		// In place, not by rename: contents decide, not inode or mtime.
		if certPEM != nil {
			if err := os.WriteFile(certPath, certPEM, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if keyPEM != nil {
			if err := os.WriteFile(keyPath, keyPEM, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	c1, k1 := ca.Issue(t, 1, time.Now().Add(time.Hour))
	put(c1, k1)
	r, err := certreload.New(certPath, keyPath, discardLog())
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		cert, err := r.GetCertificate(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return cert.Leaf.SerialNumber.Int64()
	}

	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("unchanged files: changed %v err %v", changed, err)
	}

	// A renewal caught half-way: new certificate, old key.
	c2, k2 := ca.Issue(t, 2, time.Now().Add(2*time.Hour))
	put(c2, nil)
	if changed, err := r.Reload(); changed || err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched pair: changed %v err %v", changed, err)
	}
	if serial() != 1 || r.Failures() != 1 {
		t.Fatalf("after mismatch: serial %d failures %d", serial(), r.Failures())
	}
	// Checking again without a change neither retries nor counts.
	if changed, err := r.Reload(); changed || err != nil || r.Failures() != 1 {
		t.Fatalf("recheck: changed %v err %v failures %d", changed, err, r.Failures())
	}
	// The key lands: the pair is now valid.
	put(nil, k2)
	if changed, err := r.Reload(); !changed || err != nil || serial() != 2 || r.Reloads() != 1 {
		t.Fatalf("completed renewal: changed %v err %v serial %d reloads %d", changed, err, serial(), r.Reloads())
	}

	// An expired replacement is refused.
	c3, k3 := ca.Issue(t, 3, time.Now().Add(-time.Minute))
	put(c3, k3)
	if changed, err := r.Reload(); changed || err == nil || !strings.Contains(err.Error(), "expired") || serial() != 2 {
		t.Fatalf("expired renewal: changed %v err %v serial %d", changed, err, serial())
	}
	// A vanished file is counted once, however often it is checked.
	failures := r.Failures()
	if err := os.Remove(keyPath); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := r.Reload(); err == nil {
			t.Fatal("missing key: no error")
		}
	}
	if r.Failures() != failures+1 || serial() != 2 {
		t.Fatalf("missing key: failures %d (was %d), serial %d", r.Failures(), failures, serial())
	}
}

// Run checks the files every interval and swaps in a renewal; in a
// synctest bubble the interval passes without waiting for it.
func TestRunPicksUpRenewals(t *testing.T) {
	ca := certtest.NewCA(t)
	d := certtest.NewDir(t)
	c1, k1 := ca.Issue(t, 1, time.Now().Add(time.Hour))
	d.Renew(t, c1, k1)
	c2, k2 := ca.Issue(t, 2, time.Now().Add(2*time.Hour))
	synctest.Test(t, func(t *testing.T) {
		r, err := certreload.New(d.Cert(), d.Key(), discardLog())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx, time.Minute) }()

		d.Renew(t, c2, k2)
		time.Sleep(time.Minute - time.Nanosecond)
		synctest.Wait()
		if r.Reloads() != 0 || r.Certificate().SerialNumber.Int64() != 1 {
			t.Fatalf("renewal picked up before the interval passed: %d reloads", r.Reloads())
		}
		time.Sleep(time.Nanosecond)
		synctest.Wait()
		if r.Reloads() != 1 || r.Certificate().SerialNumber.Int64() != 2 {
			t.Fatalf("after one interval: %d reloads, serial %v", r.Reloads(), r.Certificate().SerialNumber)
		}
		cancel()
		<-done
	})
}
