package evloop

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/cacheline"
	"github.com/hearthd/hearth/internal/testutil"
)

func newLoop(t *testing.T) *Loop {
	t.Helper()
	l, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// pair returns a loopback connection's two ends, the first detached into l.
func pair(t *testing.T, l *Loop) (*Conn, net.Conn) {
	t.Helper()
	c, peer := testutil.TCPPair(t)
	pc, err := l.Detach(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc, peer
}

// within fails unless ch yields within d (a bound for a broken build).
func within[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %s", what, d)
		panic("unreachable")
	}
}

type readResult struct {
	n   int
	err error
}

// In blocking mode a Conn is a net.Conn: Read waits for the peer's bytes,
// Write is read by the peer, the peer's close is io.EOF, and Close ends a
// Read that waits.
func TestConnBlocking(t *testing.T) {
	l := newLoop(t)
	pc, peer := pair(t, l)

	got := make(chan readResult, 1)
	buf := make([]byte, 16)
	go func() {
		n, err := pc.Read(buf)
		got <- readResult{n, err}
	}()
	time.Sleep(20 * time.Millisecond) // let the Read wait (the test holds either way)
	if _, err := peer.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	if r := within(t, got, 5*time.Second, "read"); r.err != nil || string(buf[:r.n]) != "hello" {
		t.Fatalf("read %q, %v", buf[:r.n], r.err)
	}

	if _, err := pc.Write([]byte("world")); err != nil {
		t.Fatal(err)
	}
	pb := make([]byte, 5)
	if _, err := io.ReadFull(peer, pb); err != nil || string(pb) != "world" {
		t.Fatalf("peer read %q, %v", pb, err)
	}

	go func() {
		n, err := pc.Read(buf)
		got <- readResult{n, err}
	}()
	time.Sleep(20 * time.Millisecond)
	pc.Close()
	if r := within(t, got, 5*time.Second, "read after close"); !errors.Is(r.err, net.ErrClosed) {
		t.Fatalf("read after Close: %d, %v; want net.ErrClosed", r.n, r.err)
	}
	if !pc.Failed() {
		t.Fatal("Failed false after Close")
	}
}

func TestConnPeerClose(t *testing.T) {
	l := newLoop(t)
	pc, peer := pair(t, l)
	peer.Close()
	if n, err := pc.Read(make([]byte, 4)); err != io.EOF {
		t.Fatalf("read after the peer closed: %d, %v; want io.EOF", n, err)
	}
	if !pc.Failed() {
		t.Fatal("Failed false after the peer closed")
	}
}

// A blocking Read that waits gives up with ErrInterrupted, having read
// nothing, when a channel given to Interrupt is ready; cleared, the next
// Read waits for the bytes and gets all of them.
func TestConnInterrupt(t *testing.T) {
	l := newLoop(t)
	pc, peer := pair(t, l)
	done := make(chan struct{})
	close(done)
	pc.Interrupt(done, nil)
	if n, err := pc.Read(make([]byte, 4)); n != 0 || !errors.Is(err, ErrInterrupted) {
		t.Fatalf("interrupted read: %d, %v; want 0, ErrInterrupted", n, err)
	}
	pc.Interrupt(nil, done)
	if n, err := pc.Read(make([]byte, 4)); n != 0 || !errors.Is(err, ErrInterrupted) {
		t.Fatalf("read interrupted by its deadline: %d, %v; want 0, ErrInterrupted", n, err)
	}
	if pc.Failed() {
		t.Fatal("Failed after an interrupted read")
	}
	// Bytes already there are read, interrupt or not.
	pc.Interrupt(done, nil)
	if _, err := peer.Write([]byte("ab")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	n, err := pc.Read(buf)
	for n == 0 && errors.Is(err, ErrInterrupted) { // the bytes may not be in yet
		n, err = pc.Read(buf)
	}
	if err != nil || string(buf[:n]) != "ab" {
		t.Fatalf("read with bytes there: %q, %v", buf[:n], err)
	}
	pc.Interrupt(nil, nil)
	got := make(chan readResult, 1)
	go func() {
		n, err := pc.Read(buf)
		got <- readResult{n, err}
	}()
	if _, err := peer.Write([]byte("cd")); err != nil {
		t.Fatal(err)
	}
	if r := within(t, got, 5*time.Second, "read after the interrupt was cleared"); r.err != nil || r.n == 0 {
		t.Fatalf("read after the interrupt was cleared: %d, %v", r.n, r.err)
	}
	// A write that has to wait for room (the peer reads nothing) gives up
	// too, with what it wrote.
	pc.Interrupt(done, nil)
	big := make([]byte, 64<<20)
	if n, err := pc.Write(big); n == 0 || n == len(big) || !errors.Is(err, ErrInterrupted) {
		t.Fatalf("interrupted write: %d of %d, %v; want some, ErrInterrupted", n, len(big), err)
	}
}

// After Later, a blocking Read waits for the loop's word before it reads:
// bytes that came before (their word given) are read at once, later ones
// when they come, and an interrupt still ends the wait.
func TestConnLater(t *testing.T) {
	l := newLoop(t)
	pc, peer := pair(t, l)
	buf := make([]byte, 8)
	for i, msg := range []string{"first", "second"} {
		if i == 0 {
			// Written before Later: the loop's word is waiting.
			if _, err := peer.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
		}
		pc.Later()
		got := make(chan readResult, 1)
		go func() {
			n, err := pc.Read(buf)
			got <- readResult{n, err}
		}()
		if i == 1 {
			if _, err := peer.Write([]byte(msg)); err != nil {
				t.Fatal(err)
			}
		}
		if r := within(t, got, 5*time.Second, "read after Later"); r.err != nil || string(buf[:r.n]) != msg {
			t.Fatalf("read after Later: %q, %v; want %q", buf[:r.n], r.err, msg)
		}
	}
	done := make(chan struct{})
	close(done)
	pc.Later()
	pc.Interrupt(done, nil)
	if n, err := pc.Read(buf); n != 0 || !errors.Is(err, ErrInterrupted) {
		t.Fatalf("interrupted read after Later: %d, %v", n, err)
	}
}

// Drained says whether the last blocking read emptied the socket, and at
// which Edge: not after a read that filled its buffer, nor once the peer
// hung up (its close is still to be read).
func TestConnDrained(t *testing.T) {
	l := newLoop(t)
	pc, peer := pair(t, l)
	if got := pc.Drained(); got != ^uint64(0) {
		t.Fatalf("Drained before any read: %d", got)
	}
	if _, err := peer.Write([]byte("abcdef")); err != nil {
		t.Fatal(err)
	}
	if n, err := pc.Read(make([]byte, 3)); n != 3 || err != nil {
		t.Fatalf("read: %d, %v", n, err)
	}
	if got := pc.Drained(); got != ^uint64(0) {
		t.Fatalf("Drained after a read that filled its buffer: %d, want ^0", got)
	}
	before := pc.Edge()
	if n, err := pc.Read(make([]byte, 8)); n != 3 || err != nil {
		t.Fatalf("read: %d, %v", n, err)
	}
	// The read emptied the socket: Drained is an Edge from no earlier than
	// the read began, so an event after it (more bytes) changes Edge.
	d := pc.Drained()
	if d == ^uint64(0) || d < before {
		t.Fatalf("Drained after a short read: %d (Edge before it %d)", d, before)
	}
	if _, err := peer.Write([]byte("g")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "an event for the new byte", func() bool { return pc.Edge() != d })
	if n, err := pc.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("read: %d, %v", n, err)
	}
	if _, err := peer.Write([]byte("h")); err != nil {
		t.Fatal(err)
	}
	peer.Close()
	testutil.WaitFor(t, 5*time.Second, "the hang-up event", pc.HungUp)
	if n, err := pc.Read(make([]byte, 8)); n != 1 || err != nil {
		t.Fatalf("read: %d, %v", n, err)
	}
	if got := pc.Drained(); got != ^uint64(0) {
		t.Fatalf("Drained after a short read once the peer hung up: %d, want ^0", got)
	}
}

// In polled mode Read never waits, and the handler runs in the loop's
// goroutine when bytes arrive, Edge counting each event.
func TestConnPolled(t *testing.T) {
	l := newLoop(t)
	pc, peer := pair(t, l)
	calls := make(chan uint64, 16)
	// Switched on the loop's goroutine, as its users do.
	done := make(chan struct{})
	l.Post(func() {
		pc.Poll(func() { calls <- pc.Edge() })
		close(done)
	})
	within(t, done, 5*time.Second, "poll set")
	if _, err := pc.Read(make([]byte, 4)); !errors.Is(err, ErrWouldBlock) {
		t.Fatalf("polled read of an empty socket: %v, want ErrWouldBlock", err)
	}
	before := len(calls)
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var edge uint64
	for range before + 1 {
		edge = within(t, calls, 5*time.Second, "handler call")
	}
	read := make(chan readResult, 1)
	l.Post(func() {
		buf := make([]byte, 4)
		n, err := pc.Read(buf)
		read <- readResult{n, err}
	})
	if r := within(t, read, 5*time.Second, "polled read"); r.n != 1 || r.err != nil {
		t.Fatalf("polled read: %d, %v", r.n, r.err)
	}
	if _, err := peer.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if e := within(t, calls, 5*time.Second, "handler call"); e <= edge {
		t.Fatalf("Edge %d after more bytes, was %d", e, edge)
	}
	// Close calls the handler once more, which sees Failed.
	closed := make(chan bool, 1)
	set := make(chan struct{})
	l.Post(func() {
		pc.Poll(func() { closed <- pc.Failed() })
		close(set)
	})
	within(t, set, 5*time.Second, "poll set")
	go pc.Close()
	if !within(t, closed, 5*time.Second, "handler after close") {
		t.Fatal("handler after Close saw Failed false")
	}
}

// Close from other goroutines while reads and writes run: no descriptor
// is closed under one (run with -race; a reused descriptor would read
// another socket's bytes or fail with EBADF, not net.ErrClosed).
func TestConnCloseWhileInUse(t *testing.T) {
	l := newLoop(t)
	for range 20 {
		pc, peer := pair(t, l)
		var wg sync.WaitGroup
		wg.Add(3)
		go func() {
			defer wg.Done()
			buf := make([]byte, 64)
			for {
				if _, err := pc.Read(buf); err != nil {
					if !errors.Is(err, net.ErrClosed) && err != io.EOF {
						t.Errorf("read: %v", err)
					}
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for {
				if _, err := pc.Write([]byte("ping")); err != nil {
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			_, _ = io.Copy(io.Discard, peer)
		}()
		go func() {
			for range 50 {
				_, _ = peer.Write([]byte("x"))
			}
		}()
		time.Sleep(2 * time.Millisecond)
		pc.Close()
		peer.Close()
		wg.Wait()
	}
}

func TestPostAfterClose(t *testing.T) {
	l, err := New(nil)
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan struct{})
	if !l.Post(func() { close(ran) }) {
		t.Fatal("Post on an open loop refused")
	}
	within(t, ran, 5*time.Second, "posted function")
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l.Post(func() {}) {
		t.Fatal("Post after Close accepted")
	}
	if _, err := l.Watch(0, 0, func(uint32) {}); err == nil {
		t.Fatal("Watch after Close accepted")
	}
}

// A Post made while the loop runs (here by a goroutine that a posted
// function waits for) does not write the eventfd: the loop takes the queue
// before it waits again, and runs the function.
func TestPostToARunningLoopNeedsNoWakeUp(t *testing.T) {
	l := newLoop(t)
	inner := make(chan struct{})
	delta := make(chan uint64, 1)
	if !l.Post(func() {
		done := make(chan struct{})
		go func() {
			before := l.signals.Load()
			l.Post(func() { close(inner) })
			delta <- l.signals.Load() - before
			close(done)
		}()
		<-done // the loop's goroutine is inside its round until the Post is made
	}) {
		t.Fatal("Post on an open loop refused")
	}
	if d := within(t, delta, 5*time.Second, "the Post from the goroutine"); d != 0 {
		t.Fatalf("a Post to the running loop wrote the eventfd %d times, want 0", d)
	}
	within(t, inner, 5*time.Second, "the function posted while the loop ran")
}

// No Post is lost between the loop taking its queue and waiting: from many
// goroutines at once, while sockets keep it busy, every posted function runs.
func TestPostsAreNeverLost(t *testing.T) {
	l := newLoop(t)
	c, peer := testutil.TCPPair(t)
	fd := fdOf(t, c)
	var buf [512]byte
	id, err := l.Watch(fd, unix.EPOLLIN, func(uint32) {
		for {
			if n, _ := Read(fd, buf[:]); n <= 0 {
				return
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Unwatch(fd, id) })
	stop := make(chan struct{})
	go func() { // events for the loop to harvest while the Posts come
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := peer.Write([]byte("x")); err != nil {
				return
			}
			runtime.Gosched()
		}
	}()
	defer close(stop)
	const goroutines, posts = 8, 2000
	var ran atomic.Int64
	all := make(chan struct{})
	for range goroutines {
		go func() {
			for range posts {
				l.Post(func() {
					if ran.Add(1) == goroutines*posts {
						close(all)
					}
				})
				if rand.IntN(8) == 0 {
					runtime.Gosched()
				}
			}
		}()
	}
	within(t, all, 30*time.Second, "every posted function")
}

// A handler that panics is logged and the loop goes on.
func TestHandlerPanicKeepsTheLoop(t *testing.T) {
	l := newLoop(t)
	l.Post(func() { panic("boom") })
	ran := make(chan struct{})
	l.Post(func() { close(ran) })
	within(t, ran, 5*time.Second, "function posted after a panic")
}

// A slot freed by Unwatch is reused under another ID: the old ID finds
// nothing and forgetting it again leaves the new watch alone.
func TestWatchIDsAreNotReused(t *testing.T) {
	l := newLoop(t)
	c, peer := testutil.TCPPair(t)
	fd := fdOf(t, c)
	seen := make(chan string, 4)
	first, err := l.Watch(fd, unix.EPOLLIN, func(uint32) { seen <- "first" })
	if err != nil {
		t.Fatal(err)
	}
	l.Unwatch(fd, first)
	second, err := l.Watch(fd, unix.EPOLLIN, func(uint32) { seen <- "second" })
	if err != nil {
		t.Fatal(err)
	}
	if second == first || uint32(second) != uint32(first) {
		t.Fatalf("IDs %#x then %#x: want the same slot under a new generation", first, second)
	}
	l.forget(first) // stale: must not drop the second watch
	l.mu.Lock()
	stale, live := l.watch(first), l.watch(second)
	l.mu.Unlock()
	if stale != nil || live == nil || live.h == nil {
		t.Fatalf("stale ID's watch %v (want none), live ID's %v (want one with a handler)", stale != nil, live != nil)
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := within(t, seen, 5*time.Second, "event after the slot's reuse"); got != "second" {
		t.Fatalf("event went to the %s handler", got)
	}
	l.Unwatch(fd, second)
}

func fdOf(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := rc.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// The loop loads a watch's hot lines before its handler runs (what it
// loaded shows in touched), keeps at most hotMax, and forgets them at
// Unwatch; a Conn names its own lines, then its handler's, then the
// caller's, and Poll(nil) clears them.
func TestHotLines(t *testing.T) {
	l := newLoop(t)
	c, peer := testutil.TCPPair(t)
	fd := fdOf(t, c)
	a, b := &[64]byte{0: 3}, &[64]byte{0: 4}
	touched := make(chan byte, 4)
	id, err := l.Watch(fd, unix.EPOLLIN, func(uint32) { touched <- l.touched })
	if err != nil {
		t.Fatal(err)
	}
	l.SetHot(id, []unsafe.Pointer{unsafe.Pointer(a), unsafe.Pointer(b)})
	before := make(chan byte, 1)
	l.Post(func() { before <- l.touched })
	was := within(t, before, 5*time.Second, "posted")
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if got := within(t, touched, 5*time.Second, "event") - was; got != 3+4 {
		t.Fatalf("loaded bytes summing to %d before the handler, want 7 (both hot lines)", got)
	}

	many := make([]unsafe.Pointer, hotMax+6)
	for i := range many {
		many[i] = unsafe.Pointer(&make([]byte, 1)[0])
	}
	l.SetHot(id, many)
	hot := hotOf(l, id)
	if len(hot) != hotMax || hot[0] != many[0] || hot[hotMax-1] != many[hotMax-1] {
		t.Fatalf("%d lines set: kept %d, want the first %d", len(many), len(hot), hotMax)
	}
	l.SetHot(id, many[:1])
	if hot := hotOf(l, id); len(hot) != 1 {
		t.Fatalf("set again with 1 line: %d kept", len(hot))
	}
	l.Unwatch(fd, id)
	if slot := uint32(id); l.watches[slot].hot[0] != nil {
		t.Fatal("Unwatch left the slot's hot lines referenced")
	}

	pc, _ := pair(t, l)
	h := func() {}
	pc.Poll(h, unsafe.Pointer(a))
	hot = hotOf(l, pc.id)
	own := cacheline.Of(nil, pc)
	if want := len(own) + 3; len(hot) != want || hot[0] != unsafe.Pointer(pc) || hot[len(hot)-1] != unsafe.Pointer(a) {
		t.Fatalf("Conn.Poll's hot lines: %d, want %d: the Conn's %d, the handler's 2, the caller's 1", len(hot), want, len(own))
	}
	pc.Poll(h, many...)
	if hot = hotOf(l, pc.id); len(hot) != hotMax || hot[0] != unsafe.Pointer(pc) || hot[len(own)+2] != many[0] {
		t.Fatalf("Conn.Poll with %d lines of the caller's: %d kept, want the Conn's and the handler's first, then the caller's up to %d",
			len(many), len(hot), hotMax)
	}
	pc.Poll(nil)
	if hot := hotOf(l, pc.id); len(hot) != 0 {
		t.Fatalf("Poll(nil) left %d hot lines", len(hot))
	}
}

// hotOf is id's hot lines, up to the first nil.
func hotOf(l *Loop, id uint64) []unsafe.Pointer {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.watches[uint32(id)]
	if w.gen != uint32(id>>32) {
		return nil
	}
	n := 0
	for n < hotMax && w.hot[n] != nil {
		n++
	}
	return append([]unsafe.Pointer(nil), w.hot[:n]...)
}

// A goroutine a handler readies runs before the loop's next handler of the
// same harvest, even on one processor: a blocking Read the event ends, or
// any goroutine after Yield. Without the yield it would wait for the rest
// of the harvest, which under load is most of a request's wait (Yield).
func TestReadiedGoroutineRunsBeforeTheNextHandler(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, how := range []string{"blocking read", "Yield"} {
		t.Run(how, func(t *testing.T) {
			l := newLoop(t)
			ran := make(chan struct{}) // closed by the readied goroutine
			var first net.Conn         // written first: its event comes first
			if how == "blocking read" {
				c, peer := pair(t, l)
				first = peer
				go func() {
					var buf [1]byte
					_, _ = c.Read(buf[:])
					close(ran)
				}()
			} else {
				c, peer := testutil.TCPPair(t)
				first = peer
				fd := fdOf(t, c)
				wake := make(chan struct{})
				go func() { <-wake; close(ran) }()
				var once sync.Once
				id, err := l.Watch(fd, unix.EPOLLIN, func(uint32) {
					once.Do(func() { close(wake); l.Yield() })
				})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Unwatch(fd, id) })
			}
			second, secondPeer := testutil.TCPPair(t)
			fd := fdOf(t, second)
			saw := make(chan bool, 1)
			var once sync.Once
			id, err := l.Watch(fd, unix.EPOLLIN, func(uint32) {
				once.Do(func() {
					select {
					case <-ran:
						saw <- true
					default:
						saw <- false
					}
				})
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Unwatch(fd, id) })
			// Both events wait while the loop is held, so that one harvest
			// takes them, in the order written.
			hold := make(chan struct{})
			held := make(chan struct{})
			if !l.Post(func() { close(held); <-hold }) {
				t.Fatal("Post on an open loop")
			}
			within(t, held, 5*time.Second, "the loop running the posted function")
			for _, c := range []net.Conn{first, secondPeer} {
				if _, err := c.Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			close(hold)
			if !within(t, saw, 5*time.Second, "the second handler") {
				t.Fatal("the goroutine the first handler readied had not run when the second handler ran")
			}
		})
	}
}

// TestYieldsEndAfterALongOne: once a yield found the processor busy (it
// took maxYield or more), the loop stops yielding for the rest of the
// harvest, and a goroutine a later handler readies waits for its end; a
// short yield leaves the next handler's yield as it was. Without the
// budget, a processor with many goroutines ready put the loop behind all
// of them at every request's start, and the loop fell behind for good.
func TestYieldsEndAfterALongOne(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, slow := range []bool{false, true} {
		t.Run(fmt.Sprintf("slow=%v", slow), func(t *testing.T) {
			var clock atomic.Int64 // ns past base
			base := time.Unix(1, 0)
			l, err := newClocked(nil, func() time.Time { return base.Add(time.Duration(clock.Load())) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			// Three sockets, one harvest: a readies a goroutine that takes
			// "long" (moves the clock) if slow, b readies one that marks
			// ranB, and c looks whether it ran.
			var peers []net.Conn
			watch := func(h func()) {
				c, peer := testutil.TCPPair(t)
				fd := fdOf(t, c)
				var once sync.Once
				id, err := l.Watch(fd, unix.EPOLLIN, func(uint32) { once.Do(h) })
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { l.Unwatch(fd, id) })
				peers = append(peers, peer)
			}
			wakeA, wakeB, ranB := make(chan struct{}), make(chan struct{}), make(chan struct{})
			go func() {
				<-wakeA
				if slow {
					clock.Add(int64(2 * maxYield))
				}
			}()
			go func() { <-wakeB; close(ranB) }()
			saw := make(chan bool, 1)
			watch(func() { close(wakeA); l.Yield() })
			watch(func() { close(wakeB); l.Yield() })
			watch(func() {
				select {
				case <-ranB:
					saw <- true
				default:
					saw <- false
				}
			})
			hold, held := make(chan struct{}), make(chan struct{})
			if !l.Post(func() { close(held); <-hold }) {
				t.Fatal("Post on an open loop")
			}
			within(t, held, 5*time.Second, "the loop running the posted function")
			for _, p := range peers {
				if _, err := p.Write([]byte("x")); err != nil {
					t.Fatal(err)
				}
			}
			close(hold)
			if got := within(t, saw, 5*time.Second, "the third handler"); got == slow {
				t.Fatalf("slow first yield %v: the second handler's goroutine ran before the third handler: %v", slow, got)
			}
		})
	}
}
