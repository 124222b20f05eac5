package metrics

import (
	"math"
	"sort"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"
)

// tokenHistogram is a histogram observed once per relayed token
// (hearth_inter_token_latency_seconds). client_golang's histogram (1.15, and
// 1.25 alike) keeps its native buckets in a sync.Map: an observation is a
// Load with interface hashing and half a dozen atomics, which showed in
// hearthd's CPU profile at one stream. This one counts in slices under a
// mutex, held for a few increments.
//
// It writes what client_golang's histogram with the same options writes:
// the classic buckets, and native ones at schema 3 (factor 1.1) with the
// default zero threshold, halving the resolution whenever more than
// maxBuckets are in use (TestTokenHistogramMatchesClientGolang compares the
// two, past the limit too). client_golang would reset instead once
// NativeHistogramMinResetDuration (an hour) has passed since the last reset;
// this one never resets, which only keeps more history.
type tokenHistogram struct {
	desc       *prometheus.Desc
	upper      []float64 // classic upper bounds, ascending; +Inf implied
	maxBuckets int

	mu      sync.Mutex
	count   uint64
	sum     float64
	classic []uint64 // per bucket, not cumulative; the last is +Inf's
	schema  int32
	zero    uint64
	pos     nativeBuckets // values above the zero threshold
	neg     nativeBuckets // below minus it
}

// Native-histogram constants as client_golang has them: the schema factor
// 1.1 picks, its zero threshold, and the lowest schema it reduces to.
const (
	tokenSchema      = 3
	nativeZero       = prometheus.DefNativeHistogramZeroThreshold
	nativeMinSchema  = -4
	nativeMaxBuckets = 160
)

// nativeBounds are the bucket bounds of schemas 1 to 3 within a power of
// two, as fractions from math.Frexp (client_golang's table; its literals,
// so that a value falls in the same bucket in both).
var nativeBounds = [...][]float64{
	1: {0.5, 0.7071067811865475},
	2: {0.5, 0.5946035575013605, 0.7071067811865475, 0.8408964152537144},
	3: {
		0.5, 0.5452538663326288, 0.5946035575013605, 0.6484197773255048,
		0.7071067811865475, 0.7711054127039704, 0.8408964152537144, 0.9170040432046711,
	},
}

func newTokenHistogram(name, help string, buckets []float64) *tokenHistogram {
	return &tokenHistogram{
		desc:       prometheus.NewDesc(name, help, nil, nil),
		upper:      buckets,
		maxBuckets: nativeMaxBuckets,
		classic:    make([]uint64, len(buckets)+1),
		schema:     tokenSchema,
	}
}

// Observe records v.
func (h *tokenHistogram) Observe(v float64) {
	// As client_golang: the first bucket whose bound is at least v; NaN
	// counts in +Inf's and the sum, not in the native buckets.
	ci := sort.SearchFloat64s(h.upper, v)
	h.mu.Lock()
	h.count++
	h.sum += v
	h.classic[ci]++
	if !math.IsNaN(v) {
		key := nativeKey(v, h.schema)
		created := false
		switch {
		case v > nativeZero:
			created = h.pos.add(key, 1)
		case v < -nativeZero:
			created = h.neg.add(key, 1)
		default:
			h.zero++
		}
		if created && h.pos.used+h.neg.used > h.maxBuckets {
			h.halveResolution()
		}
	}
	h.mu.Unlock()
}

// nativeKey is the index of v's native bucket at schema, as client_golang
// computes it (an infinity falls one past the largest finite value).
func nativeKey(v float64, schema int32) int {
	inf := math.IsInf(v, 0)
	if inf {
		v = math.MaxFloat64
	}
	frac, exp := math.Frexp(math.Abs(v))
	var key int
	if schema > 0 {
		bounds := nativeBounds[schema]
		key = sort.SearchFloat64s(bounds, frac) + (exp-1)*len(bounds)
	} else {
		key = exp
		if frac == 0.5 {
			key--
		}
		div := 1 << -schema
		key = (key + div - 1) / div
	}
	if inf {
		key++
	}
	return key
}

// halveResolution lowers the schema by one: every two buckets become one.
func (h *tokenHistogram) halveResolution() {
	if h.schema == nativeMinSchema {
		return
	}
	h.schema--
	h.pos = h.pos.halved()
	h.neg = h.neg.halved()
}

// nativeBuckets counts the buckets of one sign by key, in a slice from key
// lo on. A bucket is in use once it counted anything (counts only grow).
type nativeBuckets struct {
	lo     int
	counts []uint64
	used   int
}

// add adds c to bucket key and reports whether that put it in use.
func (b *nativeBuckets) add(key int, c uint64) (created bool) {
	switch {
	case len(b.counts) == 0:
		b.lo = key
		b.counts = make([]uint64, 1, 16)
	case key < b.lo:
		grown := make([]uint64, len(b.counts)+b.lo-key, cap(b.counts)+b.lo-key)
		copy(grown[b.lo-key:], b.counts)
		b.counts, b.lo = grown, key
	case key >= b.lo+len(b.counts):
		b.counts = append(b.counts, make([]uint64, key-b.lo-len(b.counts)+1)...)
	}
	i := key - b.lo
	created = b.counts[i] == 0
	if created {
		b.used++
	}
	b.counts[i] += c
	return created
}

// halved is b at the next lower schema, keys merged as client_golang merges
// them.
func (b nativeBuckets) halved() nativeBuckets {
	var out nativeBuckets
	for i, c := range b.counts {
		if c == 0 {
			continue
		}
		key := b.lo + i
		if key > 0 {
			key++
		}
		out.add(key/2, c)
	}
	return out
}

// spans encodes the buckets in use as client_golang does: a new span after
// a gap of more than two, smaller gaps filled with empty buckets, counts as
// deltas from the previous bucket's.
func (b *nativeBuckets) spans() ([]*dto.BucketSpan, []int64) {
	if b.used == 0 {
		return nil, nil
	}
	var (
		spans  []*dto.BucketSpan
		deltas []int64
		prev   int64
		next   int
		first  = true
	)
	appendDelta := func(count int64) {
		*spans[len(spans)-1].Length++
		deltas = append(deltas, count-prev)
		prev = count
	}
	for i, c := range b.counts {
		if c == 0 {
			continue
		}
		key := b.lo + i
		gap := int32(key - next)
		if first || gap > 2 {
			spans = append(spans, &dto.BucketSpan{Offset: proto.Int32(gap), Length: proto.Uint32(0)})
		} else {
			for range gap {
				appendDelta(0)
			}
		}
		first = false
		appendDelta(int64(c))
		next = key + 1
	}
	return spans, deltas
}

// Describe and Collect make it a prometheus.Collector of itself.
func (h *tokenHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }
func (h *tokenHistogram) Collect(ch chan<- prometheus.Metric) { ch <- h }

// Desc is its descriptor (prometheus.Metric).
func (h *tokenHistogram) Desc() *prometheus.Desc { return h.desc }

// Write writes the histogram as client_golang's does (prometheus.Metric).
func (h *tokenHistogram) Write(out *dto.Metric) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	his := &dto.Histogram{
		SampleCount:   proto.Uint64(h.count),
		SampleSum:     proto.Float64(h.sum),
		Bucket:        make([]*dto.Bucket, len(h.upper)),
		ZeroThreshold: proto.Float64(nativeZero),
		Schema:        proto.Int32(h.schema),
		ZeroCount:     proto.Uint64(h.zero),
	}
	var cum uint64
	for i, upper := range h.upper {
		cum += h.classic[i]
		his.Bucket[i] = &dto.Bucket{CumulativeCount: proto.Uint64(cum), UpperBound: proto.Float64(upper)}
	}
	his.NegativeSpan, his.NegativeDelta = h.neg.spans()
	his.PositiveSpan, his.PositiveDelta = h.pos.spans()
	out.Histogram = his
	return nil
}
