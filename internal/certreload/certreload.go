// Package certreload serves a TLS certificate that is renewed on disk
// (certbot, an ACME client, a config tool) without a restart: the daemons'
// TLS listeners take the current pair from a Reloader at each handshake.
package certreload

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultCheckInterval is how often Run looks for a renewed certificate
// when given no interval.
const DefaultCheckInterval = 5 * time.Second

// Reloader serves a certificate and key pair and picks up a renewed one written to the same paths, without a restart and without
// touching open connections: each TLS handshake asks GetCertificate for the
// current pair, so connections made before a renewal keep the session they
// negotiated and new ones get the new certificate.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger

	cur atomic.Pointer[tls.Certificate]

	mu sync.Mutex // serialises Reload (Run and a SIGHUP may race)
	// The file contents last tried, good or bad: a pair is parsed once per
	// change, so a broken renewal is logged once, not on every check.
	lastCert, lastKey []byte
	lastReadErr       string

	reloads  atomic.Uint64
	failures atomic.Uint64
}

// New loads the PEM certificate chain and private key, failing
// if either is unreadable or they do not match.
func New(certFile, keyFile string, logger *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: logger}
	certPEM, keyPEM, err := r.read()
	if err != nil {
		return nil, err
	}
	cert, err := r.parse(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	r.lastCert, r.lastKey = certPEM, keyPEM
	r.cur.Store(cert)
	leaf := cert.Leaf
	attrs := []any{"cert", certFile, "subject", leaf.Subject.String(), "serial", leaf.SerialNumber.String(), "not_after", leaf.NotAfter}
	if time.Now().After(leaf.NotAfter) {
		// Serve anyway: a renewal may land any moment and is picked up
		// without a restart, whereas refusing to start helps nobody.
		logger.Error("TLS certificate has expired; clients will reject it until it is renewed", attrs...)
	} else {
		logger.Info("TLS certificate loaded", attrs...)
	}
	return r, nil
}

// GetCertificate returns the current certificate; it is tls.Config's
// GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cur.Load(), nil
}

// TLSConfig is a server TLS configuration (TLS 1.2 or later, AEAD cipher
// suites only) serving the current certificate, offering nextProtos over
// ALPN: only what the server behind it speaks (fasthttp: "http/1.1";
// net/http: "h2", "http/1.1"). Both daemons serve it.
func (r *Reloader) TLSConfig(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   AEADSuites(),
		GetCertificate: r.GetCertificate,
		NextProtos:     nextProtos,
	}
}

// AEADSuites returns the TLS 1.2 cipher suites served: forward-secret key
// exchange and authenticated encryption. Go's defaults also offer the CBC
// suites (SHA-1 MACs, padding-oracle history); TLS 1.3's suites are all
// AEAD and not configurable. The list includes what HTTP/2 requires (RFC
// 7540 §9.2.2: ECDHE with AES-128-GCM).
func AEADSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

// Certificate returns the leaf of the certificate being served (for its
// expiry in metrics and logs).
func (r *Reloader) Certificate() *x509.Certificate { return r.cur.Load().Leaf }

// Reloads counts renewals picked up.
func (r *Reloader) Reloads() uint64 { return r.reloads.Load() }

// Failures counts renewals rejected (files unreadable, unparsable,
// mismatched or expired); the previous certificate kept serving.
func (r *Reloader) Failures() uint64 { return r.failures.Load() }

// Run checks the files every interval (DefaultCheckInterval if zero)
// until ctx ends.
//
// Polling rather than inotify: renewal tools replace files by rename or by
// swapping symlinks (certbot's live/ → archive/), which an inotify watch on
// the old inode misses, while a poll re-opens the paths and sees whatever
// they point to now. Comparing contents rather than mtime/size/inode is as
// cheap for two small files and also catches an in-place rewrite within
// one timestamp tick or by a copy that preserves mtimes.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			_, _ = r.Reload() // logged and counted inside
		}
	}
}

// Reload re-reads the files now and swaps in the pair if it changed and is
// valid; otherwise the current certificate stays. It reports whether a new
// certificate is being served.
func (r *Reloader) Reload() (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	certPEM, keyPEM, err := r.read()
	if err != nil {
		// A file may be missing for a moment mid-renewal; say so once per
		// distinct error rather than on every check.
		if msg := err.Error(); msg != r.lastReadErr {
			r.lastReadErr = msg
			r.failures.Add(1)
			r.log.Warn("TLS certificate reload failed; still serving the current certificate", "err", err)
		}
		return false, err
	}
	r.lastReadErr = ""
	if bytes.Equal(certPEM, r.lastCert) && bytes.Equal(keyPEM, r.lastKey) {
		return false, nil
	}
	r.lastCert, r.lastKey = certPEM, keyPEM
	cert, err := r.parse(certPEM, keyPEM)
	if err == nil && time.Now().After(cert.Leaf.NotAfter) {
		err = fmt.Errorf("tls: certificate %s expired at %s", r.certFile, cert.Leaf.NotAfter.Format(time.RFC3339))
	}
	if err != nil {
		// Often a renewal caught between writing the certificate and the
		// key: the next change retries.
		r.failures.Add(1)
		r.log.Warn("TLS certificate reload failed; still serving the current certificate", "err", err)
		return false, err
	}
	old := r.cur.Swap(cert).Leaf
	r.reloads.Add(1)
	r.log.Info("TLS certificate renewed",
		"cert", r.certFile, "subject", cert.Leaf.Subject.String(),
		"serial", cert.Leaf.SerialNumber.String(), "not_after", cert.Leaf.NotAfter,
		"previous_serial", old.SerialNumber.String())
	return true, nil
}

func (r *Reloader) read() (certPEM, keyPEM []byte, err error) {
	certPEM, err = os.ReadFile(r.certFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: read certificate: %w", err)
	}
	keyPEM, err = os.ReadFile(r.keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: read key: %w", err)
	}
	return certPEM, keyPEM, nil
}

func (r *Reloader) parse(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("tls: certificate %s with key %s: %w", r.certFile, r.keyFile, err)
	}
	if cert.Leaf == nil { // X509KeyPair fills Leaf since Go 1.23
		return nil, errors.New("tls: certificate has no leaf")
	}
	return &cert, nil
}
