package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// controlSyncCollector exposes how far the node lags behind the control
// plane. Both values are computed at scrape time from the time of the last
// successful sync, so the lag keeps growing while the control plane is
// unreachable, without anyone having to update it.
type controlSyncCollector struct {
	lastSync scrapeFunc[time.Time]
	now      func() time.Time
	start    time.Time

	lag, last *prometheus.Desc
}

func newControlSyncCollector(now func() time.Time, start time.Time) *controlSyncCollector {
	return &controlSyncCollector{
		now:   now,
		start: start,
		lag: prometheus.NewDesc("hearth_control_sync_lag_seconds",
			"Time since the node last synced its desired state with the control plane (since start-up if it never has).", nil, nil),
		last: prometheus.NewDesc("hearth_control_last_sync_timestamp_seconds",
			"Unix time of the last successful desired-state sync with the control plane, 0 if never.", nil, nil),
	}
}

func (c *controlSyncCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.lag
	ch <- c.last
}

func (c *controlSyncCollector) Collect(ch chan<- prometheus.Metric) {
	f, ok := c.lastSync.get()
	if !ok {
		return
	}
	last := f()
	since := last
	if since.IsZero() {
		since = c.start
	}
	lag := max(c.now().Sub(since).Seconds(), 0)
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, lag)
	ch <- prometheus.MustNewConstMetric(c.last, prometheus.GaugeValue, timestampSeconds(last))
}

// newDeliveries counts, on the node, the desired states it received: each
// one is a delivery, and summed over the nodes the control plane's rate of
// them (counted where it is sure to have arrived).
func newDeliveries() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "hearth_control_desired_state_deliveries_total",
		Help: "New desired states the node received from the control plane.",
	})
}

// DesiredStateReceived counts one new desired state received from the
// control plane (not the one restored from disk at start).
func (n *Node) DesiredStateReceived() { n.deliveries.Inc() }

// RegisterControlSync sets the function, read at each scrape, that returns
// the time of the node's last successful sync with the control plane (zero
// if none yet). Until it is called the sync metrics are absent; a later
// call replaces it.
func (n *Node) RegisterControlSync(lastSync func() time.Time) { n.sync.lastSync.set(lastSync) }
