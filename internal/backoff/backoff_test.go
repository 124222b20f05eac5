package backoff

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func pauses(b *Backoff, n int) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = b.Next()
	}
	return out
}

func equal(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestDoublesToTheCapAndResets(t *testing.T) {
	b := &Backoff{Min: time.Second, Max: 5 * time.Second}
	s := time.Second
	if got, want := pauses(b, 6), []time.Duration{1 * s, 2 * s, 4 * s, 5 * s, 5 * s, 5 * s}; !equal(got, want) {
		t.Fatalf("pauses %v, want %v", got, want)
	}
	b.Reset()
	if got, want := pauses(b, 2), []time.Duration{1 * s, 2 * s}; !equal(got, want) {
		t.Fatalf("after Reset: %v, want %v", got, want)
	}
}

func TestOddSettings(t *testing.T) {
	// A cap below the minimum pauses the minimum every time.
	if got := pauses(&Backoff{Min: time.Second, Max: time.Millisecond}, 3); !equal(got, []time.Duration{time.Second, time.Second, time.Second}) {
		t.Fatalf("Max < Min: %v", got)
	}
	// A cap near the largest duration does not overflow into negative pauses.
	b := &Backoff{Min: time.Hour, Max: 1<<63 - 1}
	for i, d := range pauses(b, 80) {
		if d < time.Hour {
			t.Fatalf("pause %d = %v", i, d)
		}
	}
	if got := pauses(&Backoff{}, 3); !equal(got, []time.Duration{0, 0, 0}) {
		t.Fatalf("zero Backoff: %v", got)
	}
}

func TestJitterStaysInTheUpperHalf(t *testing.T) {
	const ms = time.Millisecond
	for _, c := range []struct {
		name string
		draw func(n int64) int64
		want []time.Duration
	}{
		{"lowest draw", func(int64) int64 { return 0 }, []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 400 * ms}},
		{"highest draw", func(n int64) int64 { return n - 1 }, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 800 * ms}},
	} {
		b := &Backoff{Min: 100 * ms, Max: 800 * ms, Jitter: true, Rand: c.draw}
		if got := pauses(b, 5); !equal(got, c.want) {
			t.Errorf("%s: pauses %v, want %v", c.name, got, c.want)
		}
	}
	// With the default source every pause lies in [d/2, d], and they differ.
	b := &Backoff{Min: time.Second, Max: time.Second, Jitter: true}
	seen := map[time.Duration]bool{}
	for range 100 {
		d := b.Next()
		if d < 500*ms || d > time.Second {
			t.Fatalf("jittered pause %v outside [500ms, 1s]", d)
		}
		seen[d] = true
	}
	if len(seen) < 50 {
		t.Fatalf("only %d distinct pauses in 100: no jitter", len(seen))
	}
}

func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := Sleep(context.Background(), 3*time.Second); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 3*time.Second {
			t.Fatalf("slept %v, want 3s", d)
		}

		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(time.Second, cancel)
		start = time.Now()
		if err := Sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
			t.Fatalf("Sleep = %v, want context.Canceled", err)
		}
		if d := time.Since(start); d != time.Second {
			t.Fatalf("cancelled after %v, want 1s", d)
		}
	})
}
