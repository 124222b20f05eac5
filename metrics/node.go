package metrics

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// DefaultNodeAddr is where hearthd serves its metrics unless configured
// otherwise: loopback only, since the metrics port is not part of the
// customer-facing API.
const DefaultNodeAddr = "127.0.0.1:9464"

// Node holds the metrics of one hearthd. Create it with NewNode; all
// methods are safe for concurrent use.
type Node struct {
	reg *prometheus.Registry
	// now is the clock for values computed at scrape time (sync lag).
	now func() time.Time

	http *httpMetrics
	chat *chatMetrics
	adm  *admissionMetrics
	auth *authMetrics
	rt   *runtimeMetrics
	fw   *firewallCollector
	ssh  *sshKeyCollector
	sync *controlSyncCollector

	deliveries prometheus.Counter
}

// NewNode builds the node metrics, registered on a fresh registry together
// with the Go runtime and process collectors. version is reported in
// hearth_build_info.
func NewNode(version string) *Node {
	n := &Node{reg: prometheus.NewRegistry(), now: time.Now}
	n.http = newHTTPMetrics()
	n.chat = newChatMetrics()
	n.adm = newAdmissionMetrics()
	n.auth = newAuthMetrics()
	n.rt = newRuntimeMetrics()
	n.fw = newFirewallCollector()
	n.ssh = newSSHKeyCollector()
	n.sync = newControlSyncCollector(func() time.Time { return n.now() }, n.now())
	n.deliveries = newDeliveries()
	n.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(version),
	)
	n.http.register(n.reg)
	n.chat.register(n.reg)
	n.adm.register(n.reg)
	n.auth.register(n.reg)
	n.rt.register(n.reg)
	n.reg.MustRegister(n.fw, n.ssh, n.sync, n.deliveries)
	return n
}

// Registry returns the registry the node metrics live on, for callers that
// want to add a collector of their own or gather in tests.
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// Handler serves the node metrics in the Prometheus exposition formats.
func (n *Node) Handler() http.Handler { return handlerFor(n.reg) }

// handlerFor serves reg. A failing collector yields a partial answer rather
// than none, so one broken source does not blind the whole scrape; the few
// allowed concurrent scrapes keep a scrape storm from piling up collectors.
func handlerFor(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 4,
	})
}
