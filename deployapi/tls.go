package deployapi

import (
	"crypto/tls"

	"github.com/hearthd/hearth/internal/certreload"
)

// TLSConfig is the deployment API's server TLS configuration, serving the
// reloader's current certificate. fasthttp speaks HTTP/1.1 only, so that is
// the one protocol offered over ALPN.
func TLSConfig(certs *certreload.Reloader) *tls.Config { return certs.TLSConfig("http/1.1") }
