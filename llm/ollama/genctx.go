package ollama

import (
	"context"
	"io"
	"sync"
	"time"
)

// genCtx is a generation's request context: it lives until the stream
// ends, past the caller's context while the prompt is read, and ending it
// closes the request's connection, which makes Ollama stop generating.
//
// It stands for context.WithCancelCause(context.WithoutCancel(ctx)) with
// the transport's context.AfterFunc(ctx, conn.Close) on it: those cost a
// generation ~10 allocations (the child map, the after-func context and
// its closures) and two mutex round trips, on every request's path, for
// a close that one field can hold. Any other request of the transport
// keeps the plain context (pending).
type genCtx struct {
	parent context.Context // values only: context.WithoutCancel's

	mu    sync.Mutex
	done  chan struct{} // made by the first Done
	err   error         // context.Canceled once ended
	cause error
	conn  io.Closer // closed at the end, unless unhooked first
	hooks uint64    // hooks so far: names the one conn is from (unhook)
}

func newGenCtx(ctx context.Context) *genCtx {
	return &genCtx{parent: context.WithoutCancel(ctx)}
}

func (g *genCtx) Deadline() (time.Time, bool) { return time.Time{}, false }

func (g *genCtx) Done() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.done == nil {
		g.done = make(chan struct{})
		if g.err != nil {
			close(g.done)
		}
	}
	return g.done
}

func (g *genCtx) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// Value has context.WithoutCancel's values: the caller's, without its
// cancellation (context.Cause of a genCtx is therefore its Err; use
// causeOf for the cause).
func (g *genCtx) Value(key any) any { return g.parent.Value(key) }

// causeOf is why g ended (the argument of its first cancel, or
// context.Canceled), nil while it has not.
func (g *genCtx) causeOf() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cause
}

// cancel ends g, with cause (context.Canceled if nil) unless it had ended
// already, and closes the connection hooked to it, in the caller's
// goroutine: a close neither blocks nor calls back into g.
func (g *genCtx) cancel(cause error) {
	g.mu.Lock()
	if g.err != nil {
		g.mu.Unlock()
		return
	}
	if cause == nil {
		cause = context.Canceled
	}
	g.err, g.cause = context.Canceled, cause
	if g.done != nil {
		close(g.done)
	}
	conn := g.conn
	g.conn = nil
	g.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

// hook has g's end close c (at once if g has ended), and returns what
// names this hook to unhook. One connection at a time: a request sent
// again on a new connection hooks that one.
func (g *genCtx) hook(c io.Closer) uint64 {
	g.mu.Lock()
	g.hooks++
	id := g.hooks
	if g.err == nil {
		g.conn = c
		g.mu.Unlock()
		return id
	}
	g.mu.Unlock()
	c.Close()
	return id
}

// unhook takes hook id's connection off g, and reports whether it was
// still on it: false once g's end has closed it (or is closing it), or
// another hook has replaced it; as context.AfterFunc's stop. An ID, not
// the connection, is compared: not every net.Conn is comparable.
func (g *genCtx) unhook(id uint64) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.conn == nil || g.hooks != id {
		return false
	}
	g.conn = nil
	return true
}
