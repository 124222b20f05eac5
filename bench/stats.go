package bench

import (
	"math"
	"slices"
	"time"
)

// Percentile returns the p-th percentile (0 < p ≤ 100) of sorted by the
// nearest-rank method: the smallest sample such that at least p% of the
// samples are ≤ it. It returns 0 for no samples.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(n)))
	rank = min(max(rank, 1), n)
	return sorted[rank-1]
}

// Dist summarises a latency distribution.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_us"`
	P50  float64 `json:"p50_us"`
	P90  float64 `json:"p90_us"`
	P99  float64 `json:"p99_us"`
	Max  float64 `json:"max_us"`
}

// Summarize sorts samples in place and summarises them, in microseconds.
func Summarize(samples []time.Duration) Dist {
	if len(samples) == 0 {
		return Dist{}
	}
	slices.Sort(samples)
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	return Dist{
		N:    len(samples),
		Mean: sum / float64(len(samples)) / float64(time.Microsecond),
		P50:  us(Percentile(samples, 50)),
		P90:  us(Percentile(samples, 90)),
		P99:  us(Percentile(samples, 99)),
		Max:  us(samples[len(samples)-1]),
	}
}
