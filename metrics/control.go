package metrics

import (
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// DefaultControlAddr is where the control plane serves its metrics unless
// configured otherwise.
const DefaultControlAddr = "127.0.0.1:9465"

// Control holds the metrics of the control plane. Create it with
// NewControl; all methods are safe for concurrent use.
type Control struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	children *childCache[ctlRequest, prometheus.Counter]
	duration *prometheus.HistogramVec
	timers   *childCache[ctlRequest, prometheus.Observer]
	nodes    *funcGauge
	byState  *countsCollector
	servers  *countsCollector
	// propagation is the time from a node's new desired revision to its
	// report of having applied it.
	propagation prometheus.Histogram
}

type ctlRequest struct {
	route, method string
	code          int
}

// NewControl builds the control-plane metrics on a fresh registry together
// with the Go runtime and process collectors. version is reported in
// hearth_build_info.
func NewControl(version string) *Control {
	c := &Control{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_control_http_requests_total",
			Help: "Control-plane API requests answered, by route pattern, method and HTTP status code.",
		}, []string{"route", "method", "code"}),
		duration: latencyHistogram("hearth_control_http_request_duration_seconds",
			"Time to answer a control-plane API request, by route pattern, method and HTTP status code (a node's long-poll waits up to its poll time).",
			controlDurationBuckets(), "route", "method", "code"),
		nodes: newFuncGauge("hearth_control_nodes_connected", "Nodes currently connected to the control plane."),
		byState: newCountsCollector("hearth_control_nodes",
			"Enrolled nodes by state: idle (in the pool), serving, wiping (its server gone, not yet wiped), unreachable.", "state"),
		servers: newCountsCollector("hearth_control_servers", "Servers known to the control plane, by status.", "status"),
		propagation: latencyHistogram("hearth_control_propagation_delay_seconds",
			"Time from a node's new desired state (a change to its server, keys or rules) to the node's report that it applied it.",
			propagationBuckets()).WithLabelValues().(prometheus.Histogram),
	}
	c.children = newChildCache(func(k ctlRequest) prometheus.Counter {
		return c.requests.WithLabelValues(k.route, k.method, strconv.Itoa(k.code))
	})
	c.timers = newChildCache(func(k ctlRequest) prometheus.Observer {
		return c.duration.WithLabelValues(k.route, k.method, strconv.Itoa(k.code))
	})
	c.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfo(version),
		c.requests, c.duration, c.nodes, c.byState, c.servers, c.propagation,
	)
	return c
}

// Registry returns the registry the control-plane metrics live on.
func (c *Control) Registry() *prometheus.Registry { return c.reg }

// Handler serves the control-plane metrics in the Prometheus exposition
// formats.
func (c *Control) Handler() http.Handler { return handlerFor(c.reg) }

// Request counts one answered API request. route is the route pattern
// (such as "/v1/servers/{id}", never the raw path, which would grow the
// label without bound; "" counts as "other"); method is the HTTP method,
// folded into "other" when not a standard one.
func (c *Control) Request(route, method string, code int) {
	c.children.get(ctlKey(route, method, code)).Inc()
}

// ObserveRequest records the time an API request took to answer, labelled
// as Request counts it.
func (c *Control) ObserveRequest(route, method string, code int, d time.Duration) {
	c.timers.get(ctlKey(route, method, code)).Observe(d.Seconds())
}

func ctlKey(route, method string, code int) ctlRequest {
	if route == "" {
		route = RouteOther
	}
	return ctlRequest{route, canonicalMethod(method), code}
}

// ObservePropagation records one propagation delay: from a node's new
// desired revision to its report of having applied it.
func (c *Control) ObservePropagation(d time.Duration) { c.propagation.Observe(d.Seconds()) }

// controlDurationBuckets: an API answer takes milliseconds; a node's
// long-poll holds up to its poll time (tens of seconds).
func controlDurationBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
}

// propagationBuckets: a node on its long-poll applies a change in well
// under a second; a node that restarts, or pulls a model, takes minutes.
func propagationBuckets() []float64 {
	return []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}
}

func canonicalMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
		http.MethodDelete, http.MethodOptions:
		return m
	}
	return "other"
}

// Middleware counts every request next answers by its http.ServeMux
// pattern (method prefix removed), method and status code. It reads
// Request.Pattern after next returns, so next must be the ServeMux itself
// or a wrapper that passes the same *http.Request on to it.
func (c *Control) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		start := time.Now()
		defer func() {
			if v := recover(); v != nil {
				// The handler blew up; whoever recovers it upstream
				// answers 500, so count it as such.
				c.Request(routeOf(r.Pattern), r.Method, http.StatusInternalServerError)
				c.ObserveRequest(routeOf(r.Pattern), r.Method, http.StatusInternalServerError, time.Since(start))
				panic(v)
			}
		}()
		next.ServeHTTP(sw, r)
		c.Request(routeOf(r.Pattern), r.Method, sw.status())
		c.ObserveRequest(routeOf(r.Pattern), r.Method, sw.status(), time.Since(start))
	})
}

// routeOf strips the optional "METHOD " prefix of a ServeMux pattern.
func routeOf(pattern string) string {
	if i := strings.IndexByte(pattern, ' '); i >= 0 {
		return strings.TrimLeft(pattern[i+1:], " \t")
	}
	return pattern
}

// statusWriter remembers the status code written through it.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	// 1xx answers are informational; the final status comes later.
	if w.code == 0 && code >= 200 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush keeps long-poll and streaming handlers working through the wrapper
// for callers that type-assert http.Flusher.
func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush() // http.Flusher reports no error either
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) status() int {
	if w.code == 0 {
		return http.StatusOK
	}
	return w.code
}

// RegisterNodesConnected sets the function read at each scrape for
// hearth_control_nodes_connected. Until it is called the metric is absent;
// a later call replaces it.
func (c *Control) RegisterNodesConnected(f func() int) {
	if f == nil {
		c.nodes.fn.set(nil)
		return
	}
	c.nodes.fn.set(func() float64 { return float64(f()) })
}

// RegisterServers sets the function read at each scrape for
// hearth_control_servers{status}: the number of servers in each status.
// Until it is called the metric is absent; a later call replaces it.
func (c *Control) RegisterServers(f func() map[string]int) { c.servers.counts.set(f) }

// RegisterNodes sets the function read at each scrape for
// hearth_control_nodes{state}: the number of nodes in each state. Until
// it is called the metric is absent; a later call replaces it.
func (c *Control) RegisterNodes(f func() map[string]int) { c.byState.counts.set(f) }

// countsCollector is a gauge per value of one label, read at scrape time.
type countsCollector struct {
	counts scrapeFunc[map[string]int]
	desc   *prometheus.Desc
}

func newCountsCollector(name, help, label string) *countsCollector {
	return &countsCollector{desc: prometheus.NewDesc(name, help, []string{label}, nil)}
}

func (s *countsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- s.desc }

func (s *countsCollector) Collect(ch chan<- prometheus.Metric) {
	f, ok := s.counts.get()
	if !ok {
		return
	}
	counts := f()
	statuses := make([]string, 0, len(counts))
	for st := range counts {
		statuses = append(statuses, st)
	}
	sort.Strings(statuses)
	for _, st := range statuses {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.GaugeValue, float64(counts[st]), st)
	}
}
