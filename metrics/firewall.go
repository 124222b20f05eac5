package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// FirewallStats is what the firewall reports about itself, read at scrape
// time. It mirrors firewall.Stats field by field so the daemon can convert
// with a struct literal; metrics does not import the firewall package.
type FirewallStats struct {
	Applies        uint64    // successful applies
	ApplyFailures  uint64    // applies rejected by validation or by nftables
	DriftRepairs   uint64    // times the table was found changed and re-applied
	DriftFailures  uint64    // drift checks or repairs that failed
	Rules          int       // rules in force
	LastApply      time.Time // last successful write of the table; zero if never
	LastSuccess    time.Time // last time the table was known to be right; zero if never
	LastDriftCheck time.Time // last completed drift check; zero if never
}

// firewallCollector reads FirewallStats at scrape time. The firewall keeps
// its own monotonic counts, so exposing them as const counter values is
// exact and needs no bookkeeping here.
type firewallCollector struct {
	stats scrapeFunc[FirewallStats]

	applies, applyFailures, driftRepairs, driftFailures *prometheus.Desc
	rules                                               *prometheus.Desc
	lastApply, lastSuccess, lastDriftCheck              *prometheus.Desc
}

func newFirewallCollector() *firewallCollector {
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &firewallCollector{
		applies:        d("hearth_firewall_applies_total", "Successful applies of the firewall rule set."),
		applyFailures:  d("hearth_firewall_apply_failures_total", "Firewall applies that failed validation or nftables."),
		driftRepairs:   d("hearth_firewall_drift_repairs_total", "Times the firewall table was found changed and re-applied."),
		driftFailures:  d("hearth_firewall_drift_failures_total", "Firewall drift checks or repairs that failed."),
		rules:          d("hearth_firewall_rules", "Firewall rules in force."),
		lastApply:      d("hearth_firewall_last_apply_timestamp_seconds", "Unix time of the last successful write of the firewall table, 0 if never."),
		lastSuccess:    d("hearth_firewall_last_success_timestamp_seconds", "Unix time the firewall table was last known to hold the desired rules, 0 if never."),
		lastDriftCheck: d("hearth_firewall_last_drift_check_timestamp_seconds", "Unix time of the last completed firewall drift check, 0 if never."),
	}
}

func (c *firewallCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.applies, c.applyFailures, c.driftRepairs, c.driftFailures,
		c.rules, c.lastApply, c.lastSuccess, c.lastDriftCheck} {
		ch <- d
	}
}

func (c *firewallCollector) Collect(ch chan<- prometheus.Metric) {
	f, ok := c.stats.get()
	if !ok {
		return
	}
	s := f()
	counter := func(d *prometheus.Desc, v uint64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
	}
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter(c.applies, s.Applies)
	counter(c.applyFailures, s.ApplyFailures)
	counter(c.driftRepairs, s.DriftRepairs)
	counter(c.driftFailures, s.DriftFailures)
	gauge(c.rules, float64(s.Rules))
	gauge(c.lastApply, timestampSeconds(s.LastApply))
	gauge(c.lastSuccess, timestampSeconds(s.LastSuccess))
	gauge(c.lastDriftCheck, timestampSeconds(s.LastDriftCheck))
}

// RegisterFirewall sets the function read at each scrape for the
// hearth_firewall_* metrics. It must be cheap and safe for concurrent use.
// Until it is called the metrics are absent; a later call replaces it.
func (n *Node) RegisterFirewall(f func() FirewallStats) { n.fw.stats.set(f) }
