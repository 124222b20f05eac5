package deployapi

import (
	"sync"
	"sync/atomic"
	"time"
)

// servePool runs the serving of connections handed back after a stream
// (serveKept) on goroutines that stay for the next one. A goroutine
// started for each began with a 2 KiB stack that fasthttp's parse and the
// handler grew three times over every request: runtime.copystack was ~5 %
// of hearthd's CPU at c=1 000 (BENCHMARKS.md). A pooled goroutine keeps
// the stack it grew. One idle for idle ends, as fasthttp's own workers do,
// and all end at stop.
type servePool struct {
	jobs chan func() // unbuffered: taken only by a goroutine waiting for one
	idle time.Duration
	done chan struct{}
	once sync.Once
	// goroutines counts the pool's goroutines (tests).
	goroutines atomic.Int32
}

func newServePool(idle time.Duration) *servePool {
	return &servePool{jobs: make(chan func()), idle: idle, done: make(chan struct{})}
}

// run has an idle goroutine of the pool run job, or starts one.
func (p *servePool) run(job func()) {
	select {
	case p.jobs <- job:
	default:
		p.goroutines.Add(1)
		go p.work(job)
	}
}

func (p *servePool) work(job func()) {
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

// stop ends the waiting goroutines; a running job ends in its own time.
func (p *servePool) stop() { p.once.Do(func() { close(p.done) }) }
