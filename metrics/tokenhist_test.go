package metrics

import (
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// reference is client_golang's histogram with the options tokenHistogram
// stands for.
func reference(buckets []float64) prometheus.Histogram {
	return latencyHistogram("hearth_inter_token_latency_seconds", "help", buckets).WithLabelValues().(prometheus.Histogram)
}

func written(t *testing.T, m prometheus.Metric) *dto.Metric {
	t.Helper()
	var out dto.Metric
	if err := m.Write(&out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// tokenHistogram writes what client_golang's histogram with the same
// options writes for the same observations: classic and native buckets,
// count and sum, with values of every kind (zero, negative, NaN, the
// infinities, the classic bounds themselves, values on native bounds),
// and past the native bucket limit, where both halve their resolution.
func TestTokenHistogramMatchesClientGolang(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	gaps := func(n int, lo, hi float64) []float64 {
		vs := make([]float64, n)
		for i := range vs {
			vs[i] = math.Exp(math.Log(lo) + rng.Float64()*(math.Log(hi)-math.Log(lo)))
		}
		return vs
	}
	special := []float64{0, -0.001, -3, math.NaN(), math.Inf(1), math.Inf(-1), 1e-300, -1e-300,
		0.5, 1, 2, 0.25, math.Ldexp(0.5946035575013605, -10), math.MaxFloat64}
	special = append(special, interTokenBuckets()...)
	for _, c := range []struct {
		name   string
		values []float64
		schema int32 // the native schema both end at
	}{
		{"no observation", nil, 3},
		{"inter-token gaps, 100 µs to 1 s", gaps(5000, 1e-4, 1), 3},
		{"special values", special, 3},
		{"a spread past 160 buckets", gaps(20000, 1e-9, 1e6), 1},
		{"the widest spread", append(gaps(20000, 1e-300, 1e300), special...), -3},
	} {
		t.Run(c.name, func(t *testing.T) {
			ref, got := reference(interTokenBuckets()), newTokenHistogram("hearth_inter_token_latency_seconds", "help", interTokenBuckets())
			for _, v := range c.values {
				ref.Observe(v)
				got.Observe(v)
			}
			want, have := written(t, ref), written(t, got)
			// NaN in the sum never equals itself; compare its bits.
			if ws, hs := want.GetHistogram().GetSampleSum(), have.GetHistogram().GetSampleSum(); math.Float64bits(ws) != math.Float64bits(hs) && !(math.IsNaN(ws) && math.IsNaN(hs)) {
				t.Fatalf("sum %v, client_golang %v", hs, ws)
			}
			want.Histogram.SampleSum, have.Histogram.SampleSum = nil, nil
			if have.String() != want.String() {
				t.Fatalf("written:\n%v\nclient_golang:\n%v", have, want)
			}
			if s := have.GetHistogram().GetSchema(); s != c.schema {
				t.Fatalf("schema %d, want %d", s, c.schema)
			}
			if n := len(have.GetHistogram().GetPositiveDelta()) + len(have.GetHistogram().GetNegativeDelta()); n > 3*nativeMaxBuckets {
				t.Fatalf("%d native buckets written", n)
			}
		})
	}
}

// Observations from many goroutines, with scrapes between them, are all
// counted (go test -race checks the locking).
func TestTokenHistogramConcurrent(t *testing.T) {
	h := newTokenHistogram("x", "help", interTokenBuckets())
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 1000 {
				h.Observe((time.Duration(g*1000+i) * time.Microsecond).Seconds())
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			written(t, h)
		}
	})
	wg.Wait()
	m := written(t, h).GetHistogram()
	if m.GetSampleCount() != 4000 {
		t.Fatalf("count %d, want 4000", m.GetSampleCount())
	}
	var native uint64 = m.GetZeroCount()
	var c int64
	for _, d := range m.GetPositiveDelta() {
		c += d
		native += uint64(c)
	}
	if native != 4000 {
		t.Fatalf("native buckets hold %d observations, want 4000", native)
	}
}
