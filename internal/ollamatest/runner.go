package ollamatest

import (
	"bytes"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
)

// RunnerCPUTicks returns the CPU time, in clock ticks, used so far by the
// model runners (`ollama runner` children) of this instance, and how many
// there are. A runner that generates burns CPU steadily; one that stopped
// burns none, so tests use the difference to prove a generation ended.
func (i *Instance) RunnerCPUTicks() (ticks int64, runners int) {
	return RunnerCPUTicks(i.PID())
}

// RunnerCPUTicks is Instance.RunnerCPUTicks for the runners of any
// `ollama serve` process, by its pid.
func RunnerCPUTicks(parent int) (ticks int64, runners int) {
	for _, pid := range proctest.Children(parent) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if !bytes.Contains(cmdline, []byte("runner")) {
			continue
		}
		t, err := proctest.CPUTicks(pid)
		if err != nil {
			continue // exited meanwhile
		}
		ticks += t
		runners++
	}
	return ticks, runners
}

// ExpectRunnerStops checks that stop ends the generation the runners of
// the ollama serve process parent are busy with, within 100 ms: it times
// how long the runners take to burn 10 CPU ticks while generating, calls
// stop, and from 100 ms after it, over a window at least that long (and at
// least 500 ms), wants them to burn at most 2. It returns when stop was
// called.
//
// The fixed pauses are the measurement itself: CPU a real process did not
// use can only be seen over a span of time, and the window scales with how
// fast this machine generates, so a slow machine gets a longer one.
func ExpectRunnerStops(t testing.TB, parent int, stop func()) (stopped time.Time) {
	t.Helper()
	start, runners := RunnerCPUTicks(parent)
	if runners == 0 {
		t.Fatal("no ollama runner process found")
	}
	t0 := time.Now()
	testutil.WaitFor(t, 20*time.Second, "the runner to burn 10 CPU ticks while generating", func() bool {
		now, _ := RunnerCPUTicks(parent)
		return now-start >= 10
	})
	busy := time.Since(t0)
	window := max(busy, 500*time.Millisecond)

	stopped = time.Now()
	stop()
	time.Sleep(100*time.Millisecond - time.Since(stopped))
	after, _ := RunnerCPUTicks(parent)
	time.Sleep(window)
	later, _ := RunnerCPUTicks(parent)
	if used := later - after; used > 2 {
		t.Fatalf("runner used %d ticks in the %v from 100 ms after the stop; it used 10 in %v while generating", used, window, busy)
	}
	t.Logf("runner idle over %v from 100 ms after the stop", window)
	return stopped
}
