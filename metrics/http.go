package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Routes of the deployment API, the values of the route label of
// hearth_http_requests_total and the per-route series. RouteModels counts
// /models and /models/{id}. Anything else is counted as RouteOther.
const (
	RouteChatCompletions = "chat"
	RouteResponses       = "responses"
	RouteCompletions     = "completions"
	RouteEmbeddings      = "embeddings"
	RouteModels          = "models"
	RouteHealthz         = "healthz"
	RouteReadyz          = "readyz"
	RouteOther           = "other"
)

// canonicalRoute folds unknown routes into RouteOther, bounding the label.
func canonicalRoute(route string) string {
	switch route {
	case RouteChatCompletions, RouteResponses, RouteCompletions, RouteEmbeddings, RouteModels, RouteHealthz, RouteReadyz:
		return route
	}
	return RouteOther
}

type routeCode struct {
	route string
	code  int
}

type httpMetrics struct {
	requests *prometheus.CounterVec
	children *childCache[routeCode, prometheus.Counter]
	panics   prometheus.Counter
}

func newHTTPMetrics() *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_http_requests_total",
			Help: "Deployment API requests answered, by route and HTTP status code.",
		}, []string{"route", "code"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_panics_recovered_total",
			Help: "Panics on a request's path turned into that request's failure; each is a bug, logged with its stack.",
		}),
	}
	m.children = newChildCache(func(k routeCode) prometheus.Counter {
		return m.requests.WithLabelValues(k.route, strconv.Itoa(k.code))
	})
	return m
}

func (m *httpMetrics) register(reg prometheus.Registerer) { reg.MustRegister(m.requests, m.panics) }

// PanicRecovered counts a panic that failed one request instead of the
// daemon.
func (n *Node) PanicRecovered() { n.http.panics.Inc() }

// Request counts one answered deployment API request. route is one of the
// Route constants; code is the HTTP status sent.
func (n *Node) Request(route string, code int) {
	n.http.children.get(routeCode{canonicalRoute(route), code}).Inc()
}
