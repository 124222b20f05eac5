package deployapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// demand is what a decoded request will take: its generation slots, and
// its tokens estimated ahead, which are reserved against the key's tokens
// per minute while it runs (apikeys.Authenticator.Admit) and settled
// against what it really used when it ends.
type demand struct {
	slots  int
	prompt int // estimated prompt tokens of each generation (estimateTokens)
	output int // the most output tokens of each generation; 0 when not known
	// schemaParam names the parameter whose JSON schema the runtime
	// samples with, so that the runtime's refusal of a schema names it;
	// "" when there is none.
	schemaParam string
}

// reserve is the tokens reserved at admission: each generation's prompt
// and its most output.
func (d demand) reserve() int64 { return int64(d.slots) * int64(d.prompt+d.output) }

// slot is a request admitted to the served model that holds its
// generation slots (one per generation it runs: a request with n choices
// holds n): what every route that reaches the runtime runs on.
type slot struct {
	s    *served
	key  apikeys.Key
	n    int             // generation slots held
	est  demand          // what it was admitted with
	gctx context.Context // ends when the client leaves, or the model is drained
	// finish leaves the gate and the drain's count, stops watching the
	// peer and settles the key's usage (settle), but keeps the limiter's
	// slot (see release).
	finish func()
	// freed counts the slots given back: one by one as the generations
	// of several choices end (releaseOne), the rest by release.
	freed atomic.Int32
	// reserved is the tokens the key's limit holds for the request until
	// it is settled; prompt and completion what it used (charge).
	reserved           int64
	prompt, completion atomic.Int64
}

// yield gives the request's one slot back between two steps of its work
// and waits its turn for one again (limiter.requeue), so that a request
// run in steps lets other requests in between. On an error (the client
// left, the model drained) it holds no slot.
func (sl *slot) yield(a *API) error {
	if err := a.lim.requeue(sl.gctx, sl.key.ID); err != nil {
		sl.freed.Add(1) // nothing left for release to give back
		return err
	}
	return nil
}

// charge adds tokens the request used: its generations' counts as the
// runtime reports them, or estimates for generations that did not end
// with a report. They reach the key's usage and limit when it ends.
func (sl *slot) charge(prompt, completion int) {
	sl.prompt.Add(int64(prompt))
	sl.completion.Add(int64(completion))
}

// settle charges the key what the request used, and counts it as one
// request, however it ended (answered, cancelled, timed out or failed),
// then gives back its reservation.
func (sl *slot) settle(a *API) {
	a.keys.RecordUsage(sl.key.ID, 1, sl.prompt.Load(), sl.completion.Load())
	a.keys.Release(sl.key.ID, sl.reserved)
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
// request, and its estimated tokens reserved), the model being loaded,
// and a fair slot, with the generation's context cancelled when the peer
// closes. decode returns what the request takes: how many generations it
// runs (their slots are granted together, so two requests never each hold
// part of theirs while waiting) and its tokens estimated. On false it has
// answered (or closed the connection of a client that is gone) and holds
// nothing.
func (a *API) admit(ctx *fasthttp.RequestCtx, decode func(s *served) (demand, *openai.Error)) (*slot, bool) {
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
	d, e := a.decodeSafe(s, decode)
	n := d.slots
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
	reserved, ok := a.allowKey(ctx, key, d.reserve())
	if !ok {
		a.gate.leave()
		return nil, false
	}

	a.inflight.Add(1)
	gctx, cancel := context.WithCancel(s.ctx)
	stopWatch := watchPeerClose(ctx.Conn(), cancel)
	sl := &slot{s: s, key: key, n: n, est: d, gctx: gctx, reserved: reserved}
	if err := a.lim.acquireN(gctx, key.ID, n); err != nil {
		// Not run: nothing to charge, and the reservation goes back.
		stopWatch()
		cancel()
		a.keys.Release(key.ID, reserved)
		a.gate.leave()
		a.inflight.Done()
		switch {
		case errors.Is(err, errQueueFull):
			a.m.Rejected(metrics.RejectQueueFull)
			a.writeError(ctx, openai.RateLimited(""))
		case s.ctx.Err() != nil:
			// Ended by a model switch's drain (or the hard stop) while
			// queued; if the client is gone too, the answer goes nowhere.
			a.writeError(ctx, openai.Unavailable("The deployment switched its model; please retry."))
		default:
			closeUnanswered(ctx) // the client left while queued
		}
		return nil, false
	}
	sl.finish = func() {
		stopWatch()
		cancel()
		sl.settle(a)
		a.gate.leave()
		a.inflight.Done()
	}
	return sl, true
}

// closeUnanswered ends a request whose client is gone without an answer:
// its connection is closed. The peer watch sees a FIN, which a client
// that only shut its write side after a whole request sends too; an
// empty answer (fasthttp's default 200 with no body) would pass for a
// success to such a client, a closed connection cannot. The status is
// for the request's metrics only (nginx's "client closed request").
func closeUnanswered(ctx *fasthttp.RequestCtx) {
	ctx.SetStatusCode(statusClientClosed)
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { _ = c.Close() })
}

// statusClientClosed is the status a request whose client left before
// its answer is counted with.
const statusClientClosed = 499

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

// allowKey takes one request from the key's per-minute limits and
// reserves reserve tokens (with OpenAI's rate-limit headers for a limited
// key, what is left after both) and checks that the model is loaded. It
// returns the tokens reserved; on false it has answered and holds none.
func (a *API) allowKey(ctx *fasthttp.RequestCtx, key apikeys.Key, reserve int64) (int64, bool) {
	q := a.keys.Admit(key.ID, reserve)
	if q.Limited() {
		setRateLimitHeaders(&ctx.Response.Header, q)
	}
	switch {
	case !q.Allowed:
		a.m.Rejected(metrics.RejectKeyLimit)
		a.rateLimited(ctx, q)
	case !a.warm.Load():
		a.keys.Release(key.ID, q.Reserved)
		a.m.Rejected(metrics.RejectNotReady)
		a.writeError(ctx, openai.Unavailable("The model is still loading; please retry shortly."))
	default:
		return q.Reserved, true
	}
	return 0, false
}

// decodeSafe runs decode (the request's JSON), a panic in it answered as
// an internal error. It runs in the connection's goroutine: the hand-written
// decoders keep that stack at 4 KiB, and the goroutine no longer carries a
// stream (the relay has one of its own, or the event loop), so a goroutine
// apart for the decode (which encoding/json's 8 KiB once called for) saves
// nothing and costs a start and a stack growth per request.
func (a *API) decodeSafe(s *served, decode func(s *served) (demand, *openai.Error)) (d demand, e *openai.Error) {
	defer func() {
		if v := recover(); v != nil { // recover.go
			a.logPanic(recovered(v))
			d, e = demand{}, openai.InternalError()
		}
	}()
	return decode(s)
}
