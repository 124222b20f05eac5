// Package gopool runs short jobs on goroutines that stay for the next
// one. A goroutine started per job begins with a 2 KiB stack and grows it
// (runtime.copystack) every time on a deep path: at c=1 000 that was ~5 %
// of hearthd's CPU (BENCHMARKS.md). A pooled goroutine keeps the stack it
// grew.
package gopool

import (
	"sync"
	"sync/atomic"
	"time"
)

// Pool runs jobs on its goroutines. One idle for its idle time ends, as
// fasthttp's own workers do, and all end at Stop.
type Pool struct {
	jobs chan func() // unbuffered: taken only by a goroutine waiting for one
	idle time.Duration
	done chan struct{}
	once sync.Once

	goroutines atomic.Int32
}

// Goroutines is how many goroutines the pool has, running or waiting.
func (p *Pool) Goroutines() int { return int(p.goroutines.Load()) }

// New returns a pool whose goroutines end after idle without a job.
func New(idle time.Duration) *Pool {
	return &Pool{jobs: make(chan func()), idle: idle, done: make(chan struct{})}
}

// Go has a waiting goroutine of the pool run job, or starts one.
func (p *Pool) Go(job func()) {
	select {
	case p.jobs <- job:
	default:
		p.goroutines.Add(1)
		go p.work(job)
	}
}

func (p *Pool) work(job func()) {
	defer p.goroutines.Add(-1)
	t := time.NewTimer(p.idle)
	defer t.Stop()
	for {
		job()
		job = nil // hold nothing while waiting
		t.Reset(p.idle)
		select {
		case job = <-p.jobs:
		case <-t.C:
			return
		case <-p.done:
			return
		}
	}
}

// Stop ends the waiting goroutines; a running job ends in its own time,
// and a job given after Stop still runs (on a goroutine that then ends).
func (p *Pool) Stop() { p.once.Do(func() { close(p.done) }) }
