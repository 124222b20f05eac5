package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type runtimeMetrics struct {
	up        *funcGauge
	restarts  prometheus.Counter
	stuck     prometheus.Counter
	modelLoad prometheus.Gauge
}

func newRuntimeMetrics() *runtimeMetrics {
	return &runtimeMetrics{
		up: newFuncGauge("hearth_runtime_up",
			"Whether the model runtime is reachable with the model loaded (1) or not (0)."),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_runtime_restarts_total",
			Help: "Times the model runtime process was restarted by hearthd.",
		}),
		stuck: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "hearth_runtime_stuck_total",
			Help: "Times the model runtime was found stuck: taking generations and answering none. A supervised one is restarted (and counted in hearth_runtime_restarts_total).",
		}),
		modelLoad: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "hearth_model_load_duration_seconds",
			Help: "Time the last load of the deployment's model took.",
		}),
	}
}

func (m *runtimeMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.up, m.restarts, m.stuck, m.modelLoad)
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

// RuntimeRestarted counts one restart of the model runtime.
func (n *Node) RuntimeRestarted() { n.rt.restarts.Inc() }

// RuntimeStuck counts one time the model runtime was found stuck.
func (n *Node) RuntimeStuck() { n.rt.stuck.Inc() }

// SetModelLoadDuration records how long the last model load took.
func (n *Node) SetModelLoadDuration(d time.Duration) { n.rt.modelLoad.Set(d.Seconds()) }
