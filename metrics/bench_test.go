package metrics

import (
	"net/http"
	"testing"
	"time"
)

// The hot-path benchmarks report allocations; TestHotPathAllocs asserts
// there are none.

func BenchmarkRequest(b *testing.B) {
	n := NewNode("bench")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Request(RouteChatCompletions, http.StatusOK)
		}
	})
}

func BenchmarkRequestWithLabelValues(b *testing.B) {
	// The baseline Request improves on: resolving the child per call.
	n := NewNode("bench")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.http.requests.WithLabelValues(RouteChatCompletions, "200").Inc()
		}
	})
}

func BenchmarkObserveTTFT(b *testing.B) {
	n := NewNode("bench")
	b.ReportAllocs()
	d := 37 * time.Millisecond
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.ObserveTTFT(RouteChatCompletions, d)
		}
	})
}

func BenchmarkObserveInterToken(b *testing.B) {
	n := NewNode("bench")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		d := 1200 * time.Microsecond
		for pb.Next() {
			n.ObserveInterToken(d)
			d += time.Microsecond
			if d > 50*time.Millisecond {
				d = 100 * time.Microsecond
			}
		}
	})
}

func BenchmarkGeneration(b *testing.B) {
	n := NewNode("bench")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Generation(RouteChatCompletions, "bench", FinishStop, true)
		}
	})
}
