package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// SSHKeyStats is what the authorized_keys manager reports about itself,
// read at scrape time. It mirrors sshkeys.Stats; metrics does not import
// the sshkeys package.
type SSHKeyStats struct {
	Syncs    uint64 // sync calls
	Writes   uint64 // times the file was replaced
	Failures uint64 // sync calls that failed
}

type sshKeyCollector struct {
	stats                   scrapeFunc[SSHKeyStats]
	syncs, writes, failures *prometheus.Desc
}

func newSSHKeyCollector() *sshKeyCollector {
	return &sshKeyCollector{
		syncs:    prometheus.NewDesc("hearth_ssh_key_syncs_total", "Syncs of the managed authorized_keys entries.", nil, nil),
		writes:   prometheus.NewDesc("hearth_ssh_key_writes_total", "Times the authorized_keys file was rewritten.", nil, nil),
		failures: prometheus.NewDesc("hearth_ssh_key_sync_failures_total", "Syncs of the authorized_keys entries that failed.", nil, nil),
	}
}

func (c *sshKeyCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.syncs
	ch <- c.writes
	ch <- c.failures
}

func (c *sshKeyCollector) Collect(ch chan<- prometheus.Metric) {
	f, ok := c.stats.get()
	if !ok {
		return
	}
	s := f()
	ch <- prometheus.MustNewConstMetric(c.syncs, prometheus.CounterValue, float64(s.Syncs))
	ch <- prometheus.MustNewConstMetric(c.writes, prometheus.CounterValue, float64(s.Writes))
	ch <- prometheus.MustNewConstMetric(c.failures, prometheus.CounterValue, float64(s.Failures))
}

// RegisterSSHKeys sets the function read at each scrape for the
// hearth_ssh_key_* metrics. It must be cheap and safe for concurrent use.
// Until it is called the metrics are absent; a later call replaces it.
func (n *Node) RegisterSSHKeys(f func() SSHKeyStats) { n.ssh.stats.set(f) }
