package metrics

import (
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
)

// newBuildInfo is the constant hearth_build_info{version,goversion} 1, the
// usual way to join a version onto other series in queries.
func newBuildInfo(version string) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "hearth_build_info",
		Help: "A metric with a constant '1' value labeled by the hearth version and the Go version it was built with.",
		ConstLabels: prometheus.Labels{
			"version":   version,
			"goversion": runtime.Version(),
		},
	})
	g.Set(1)
	return g
}
