package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Authentication failure reasons, values of the reason label of
// hearth_auth_failures_total.
const (
	AuthMissing   = "missing"   // no credentials sent
	AuthMalformed = "malformed" // an Authorization header that is not a bearer token
	AuthInvalid   = "invalid"   // a well-formed key that matches no active key
)

type authMetrics struct {
	failures *prometheus.CounterVec
	children *childCache[string, prometheus.Counter]
}

func newAuthMetrics() *authMetrics {
	m := &authMetrics{
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_auth_failures_total",
			Help: "Deployment API requests refused for failed authentication, by reason.",
		}, []string{"reason"}),
	}
	m.children = newChildCache(func(reason string) prometheus.Counter {
		return m.failures.WithLabelValues(reason)
	})
	return m
}

func (m *authMetrics) register(reg prometheus.Registerer) { reg.MustRegister(m.failures) }

// AuthFailure counts a request refused for failed authentication. reason
// should be one of the Auth constants or another value from a fixed set the
// caller owns; never pass anything derived from the credential.
func (n *Node) AuthFailure(reason string) { n.auth.children.get(reason).Inc() }
