package nodeapi

import (
	"math"
	"time"
)

// UsageBucket is what one managed API key did on a node within one minute:
// a sealed increment the node keeps (in its state) until a report that
// carries it is accepted. Seq numbers a node's buckets, increasing; the
// control plane keeps, per node, the last Seq it applied, in the same commit
// as the counts, so a report sent again (its answer lost) or to another
// replica never counts a bucket twice, and a node that could not report
// for an hour sends what it kept then. Several buckets may share a key and a
// minute (a minute sealed early, at a wipe or a shutdown, and its rest
// later): they add up.
type UsageBucket struct {
	Seq    uint64    `json:"seq"`
	KeyID  string    `json:"key_id"`
	Minute time.Time `json:"minute"` // the minute's start, UTC
	// Requests, PromptTokens and CompletionTokens count as the key's
	// cumulative usage does; ReasoningTokens are part of CompletionTokens.
	Requests         uint64 `json:"requests,omitempty"`
	PromptTokens     uint64 `json:"prompt_tokens,omitempty"`
	CompletionTokens uint64 `json:"completion_tokens,omitempty"`
	ReasoningTokens  uint64 `json:"reasoning_tokens,omitempty"`
	// Errors counts the key's requests answered with an error or ended by
	// one.
	Errors uint64 `json:"errors,omitempty"`
	// TTFT is the histogram of the requests' times to first token:
	// TTFT[i] counts those up to TTFTBoundsMS[i] milliseconds (and above
	// the bound before), the entry after the last bound those above every
	// bound. Trailing zeros are left out.
	TTFT []uint64 `json:"ttft,omitempty"`
}

// TTFTBoundsMS are the upper bounds, in milliseconds, of the time-to-first-
// token histogram of a usage bucket: about 1.5× apart from 5 ms to a
// minute, so a percentile read from it is within a bin's width (linear
// within the bin, as Prometheus' histogram_quantile reads one).
var TTFTBoundsMS = [...]float64{5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 400, 500, 750, 1000, 1500, 2000,
	3000, 5000, 7500, 10000, 15000, 20000, 30000, 60000}

// TTFTBins is the length of a full TTFT histogram: one bin per bound and
// one above them all.
const TTFTBins = len(TTFTBoundsMS) + 1

// TTFTBin is the histogram bin of a time to first token.
func TTFTBin(d time.Duration) int {
	ms := float64(d) / float64(time.Millisecond)
	for i, b := range TTFTBoundsMS {
		if ms <= b {
			return i
		}
	}
	return len(TTFTBoundsMS)
}

// TTFTQuantile reads the q-quantile (0 < q < 1), in milliseconds, from a
// TTFT histogram: linear within the bin it falls in, the lowest bin
// starting at 0; in the bin above every bound it is that last bound. ok
// is false for an empty histogram.
func TTFTQuantile(h []uint64, q float64) (ms float64, ok bool) {
	var total uint64
	for _, c := range h {
		total += c
	}
	if total == 0 {
		return 0, false
	}
	rank := q * float64(total)
	var below uint64
	for i, c := range h {
		if c == 0 || float64(below+c) < rank {
			below += c
			continue
		}
		if i >= len(TTFTBoundsMS) {
			return TTFTBoundsMS[len(TTFTBoundsMS)-1], true
		}
		lo := 0.0
		if i > 0 {
			lo = TTFTBoundsMS[i-1]
		}
		hi := TTFTBoundsMS[i]
		v := lo + (hi-lo)*(rank-float64(below))/float64(c)
		return math.Round(v*10) / 10, true
	}
	return TTFTBoundsMS[len(TTFTBoundsMS)-1], true
}

// AddTTFT adds histogram b into a (growing a as needed) and returns it,
// trailing zeros trimmed.
func AddTTFT(a, b []uint64) []uint64 {
	if len(b) > len(a) {
		a = append(a, make([]uint64, len(b)-len(a))...)
	}
	for i, c := range b {
		a[i] += c
	}
	return TrimTTFT(a)
}

// TrimTTFT drops a histogram's trailing zero bins.
func TrimTTFT(h []uint64) []uint64 {
	n := len(h)
	for n > 0 && h[n-1] == 0 {
		n--
	}
	return h[:n]
}

// MaxUsageBuckets bounds the usage buckets of one report; a node with more
// waiting sends them in several reports, oldest first.
const MaxUsageBuckets = 1000
