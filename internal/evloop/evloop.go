// Package evloop is an event loop over raw epoll: one goroutine waits for
// the sockets it watches and runs their handlers itself.
//
// hearthd relays each token of a stream from the runtime's socket to the
// client's. Through Go's netpoller that costs, per token, a goroutine
// parked and woken (the scheduler's spin, futex and netpoll), and a read
// that finds the socket empty before the goroutine may park (a Go read
// tries before it waits). nginx, with one epoll loop per worker, reads and
// writes a token with nothing else (BENCHMARKS.md, issue 15). A Loop gives
// hearthd that structure where it pays: the loop wakes once for every
// socket that has something, reads each token, encodes and writes it, and
// waits again; no goroutine per stream, and no read that finds a socket
// empty (edge-triggered: a read shorter than its buffer emptied it, unless
// the peer closed: Conn.HungUp).
//
// A socket the loop owns (Conn) must not also sit in Go's netpoller: every
// token would then wake a thread of the scheduler as well. Detach takes a
// connection out of it. A Conn also serves a goroutine (Read and Write wait
// for the loop's word), which is how a request is written and its answer's
// head read before the loop takes the stream over.
package evloop

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/cacheline"
)

// Loop is one epoll instance, the goroutine that waits for it and the
// handlers it runs.
type Loop struct {
	ep   *os.File // the epoll instance, as Go's netpoller waits on it
	epfd int      // ep's descriptor (ep.Fd would make it blocking)
	wake int      // eventfd: Post and Close wake the loop through it
	log  *slog.Logger

	mu sync.Mutex
	// watches holds the handlers by slot, the low half of their ID; the
	// high half is the slot's generation, bumped at each reuse, so an ID is
	// not reused until a slot has been 2³² times (an array index and a
	// compare per event, where a map was 1 % of hearthd's CPU at c=1 000).
	watches []watch
	free    []uint32 // slots forgotten
	queue   []func()
	closed  bool

	done chan struct{}
	// awake is set from a harvest until the loop has found the queue empty
	// and waits again: a Post then needs no wake-up, since the loop takes
	// the queue before it waits. Under mu.
	awake bool
	// woken is set while a wake-up is pending, so a burst of Posts writes
	// the eventfd once.
	woken atomic.Bool
	// signals counts the eventfd's writes (wake-ups).
	signals atomic.Uint64
	// touched keeps the loads of hot lines from being optimized away;
	// only in the loop's goroutine.
	touched byte
	// yield is set by a handler that readied a goroutine (Yield); only in
	// the loop's goroutine.
	yield bool
	// now is the clock yields are timed with (maxYield); tests set it.
	now func() time.Time
}

type watch struct {
	gen uint32
	h   func(events uint32) // nil while the slot is free
	// hot are the cache lines h reads at every event (SetHot), loaded
	// together before h runs; nil after the last.
	hot [hotMax]unsafe.Pointer
}

// hotMax bounds a watch's hot cache lines: a stream's relay names ~50.
const hotMax = 64

// wakeID is the epoll data of the loop's own eventfd (slot 0, generation
// 0); watched sockets get IDs of slots from 1 and generations from 1, not
// reused, so an event for a socket that was closed (and whose number may
// already be another's) is told apart and dropped.
const wakeID = 0

// watch returns id's slot while id is its current generation (the
// eventfd's included), nil otherwise. Under l.mu.
func (l *Loop) watch(id uint64) *watch {
	if slot := uint32(id); int(slot) < len(l.watches) && l.watches[slot].gen == uint32(id>>32) {
		return &l.watches[slot]
	}
	return nil
}

// New starts a loop. Close stops it.
func New(log *slog.Logger) (*Loop, error) { return newClocked(log, time.Now) }

// newClocked is New with the clock yields are timed with.
func newClocked(log *slog.Logger, now func() time.Time) (*Loop, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("evloop: epoll_create1: %w", err)
	}
	// Non-blocking, so that os.NewFile makes it a File Go's netpoller
	// waits on (run).
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("evloop: epoll non-blocking: %w", err)
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(epfd)
		return nil, fmt.Errorf("evloop: eventfd: %w", err)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN}
	setID(&ev, wakeID)
	if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, wake, &ev); err != nil {
		unix.Close(wake)
		unix.Close(epfd)
		return nil, fmt.Errorf("evloop: watch eventfd: %w", err)
	}
	l := &Loop{ep: os.NewFile(uintptr(epfd), "evloop"), epfd: epfd, wake: wake, log: log,
		watches: make([]watch, 1, 64), done: make(chan struct{}), now: now}
	go l.run()
	return l, nil
}

func setID(ev *unix.EpollEvent, id uint64) {
	ev.Fd, ev.Pad = int32(uint32(id)), int32(uint32(id>>32))
}

func idOf(ev *unix.EpollEvent) uint64 {
	return uint64(uint32(ev.Fd)) | uint64(uint32(ev.Pad))<<32
}

// Close stops the loop once the handlers it is running return; handlers
// and posted functions not run by then never run. Sockets still watched are
// left as they are: their owners close them.
func (l *Loop) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.done
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.signal()
	<-l.done
	unix.Close(l.wake)
	return l.ep.Close()
}

// Post runs f on the loop's goroutine, after the handlers of the events it is
// handling now. It reports false if the loop is closed (f never runs).
func (l *Loop) Post(f func()) bool {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return false
	}
	l.queue = append(l.queue, f)
	awake := l.awake
	l.mu.Unlock()
	// A loop that is running takes the queue before it waits; only one that
	// waits (or is about to) needs the eventfd, a write here and a read there.
	// Under load a stream's relay is posted by a goroutine that ran while
	// the loop yielded, mid-harvest.
	if !awake && l.woken.CompareAndSwap(false, true) {
		l.signal()
	}
	return true
}

func (l *Loop) signal() {
	l.signals.Add(1)
	var one = [8]byte{1}
	_, _ = unix.Write(l.wake, one[:]) // EAGAIN: a wake-up is pending anyway
}

// Watch calls h on the loop's goroutine with the events of fd (edge-triggered:
// once per change), until Unwatch. fd stays its caller's: it must stay open
// until Unwatch returns.
func (l *Loop) Watch(fd int, events uint32, h func(events uint32)) (id uint64, err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, errors.New("evloop: loop closed")
	}
	var slot uint32
	if n := len(l.free); n > 0 {
		slot = l.free[n-1]
		l.free = l.free[:n-1]
	} else {
		slot = uint32(len(l.watches))
		l.watches = append(l.watches, watch{})
	}
	w := &l.watches[slot]
	if w.gen++; w.gen == 0 {
		w.gen = 1
	}
	w.h = h
	id = uint64(w.gen)<<32 | uint64(slot)
	l.mu.Unlock()
	ev := unix.EpollEvent{Events: events | unix.EPOLLET}
	setID(&ev, id)
	if err := unix.EpollCtl(l.epfd, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
		l.forget(id)
		return 0, fmt.Errorf("evloop: watch fd %d: %w", fd, err)
	}
	return id, nil
}

// Unwatch stops watching fd, watched as id. An event already taken from
// epoll is dropped.
func (l *Loop) Unwatch(fd int, id uint64) {
	l.forget(id)
	_ = unix.EpollCtl(l.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// SetHot names the cache lines id's handler reads at every event
// (cacheline.Of): up to hotMax, the rest ignored; nil clears them. Before
// it runs the handlers of the events it took, the loop loads them all
// (cacheline.Load), so that each handler finds its objects in the cache
// rather than waiting for memory at each one in turn. The lines stay
// referenced, so their objects stay allocated, until SetHot(id, nil) or
// Unwatch.
func (l *Loop) SetHot(id uint64, lines []unsafe.Pointer) {
	l.setHot(id, nil, lines)
}

// setHot is SetHot of first's lines, then rest's.
func (l *Loop) setHot(id uint64, first, rest []unsafe.Pointer) {
	l.mu.Lock()
	if w := l.watch(id); w != nil && uint32(id) != 0 {
		n := copy(w.hot[:], first)
		n += copy(w.hot[n:], rest)
		clear(w.hot[n:])
	}
	l.mu.Unlock()
}

// forget drops id's handler; closing its fd then removes it from epoll.
func (l *Loop) forget(id uint64) {
	l.mu.Lock()
	if w := l.watch(id); w != nil && uint32(id) != 0 && w.h != nil {
		w.h = nil
		clear(w.hot[:])
		l.free = append(l.free, uint32(id))
	}
	l.mu.Unlock()
}

// run is the loop: a goroutine that waits for the loop's epoll instance
// in Go's netpoller (an epoll instance is readable while it has events),
// takes every event ready with one epoll_wait and handles them, then waits
// again. It holds no processor while it waits. A goroutine blocked in
// epoll_wait itself would: Go's monitor thread takes the processor of a
// goroutine that sits in a system call once others need it, or once it
// has not been scheduled for 10 ms, and after each such take polls every
// 20 µs for a while; a loop in epoll_wait kept it there, a fifth of a core
// at one stream. And with one processor, hearthd's default here, every other
// goroutine waits for such a call to end: tried again with the wait capped
// at 2 ms, the time to first token grew by the cap (BENCHMARKS.md).
//
// The wait is one RawConn.Read whose function handles the events: the
// netpoller's readiness is reset before the function first runs, and an
// event that comes after a harvest marks the instance ready again, so no
// event is missed between a harvest and the wait after it.
func (l *Loop) run() {
	defer close(l.done)
	events := make([]unix.EpollEvent, 128)
	hs := make([]func(uint32), 0, len(events))
	var queue []func()
	rc, err := l.ep.SyscallConn()
	if err != nil {
		l.log.Error("event loop stopped", "err", err)
		return
	}
	err = rc.Read(func(uintptr) bool {
		for {
			n, err := harvest(l.epfd, events)
			if err != nil {
				if err == unix.EINTR {
					continue
				}
				l.log.Error("event loop stopped", "err", err)
				return true
			}
			hs = hs[:0]
			l.mu.Lock()
			l.awake = true
			for i := range n {
				var h func(uint32)
				if w := l.watch(idOf(&events[i])); w != nil {
					h = w.h
					l.touched += cacheline.Load(w.hot[:])
				}
				hs = append(hs, h)
			}
			l.mu.Unlock()
			// Yields go on while they are short; one that waited long
			// (a processor with many goroutines ready) ends them for the
			// rest of the harvest: each would put the loop behind all of
			// them again. In a traced ramp of 9 800 streams that fell
			// behind, the loop spent most of it in such yields while its
			// events waited (BENCHMARKS.md, issue 15).
			yields := true
			for i, h := range hs {
				if h != nil {
					l.handle(h, events[i].Events)
					if l.yield {
						l.yield = false
						if i < n-1 && yields {
							start := l.now()
							yieldNow()
							yields = l.now().Sub(start) < maxYield
						}
					}
				} else if idOf(&events[i]) == wakeID {
					var buf [8]byte
					_, _ = Read(l.wake, buf[:])
					l.woken.Store(false)
				}
			}
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				return true
			}
			queue, l.queue = l.queue, queue[:0]
			l.mu.Unlock()
			for i, f := range queue {
				l.call(f)
				queue[i] = nil
			}
			l.yield = false
			if n < len(events) {
				// All taken: wait in the netpoller, unless something was
				// posted since the queue was taken (awake, so not woken).
				l.mu.Lock()
				if len(l.queue) == 0 {
					l.awake = false
					l.mu.Unlock()
					return false
				}
				l.mu.Unlock()
				continue
			}
			// More are ready: let the goroutines the handlers woke run
			// first, and be scheduled again, which keeps Go's monitor
			// from taking the processor of a goroutine that ran 10 ms.
			runtime.Gosched()
		}
	})
	if err != nil {
		l.log.Error("event loop stopped", "err", err)
	}
}

// Yield, called by a handler in the loop's goroutine, lets the goroutines
// the handler readied run before the loop goes on with the other events it
// harvested. Go queues a goroutine readied here behind the loop, which
// under load runs a harvest of ~100 tokens (~250 µs) before it waits again:
// in an execution trace at c=1 000, a request's first line and its next
// request waited ~200 µs a request for that (BENCHMARKS.md). A yield per
// request is cheap; one per token is not, so only the handlers that start
// or end a request's waits call it. Outside a handler (a posted function)
// it does nothing.
func (l *Loop) Yield() { l.yield = true }

// maxYield is the longest yield after which the loop yields again in the
// same harvest. A yield lets a request's goroutine or two run (~100 µs
// each); one that took longer found many ready.
const maxYield = time.Millisecond

// yieldNow lets the goroutines readied on the loop's processor run. Twice:
// once in 61 times the scheduler takes its next goroutine from the global
// queue, where the first Gosched put the loop, and the second then runs
// them (TestReadiedGoroutineRunsBeforeTheNextHandler fails without it).
func yieldNow() {
	runtime.Gosched()
	runtime.Gosched()
}

// call runs f and handle runs h; a panic is logged and the loop goes on.
// Handlers recover their own panics to fail what they were doing; this is
// the last guard of the goroutine every stream on it shares.
func (l *Loop) call(f func()) {
	defer l.recovered()
	f()
}

func (l *Loop) handle(h func(uint32), events uint32) {
	defer l.recovered()
	h(events)
}

func (l *Loop) recovered() {
	if v := recover(); v != nil {
		buf := make([]byte, 8<<10)
		buf = buf[:runtime.Stack(buf, false)]
		l.log.Error("panic in an event loop handler", "panic", fmt.Sprint(v), "stack", string(buf))
	}
}
