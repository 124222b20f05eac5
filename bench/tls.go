package bench

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/hearthd/hearth/internal/certreload/certtest"
)

// TLSFiles are a certificate for 127.0.0.1 and its key, which hearthd and
// nginx both serve, and the client configuration that trusts it.
type TLSFiles struct {
	CertFile, KeyFile string
	Client            *tls.Config
}

// NewTLSFiles issues a certificate from a throw-away CA into dir.
func NewTLSFiles(dir string) (*TLSFiles, error) {
	ca, err := certtest.MakeCA()
	if err != nil {
		return nil, fmt.Errorf("test CA: %w", err)
	}
	cert, key, err := ca.Make(1, time.Now().Add(24*time.Hour))
	if err != nil {
		return nil, fmt.Errorf("test certificate: %w", err)
	}
	f := &TLSFiles{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem"),
		Client: &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}}
	if err := os.WriteFile(f.CertFile, cert, 0o644); err != nil {
		return nil, fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(f.KeyFile, key, 0o600); err != nil {
		return nil, fmt.Errorf("write key: %w", err)
	}
	return f, nil
}
