package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func gatherFamily(t *testing.T, g prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	t.Fatalf("metric %s not found", name)
	return nil
}

// gatherOne returns the single series of the family name.
func gatherOne(t *testing.T, g prometheus.Gatherer, name string) *dto.Metric {
	t.Helper()
	mf := gatherFamily(t, g, name)
	if len(mf.GetMetric()) != 1 {
		t.Fatalf("%s has %d series, want 1", name, len(mf.GetMetric()))
	}
	return mf.GetMetric()[0]
}
