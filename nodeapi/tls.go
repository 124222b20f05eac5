package nodeapi

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
)

// TLS says how a node verifies the control plane's certificate. The zero
// value verifies it against the system's roots, as any HTTPS client does.
type TLS struct {
	// CAFile is a PEM bundle of the CAs that may sign the control plane's
	// certificate, instead of the system's roots (a private CA).
	CAFile string
	// CertSHA256 pins the control plane's leaf certificate: the SHA-256 of
	// its DER (CertSHA256), one of which the leaf must match. Without
	// CAFile a matching pin is the whole check, so a self-signed
	// certificate works; with CAFile the chain and name are verified too.
	// Several pins let a renewed certificate be announced before it is
	// served.
	CertSHA256 []string
}

// CertSHA256 is a certificate's pin: the lower-case hex SHA-256 of its DER,
// as `openssl x509 -noout -fingerprint -sha256` prints it without colons.
func CertSHA256(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}

// ParsePins reads a comma-separated list of certificate pins, each 64 hex
// digits, colons allowed (openssl's AB:CD:… form), any case.
func ParsePins(s string) ([]string, error) {
	var pins []string
	for _, p := range strings.Split(s, ",") {
		p = strings.ToLower(strings.ReplaceAll(strings.TrimSpace(p), ":", ""))
		if p == "" {
			continue
		}
		if b, err := hex.DecodeString(p); err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("certificate pin %q is not a SHA-256 fingerprint (64 hex digits)", p)
		}
		pins = append(pins, p)
	}
	return pins, nil
}

// Config is the client TLS configuration (TLS 1.2 or later).
func (t TLS) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("control plane CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("control plane CA file %s holds no PEM certificate", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if len(t.CertSHA256) == 0 {
		return cfg, nil
	}
	pins := make([]string, 0, len(t.CertSHA256))
	for _, p := range t.CertSHA256 {
		parsed, err := ParsePins(p)
		if err != nil {
			return nil, err
		}
		pins = append(pins, parsed...)
	}
	// With a pin and no CA the pin replaces chain verification, which
	// would refuse a self-signed certificate; VerifyConnection runs on
	// every handshake, resumed ones included.
	cfg.InsecureSkipVerify = t.CAFile == "" //nolint:gosec // the pin below is the verification
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("control plane sent no certificate")
		}
		got := CertSHA256(cs.PeerCertificates[0].Raw)
		if !slices.Contains(pins, got) {
			return fmt.Errorf("control plane certificate sha256 %s matches no pinned fingerprint (control-cert-sha256)", got)
		}
		return nil
	}
	return cfg, nil
}

// NewHTTPClient returns a client for NewClient that verifies the control
// plane as t says, with no overall timeout (long-polls bound themselves).
func NewHTTPClient(t TLS) (*http.Client, error) {
	cfg, err := t.Config()
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = cfg
	return &http.Client{Transport: tr}, nil
}
