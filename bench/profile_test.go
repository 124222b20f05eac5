package bench

import (
	"testing"
	"time"
)

func TestProfileWindow(t *testing.T) {
	c10000 := Scenario{Duration: 20 * time.Second, Ramp: 5 * time.Second}
	for _, tc := range []struct {
		name            string
		sc              Scenario
		ramp            bool
		wait            time.Duration
		secs, traceSecs int
	}{
		// After the ramp: 2 s of trace, the window to 500 ms before the end.
		{"after the ramp", c10000, false, 5500 * time.Millisecond, 10, 2},
		{"short", Scenario{Duration: 2 * time.Second}, false, 500 * time.Millisecond, 3, 2},
		// From the start: the trace spans the whole ramp.
		{"with the ramp", c10000, true, 100 * time.Millisecond, 10, 5},
		{"ramp of 2.5 s", Scenario{Duration: 12 * time.Second, Ramp: 2500 * time.Millisecond}, true, 100 * time.Millisecond, 10, 3},
		{"no ramp", Scenario{Duration: 10 * time.Second}, true, 100 * time.Millisecond, 9, 2},
	} {
		wait, secs, traceSecs := profileWindow(tc.sc, tc.ramp)
		if wait != tc.wait || secs != tc.secs || traceSecs != tc.traceSecs {
			t.Errorf("%s: wait %v, %d s, trace %d s; want %v, %d s, trace %d s",
				tc.name, wait, secs, traceSecs, tc.wait, tc.secs, tc.traceSecs)
		}
		if secs <= traceSecs {
			t.Errorf("%s: no time left for the CPU profile after the trace", tc.name)
		}
	}
}
