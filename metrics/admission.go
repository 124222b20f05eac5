package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Rejection reasons, values of the reason label of
// hearth_rejected_requests_total.
const (
	// RejectQueueFull: every generation slot busy and the wait queue full.
	RejectQueueFull = "queue_full"
	// RejectDraining: the daemon is shutting down and takes no new work.
	RejectDraining = "draining"
	// RejectNotReady: the model is not loaded yet.
	RejectNotReady = "not_ready"
	// RejectKeyLimit: the API key's requests or tokens per minute are used up.
	RejectKeyLimit = "key_rate_limit"
	// RejectSwitching: the deployment was switching its model for longer
	// than a request may wait.
	RejectSwitching = "model_switch"
)

type admissionMetrics struct {
	queueDepth *funcGauge
	rejected   *prometheus.CounterVec
	children   *childCache[string, prometheus.Counter]
}

func newAdmissionMetrics() *admissionMetrics {
	m := &admissionMetrics{
		queueDepth: newFuncGauge("hearth_queue_depth",
			"Chat completions waiting for a generation slot."),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "hearth_rejected_requests_total",
			Help: "Chat completions turned away before generating (HTTP 429/503), by reason.",
		}, []string{"reason"}),
	}
	m.children = newChildCache(func(reason string) prometheus.Counter {
		return m.rejected.WithLabelValues(reason)
	})
	return m
}

func (m *admissionMetrics) register(reg prometheus.Registerer) {
	reg.MustRegister(m.queueDepth, m.rejected)
}

// RegisterQueueDepth sets the function read at each scrape for
// hearth_queue_depth. Until it is called the metric is absent; a later call
// replaces the function.
func (n *Node) RegisterQueueDepth(f func() int) {
	if f == nil {
		n.adm.queueDepth.fn.set(nil)
		return
	}
	n.adm.queueDepth.fn.set(func() float64 { return float64(f()) })
}

// Rejected counts a request turned away by admission control. reason
// should be one of the Reject constants or another value from a fixed set
// the caller owns; it becomes a label value.
func (n *Node) Rejected(reason string) { n.adm.children.get(reason).Inc() }
