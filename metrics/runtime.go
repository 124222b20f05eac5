package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type runtimeMetrics struct {
	up        *funcGauge
	health    *healthGauge
	restarts  *prometheus.CounterVec
	wedges    prometheus.Counter
	recovery  prometheus.Histogram
	modelLoad prometheus.Gauge
}

// Reasons for a restart of the runtime (hearth_runtime_restarts_total's
// reason label).
const (
	RestartWedged = "wedged" // found wedged: it took requests and answered none
	RestartExited = "exited" // the process exited on its own
)

// RuntimeStates are the values of hearth_runtime_health's state label.
var RuntimeStates = []string{"healthy", "degraded", "restarting"}

func newRuntimeMetrics() *runtimeMetrics {
	m := &runtimeMetrics{
		up: newFuncGauge("hearth_runtime_up",
			"Whether the model runtime is reachable with the model loaded (1) or not (0)."),
		health: &healthGauge{desc: prometheus.NewDesc("hearth_runtime_health",
			"The model runtime's health: 1 for its state (healthy; degraded: it does not serve, e.g. wedged and not restarted by hearthd; restarting: hearthd restarts it), 0 for the others.",
			[]string{"state"}, nil)},
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_runtime_restarts_total",
			Help: "Times hearthd restarted the model runtime, by reason: wedged (it took requests and answered none), exited (the process ended on its own).",
		}, []string{"reason"}),
		wedges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_runtime_wedges_total",
			Help: "Times the model runtime was found wedged: requests in flight, nothing back from any of them and no answer to a one-token probe for wedge_timeout. A supervised one is restarted (hearth_runtime_restarts_total{reason=\"wedged\"}).",
		}),
		recovery: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "hearth_runtime_recovery_seconds",
			Help:    "Time from a restart of the model runtime (its wedge found, or its exit) to the model served again.",
			Buckets: []float64{1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300},
		}),
		modelLoad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_model_load_duration_seconds",
			Help: "Time the last load of the deployment's model took.",
		}),
	}
	for _, r := range []string{RestartWedged, RestartExited} {
		m.restarts.WithLabelValues(r) // every reason exported from the start, at 0
	}
	return m
}

func (m *runtimeMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.up, m.health, m.restarts, m.wedges, m.recovery, m.modelLoad)
}

// healthGauge exports the state read at each scrape as one series per
// state.
type healthGauge struct {
	desc *prometheus.Desc
	fn   scrapeFunc[string]
}

func (g *healthGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *healthGauge) Collect(ch chan<- prometheus.Metric) {
	f, ok := g.fn.get()
	if !ok {
		return
	}
	cur := f()
	for _, s := range RuntimeStates {
		v := 0.0
		if s == cur {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, v, s)
	}
}

// RegisterRuntimeUp sets the function read at each scrape for
// hearth_runtime_up. It must be cheap (a cached health state, not a probe).
// Until it is called the metric is absent; a later call replaces it.
func (n *Node) RegisterRuntimeUp(f func() bool) {
	if f == nil {
		n.rt.up.fn.set(nil)
		return
	}
	n.rt.up.fn.set(func() float64 {
		if f() {
			return 1
		}
		return 0
	})
}

// RegisterRuntimeHealth sets the function read at each scrape for
// hearth_runtime_health: one of RuntimeStates. It must be cheap.
func (n *Node) RegisterRuntimeHealth(f func() string) { n.rt.health.fn.set(f) }

// RuntimeRestarted counts one restart of the model runtime for reason
// (RestartWedged, RestartExited).
func (n *Node) RuntimeRestarted(reason string) { n.rt.restarts.WithLabelValues(reason).Inc() }

// RuntimeWedged counts one time the model runtime was found wedged.
func (n *Node) RuntimeWedged() { n.rt.wedges.Inc() }

// RuntimeRecovered records how long a restart took, from its cause to the
// model served again.
func (n *Node) RuntimeRecovered(d time.Duration) { n.rt.recovery.Observe(d.Seconds()) }

// SetModelLoadDuration records how long the last load of the model took.
func (n *Node) SetModelLoadDuration(d time.Duration) { n.rt.modelLoad.Set(d.Seconds()) }
