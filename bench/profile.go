package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"
)

// profileWindow is when, within a side's load, hearthd's profiles are
// taken: after the ramp (streams all running), ending before the load stops
// starting requests; with ramp, from the load's start, the execution trace
// covering the ramp (traceSeconds), which is where a run at thousands of
// streams can fall behind for good. seconds is the whole window's length.
func profileWindow(sc Scenario, ramp bool) (wait time.Duration, seconds, traceSeconds int) {
	wait, traceSeconds = sc.Ramp+500*time.Millisecond, 2
	if ramp {
		wait = 100 * time.Millisecond
		traceSeconds = max(traceSeconds, int((sc.Ramp+time.Second-1)/time.Second))
	}
	seconds = int((sc.Duration - wait - 500*time.Millisecond) / time.Second)
	seconds = min(max(seconds, 1), 10)
	return wait, max(seconds, traceSeconds+1), traceSeconds
}

// profileHearthd takes a CPU profile of hearthd from its metrics listener
// while a scenario runs, then heap and goroutine snapshots (still under
// load) and two seconds of its execution trace, and writes them to dir as
// <scenario>.cpu.pprof etc. (the heap also as text, <scenario>.heap.txt,
// for its MemStats; the trace <scenario>.trace.out), from the ramp's start
// with ramp (profileWindow). The returned function waits for it and
// reports what failed.
func profileHearthd(ctx context.Context, metricsURL, dir string, sc Scenario, ramp bool) func() error {
	done := make(chan error, 1)
	go func() {
		wait, secs, traceSecs := profileWindow(sc, ramp)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			done <- ctx.Err()
			return
		}
		get := func(path, file string) error {
			return FetchProfile(ctx, metricsURL+path, filepath.Join(dir, sc.Name+"."+file), time.Duration(secs)*time.Second+30*time.Second)
		}
		// First the execution trace: where a request waits (go tool trace
		// -pprof=sched|net|sync FILE); then the CPU profile.
		err := get(fmt.Sprintf("/debug/pprof/trace?seconds=%d", traceSecs), "trace.out")
		if err == nil {
			err = get(fmt.Sprintf("/debug/pprof/profile?seconds=%d", max(secs-traceSecs, 1)), "cpu.pprof")
		}
		if err == nil {
			err = get("/debug/pprof/heap", "heap.pprof")
		}
		if err == nil {
			// The text form ends with runtime.MemStats: stacks, heap in
			// use and released, what RSS is made of beyond the live heap.
			err = get("/debug/pprof/heap?debug=1", "heap.txt")
		}
		if err == nil {
			err = get("/debug/pprof/goroutine", "goroutine.pprof")
		}

		done <- err
	}()
	return func() error { return <-done }
}

// fetchProfile saves what url (a /debug/pprof/ endpoint) answers to file,
// waiting at most timeout.
func FetchProfile(ctx context.Context, url, file string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("profile request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: status %s", url, resp.Status)
	}
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("profile file: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("save %s: %w", url, err)
	}
	return f.Close()
}
