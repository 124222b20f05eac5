// Package certtest issues throw-away certificates for 127.0.0.1 and lays
// them out on disk the way certbot does, for tests of TLS listeners that
// reload their certificate.
package certtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// CA issues server certificates for 127.0.0.1. Pool trusts only it.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	Pool *x509.CertPool
}

// NewCA makes a CA valid for a day.
func NewCA(t testing.TB) *CA {
	t.Helper()
	ca, err := MakeCA()
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// MakeCA is NewCA for a caller that is not a test (the benchmark).
func MakeCA() (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1000),
		Subject:               pkix.Name{CommonName: "hearth test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, Pool: pool}, nil
}

// PEM is the CA's certificate, for a client's CA file.
func (ca *CA) PEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// Issue returns a PEM certificate and key for 127.0.0.1 with this serial.
func (ca *CA) Issue(t testing.TB, serial int64, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	certPEM, keyPEM, err := ca.Make(serial, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	return certPEM, keyPEM
}

// Make is Issue for a caller that is not a test (the benchmark).
func (ca *CA) Make(serial int64, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// Dir lays files out like certbot: cert.pem and key.pem are symlinks into a
// versioned archive, swapped on renewal.
type Dir struct {
	dir     string
	version int
}

// NewDir returns an empty Dir in a test temporary directory.
func NewDir(t testing.TB) *Dir { return &Dir{dir: t.TempDir()} }

// Cert is the path of the certificate symlink.
func (d *Dir) Cert() string { return filepath.Join(d.dir, "cert.pem") }

// Key is the path of the key symlink.
func (d *Dir) Key() string { return filepath.Join(d.dir, "key.pem") }

// Renew writes a new version and swaps the symlinks to it, one at a time
// as certbot does.
func (d *Dir) Renew(t testing.TB, certPEM, keyPEM []byte) {
	t.Helper()
	d.version++
	for _, f := range []struct {
		link string
		name string
		data []byte
	}{{d.Cert(), "cert", certPEM}, {d.Key(), "key", keyPEM}} {
		target := filepath.Join(d.dir, "archive", f.name+strings.Repeat("I", d.version)+".pem")
		if err := os.MkdirAll(filepath.Dir(target), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		tmp := f.link + ".tmp"
		_ = os.Remove(tmp)
		if err := os.Symlink(target, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, f.link); err != nil {
			t.Fatal(err)
		}
	}
}

// RequireAEADOnly fails t unless the TLS server at addr (trusted through
// roots) refuses over TLS 1.2 every cipher suite Go implements that is not
// an AEAD, each offered alone, and serves the AEAD ones.
func RequireAEADOnly(t testing.TB, addr string, roots *x509.CertPool) {
	t.Helper()
	dial := func(suites []uint16) (tls.ConnectionState, error) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{
			RootCAs: roots, MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12, CipherSuites: suites})
		if err != nil {
			return tls.ConnectionState{}, err
		}
		defer conn.Close()
		return conn.ConnectionState(), nil
	}
	var aead []uint16
	for _, s := range append(tls.CipherSuites(), tls.InsecureCipherSuites()...) {
		if !slices.Contains(s.SupportedVersions, tls.VersionTLS12) {
			continue
		}
		if strings.Contains(s.Name, "_GCM_") || strings.Contains(s.Name, "_CHACHA20_POLY1305") {
			aead = append(aead, s.ID)
			continue
		}
		if _, err := dial([]uint16{s.ID}); err == nil {
			t.Errorf("TLS 1.2 with %s was served", s.Name)
		}
	}
	st, err := dial(aead)
	if err != nil {
		t.Fatalf("TLS 1.2 with the AEAD suites: %v", err)
	}
	if !slices.Contains(aead, st.CipherSuite) {
		t.Fatalf("TLS 1.2 negotiated %s", tls.CipherSuiteName(st.CipherSuite))
	}
}
