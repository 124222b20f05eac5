package bench

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	// The classic nearest-rank example: 15, 20, 35, 40, 50.
	five := ms(15, 20, 35, 40, 50)
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{five, 5, 15 * time.Millisecond},
		{five, 30, 20 * time.Millisecond},
		{five, 40, 20 * time.Millisecond},
		{five, 50, 35 * time.Millisecond},
		{five, 100, 50 * time.Millisecond},
		{hundred, 50, 50 * time.Millisecond},
		{hundred, 99, 99 * time.Millisecond},
		{hundred, 99.5, 100 * time.Millisecond},
		{ms(7), 99, 7 * time.Millisecond},
		{ms(7), 0, 7 * time.Millisecond},
		{nil, 50, 0},
	} {
		if got := Percentile(tc.samples, tc.p); got != tc.want {
			t.Errorf("Percentile(n=%d, %v) = %v, want %v", len(tc.samples), tc.p, got, tc.want)
		}
	}
}

func TestSummarizeSortsAndConverts(t *testing.T) {
	s := []time.Duration{300 * time.Microsecond, 100 * time.Microsecond, 200 * time.Microsecond, 1000 * time.Microsecond}
	d := Summarize(s)
	if d.N != 4 || d.P50 != 200 || d.P99 != 1000 || d.Max != 1000 || d.Mean != 400 {
		t.Fatalf("Summarize = %+v", d)
	}
	if s[0] != 100*time.Microsecond {
		t.Fatalf("samples not sorted: %v", s)
	}
	if (Summarize(nil) != Dist{}) {
		t.Fatal("empty summary not zero")
	}
}
