package gopool

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestPoolReusesItsGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := New(10 * time.Second)
		var ran atomic.Int32
		release := make(chan struct{})
		// Two jobs at once take two goroutines.
		p.Go(func() { ran.Add(1); <-release })
		p.Go(func() { ran.Add(1); <-release })
		synctest.Wait()
		if ran.Load() != 2 {
			t.Fatalf("%d jobs ran, want 2", ran.Load())
		}
		close(release)
		synctest.Wait() // both wait for the next job now
		if n := p.Goroutines(); n != 2 {
			t.Fatalf("%d goroutines, want 2", n)
		}
		for range 5 {
			p.Go(func() { ran.Add(1) })
			synctest.Wait()
		}
		if ran.Load() != 7 {
			t.Fatalf("%d jobs ran, want 7", ran.Load())
		}
		if n := p.Goroutines(); n != 2 {
			t.Errorf("%d goroutines, want 2: later jobs did not run on the waiting ones", n)
		}
		// Idle for the idle time, they end; a later job starts one again.
		time.Sleep(10*time.Second + time.Millisecond)
		synctest.Wait()
		if n := p.Goroutines(); n != 0 {
			t.Errorf("%d goroutines after the idle time, want 0", n)
		}
		done := make(chan struct{})
		p.Go(func() { close(done) })
		<-done
		p.Stop()
		synctest.Wait()
		if n := p.Goroutines(); n != 0 {
			t.Errorf("%d goroutines after stop, want 0", n)
		}
		p.Go(func() { ran.Add(1) }) // after stop: still runs, then ends
		synctest.Wait()
		if ran.Load() != 8 {
			t.Errorf("a job after stop did not run")
		}
	})
}
