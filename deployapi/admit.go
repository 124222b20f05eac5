package deployapi

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// slot is a request admitted to the served model that holds its
// generation slots (one per generation it runs: a request with n choices
// holds n): what every route that reaches the runtime runs on.
type slot struct {
	s    *served
	key  apikeys.Key
	n    int             // generation slots held
	gctx context.Context // ends when the client leaves, or the model is drained
	// finish leaves the gate and the drain's count and stops watching the
	// peer, but keeps the limiter's slot (see release).
	finish func()
	// freed counts the slots given back: one by one as the generations
	// of several choices end (releaseOne), the rest by release.
	freed atomic.Int32
}

// release frees everything the slot holds.
func (sl *slot) release(a *API) {
	for sl.freed.Add(1) <= int32(sl.n) {
		a.lim.release(sl.key.ID)
	}
	sl.finish()
}

// releaseOne frees the slot of one generation that ended (its runtime is
// done with it) while the request's other choices go on.
func (sl *slot) releaseOne(a *API) {
	if sl.freed.Add(1) <= int32(sl.n) {
		a.lim.release(sl.key.ID)
	}
}

// admit runs every step before the runtime: the drain, the key, the gate
// (waiting out a model switch), decode against the served model (which
// also checks what the model can take), the key's per-minute limits (one
// request, whatever the request carries), the model being loaded, and a
// fair slot, with the generation's context cancelled when the peer
// closes. decode returns how many generations the request runs (their
// slots are granted together, so two requests never each hold part of
// theirs while waiting). On false it has answered (or the client is gone)
// and holds nothing.
func (a *API) admit(ctx *fasthttp.RequestCtx, decode func(s *served) (slots int, e *openai.Error)) (*slot, bool) {
	if a.draining.Load() {
		a.m.Rejected(metrics.RejectDraining)
		a.writeError(ctx, openai.Unavailable("The server is shutting down; please retry."))
		return nil, false
	}
	key, ok := a.authenticate(ctx)
	if !ok {
		return nil, false
	}
	s, ok := a.enterGate(ctx)
	if !ok {
		return nil, false
	}
	n, e := a.decodeSafe(s, decode)
	if e == nil && n > a.lim.maxSlots() {
		// Its slots could never be granted together (limiter.acquireN).
		e = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "integer_above_max_value", Param: "n",
			Message: fmt.Sprintf("n is too large: %d. This deployment runs at most %d generations at once for a key, one per choice.", n, a.lim.maxSlots())}
	}
	if e != nil {
		a.gate.leave()
		a.writeError(ctx, e)
		return nil, false
	}
	if !a.allowKey(ctx, key) {
		a.gate.leave()
		return nil, false
	}

	a.inflight.Add(1)
	gctx, cancel := context.WithCancel(s.ctx)
	stopWatch := watchPeerClose(ctx.Conn(), cancel)
	sl := &slot{s: s, key: key, n: n, gctx: gctx, finish: func() {
		stopWatch()
		cancel()
		a.gate.leave()
		a.inflight.Done()
	}}
	if err := a.lim.acquireN(gctx, key.ID, n); err != nil {
		sl.finish()
		switch {
		case errors.Is(err, errQueueFull):
			a.m.Rejected(metrics.RejectQueueFull)
			a.writeError(ctx, openai.RateLimited(""))
		case s.ctx.Err() != nil:
			// Ended by a model switch's drain (or the hard stop) while
			// queued; if the client is gone too, the answer goes nowhere.
			a.writeError(ctx, openai.Unavailable("The deployment switched its model; please retry."))
		}
		// Otherwise the client left while queued: nobody to answer.
		return nil, false
	}
	return sl, true
}

// enterGate enters the served model's gate, waiting (bounded) for a model
// switch in progress; on false it has answered 503.
func (a *API) enterGate(ctx *fasthttp.RequestCtx) (*served, bool) {
	s, err := a.gate.enter(a.base, a.cfg.SwitchWait, a.cfg.MaxQueue)
	if err != nil {
		a.m.Rejected(metrics.RejectSwitching)
		a.writeError(ctx, openai.Unavailable("The deployment is switching its model; please retry shortly."))
		ctx.Response.Header.Set("Retry-After", "5")
		return nil, false
	}
	return s, true
}

// allowKey takes one request from the key's per-minute limits (with
// OpenAI's rate-limit headers for a limited key) and checks that the model
// is loaded; on false it has answered.
func (a *API) allowKey(ctx *fasthttp.RequestCtx, key apikeys.Key) bool {
	q := a.keys.Admit(key.ID)
	if q.Limited() {
		setRateLimitHeaders(&ctx.Response.Header, q)
	}
	switch {
	case !q.Allowed:
		a.m.Rejected(metrics.RejectKeyLimit)
		a.rateLimited(ctx, q)
	case !a.warm.Load():
		a.m.Rejected(metrics.RejectNotReady)
		a.writeError(ctx, openai.Unavailable("The model is still loading; please retry shortly."))
	default:
		return true
	}
	return false
}

// decodeSafe runs decode (the request's JSON), a panic in it answered as
// an internal error. It runs in the connection's goroutine: the hand-written
// decoders keep that stack at 4 KiB, and the goroutine no longer carries a
// stream (the relay has one of its own, or the event loop), so a goroutine
// apart for the decode (which encoding/json's 8 KiB once called for) saves
// nothing and costs a start and a stack growth per request.
func (a *API) decodeSafe(s *served, decode func(s *served) (int, *openai.Error)) (n int, e *openai.Error) {
	defer func() {
		if v := recover(); v != nil { // recover.go
			a.logPanic(recovered(v))
			n, e = 0, openai.InternalError()
		}
	}()
	return decode(s)
}
