package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// childCache maps a label key to its resolved child (a counter, an
// observer, or several resolved together). Reads are one
// atomic load and a map lookup, so the hot path neither locks nor allocates
// (CounterVec.WithLabelValues builds a label slice and takes a read lock on
// every call). Misses copy the map under a mutex; callers bound the key set,
// so the map stops growing after warm-up.
type childCache[K comparable, V any] struct {
	mu      sync.Mutex
	m       atomic.Pointer[map[K]V]
	resolve func(K) V
}

func newChildCache[K comparable, V any](resolve func(K) V) *childCache[K, V] {
	c := &childCache[K, V]{resolve: resolve}
	m := map[K]V{}
	c.m.Store(&m)
	return c
}

func (c *childCache[K, V]) get(k K) V {
	if ctr, ok := (*c.m.Load())[k]; ok {
		return ctr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := *c.m.Load()
	if ctr, ok := old[k]; ok {
		return ctr
	}
	ctr := c.resolve(k)
	m := make(map[K]V, len(old)+1)
	for key, v := range old {
		m[key] = v
	}
	m[k] = ctr
	c.m.Store(&m)
	return ctr
}

// scrapeFunc holds a function, registered after construction, that a
// collector calls at scrape time. Until one is set the collector emits
// nothing for it.
type scrapeFunc[T any] struct{ p atomic.Pointer[func() T] }

func (s *scrapeFunc[T]) set(f func() T) {
	if f == nil {
		s.p.Store(nil)
		return
	}
	s.p.Store(&f)
}

func (s *scrapeFunc[T]) get() (func() T, bool) {
	f := s.p.Load()
	if f == nil {
		return nil, false
	}
	return *f, true
}

// funcGauge is a gauge whose value is read from a registered function at
// scrape time. Unlike prometheus.GaugeFunc it can be registered with the
// registry at construction and given its function later (or never), so
// callers have no registration errors to handle.
type funcGauge struct {
	desc *prometheus.Desc
	fn   scrapeFunc[float64]
}

func newFuncGauge(name, help string) *funcGauge {
	return &funcGauge{desc: prometheus.NewDesc(name, help, nil, nil)}
}

func (g *funcGauge) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g *funcGauge) Collect(ch chan<- prometheus.Metric) {
	if f, ok := g.fn.get(); ok {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, f())
	}
}

// timestampSeconds converts t to Unix seconds; the zero time ("never")
// becomes 0, the convention for *_timestamp_seconds metrics.
func timestampSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.UnixNano()) / 1e9
}
