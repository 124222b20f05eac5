package ollama

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
)

type countCloser struct{ n atomic.Int32 }

func (c *countCloser) Close() error { c.n.Add(1); return nil }

type ctxKey struct{}

func TestGenCtx(t *testing.T) {
	parent, cancelParent := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	g := newGenCtx(parent)
	done := g.Done()
	cancelParent()
	// The caller's end is not the generation's (generate ties them
	// together itself, from the first token on).
	select {
	case <-done:
		t.Fatal("ended with its parent")
	default:
	}
	if g.Err() != nil || g.causeOf() != nil || g.Value(ctxKey{}) != "v" {
		t.Fatalf("err %v cause %v value %v", g.Err(), g.causeOf(), g.Value(ctxKey{}))
	}
	if _, ok := g.Deadline(); ok {
		t.Fatal("a deadline")
	}

	c1, c2 := &countCloser{}, &countCloser{}
	h1 := g.hook(c1)
	if !g.unhook(h1) || g.unhook(h1) {
		t.Fatal("unhook of the hooked connection: want true once")
	}
	h2 := g.hook(c2)
	if g.unhook(h1) {
		t.Fatal("unhook of a connection no longer hooked reported true")
	}
	why := errors.New("why")
	g.cancel(why)
	g.cancel(context.DeadlineExceeded) // the first cause stays
	if c1.n.Load() != 0 || c2.n.Load() != 1 {
		t.Fatalf("closes: unhooked %d, hooked %d; want 0, 1", c1.n.Load(), c2.n.Load())
	}
	if g.unhook(h2) {
		t.Fatal("unhook after the end reported true")
	}
	select {
	case <-done:
	default:
		t.Fatal("Done not closed at the end")
	}
	if g.Err() != context.Canceled || g.causeOf() != why || context.Cause(g) != context.Canceled {
		t.Fatalf("err %v cause %v context.Cause %v", g.Err(), g.causeOf(), context.Cause(g))
	}

	// Done made after the end is closed; a connection hooked after it is
	// closed at once.
	g2 := newGenCtx(context.Background())
	g2.cancel(nil)
	if g2.causeOf() != context.Canceled {
		t.Fatalf("cause %v", g2.causeOf())
	}
	select {
	case <-g2.Done():
	default:
		t.Fatal("Done after the end not closed")
	}
	c3 := &countCloser{}
	if h3 := g2.hook(c3); c3.n.Load() != 1 || g2.unhook(h3) {
		t.Fatal("a connection hooked after the end was not closed")
	}
}

// uncomparable is a connection type == would panic on (a slice field).
type uncomparable struct{ b []byte }

func (uncomparable) Close() error { return nil }

// TestGenCtxUncomparableConn: hooks are named by ID, so a connection type
// that is not comparable cannot make unhook panic.
func TestGenCtxUncomparableConn(t *testing.T) {
	g := newGenCtx(context.Background())
	h := g.hook(uncomparable{})
	if !g.unhook(h) {
		t.Fatal("unhook: want true")
	}
}

// TestGenCtxRace: an end racing the transport's unhook closes the
// connection exactly when unhook reports false (go test -race).
func TestGenCtxRace(t *testing.T) {
	for range 200 {
		g := newGenCtx(context.Background())
		c := &countCloser{}
		h := g.hook(c)
		var wg sync.WaitGroup
		var kept atomic.Bool
		wg.Go(func() { g.cancel(nil) })
		wg.Go(func() { kept.Store(g.unhook(h)) })
		wg.Go(func() { <-g.Done() })
		wg.Wait()
		if kept.Load() && c.n.Load() != 0 || !kept.Load() && c.n.Load() != 1 {
			t.Fatalf("unhook %v, closes %d", kept.Load(), c.n.Load())
		}
	}
}
