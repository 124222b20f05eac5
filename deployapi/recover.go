package deployapi

import (
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// A panic is a bug, but in hearthd one request's bug must not end every
// stream of the deployment: fasthttp recovers nothing, and a panic in any
// goroutine ends the process (and a supervised runtime's loaded model with
// it). So each goroutine on a request's path turns a panic into that
// request's failure: the request's own error (500, or an error event in a
// stream that has started), its slots freed as for any failure, and the
// panic logged with its stack (never the request, which may hold secrets).

// panicError is a recovered panic, as the error of the request it hit.
type panicError struct {
	v     any
	stack []byte
}

func (e *panicError) Error() string { return fmt.Sprintf("panic: %v", e.v) }

// recovered is v, the value of a recover() that was not nil, as an error.
func recovered(v any) error { return &panicError{v: v, stack: debug.Stack()} }

// logPanic logs err's panic if it is one, and reports whether it was.
func (a *API) logPanic(err error) bool {
	var pe *panicError
	if !errors.As(err, &pe) {
		return false
	}
	a.m.PanicRecovered()
	a.log.Error("request failed: recovered from a panic", "panic", fmt.Sprint(pe.v), "stack", string(pe.stack))
	return true
}

// recvSafe is s.Recv with a panic returned as its error.
func recvSafe(s llm.Stream) (ev llm.Event, err error) {
	defer func() {
		if v := recover(); v != nil {
			ev, err = llm.Event{}, recovered(v)
		}
	}()
	return s.Recv()
}

// startSafe is start() with a panic returned as its error.
func startSafe(start func() (llm.Stream, error)) (s llm.Stream, err error) {
	defer func() {
		if v := recover(); v != nil {
			s, err = nil, recovered(v)
		}
	}()
	return start()
}

// recoverHandler, deferred first in the server's handler, answers a
// request whose handler panicked with a 500 and closes its connection
// (what was written of it is unknown).
func (a *API) recoverHandler(ctx *fasthttp.RequestCtx, route *string) {
	v := recover()
	if v == nil {
		return
	}
	a.logPanic(recovered(v))
	ctx.Response.Reset() // closes a body stream set already: its completion ends
	a.cors(ctx)
	a.writeError(ctx, openai.InternalError())
	ctx.SetConnectionClose()
	a.m.Request(*route, ctx.Response.StatusCode())
}
