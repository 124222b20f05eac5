package deployapi

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// handleChat serves POST /api/v1/chat/completions.
//
// Everything that can fail with a status code (auth, decoding, the key's
// limits, admission, the runtime accepting the request) happens before the
// response starts, so a streaming client gets a proper HTTP error rather
// than a broken stream.
func (a *API) handleChat(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	if a.draining.Load() {
		a.m.Rejected(metrics.RejectDraining)
		a.writeError(ctx, openai.Unavailable("The server is shutting down; please retry."))
		return
	}
	key, ok := a.authenticate(ctx)
	if !ok {
		return
	}
	s, req, ok := a.admitChat(ctx, key)
	if !ok {
		return
	}
	a.inflight.Add(1)
	gctx, cancel := context.WithCancel(s.ctx)
	stopWatch := watchPeerClose(ctx.Conn(), cancel)
	finish := func() {
		stopWatch()
		cancel()
		a.gate.leave()
		a.inflight.Done()
	}

	// The n choices' slots are granted together (limiter.acquireN), so
	// two requests never each hold part of theirs while waiting.
	n := req.N
	if err := a.lim.acquireN(gctx, key.ID, n); err != nil {
		finish()
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
		return
	}
	release := func() {
		for range n {
			a.lim.release(key.ID)
		}
		finish()
	}

	stream, err := startChoices(gctx, n, func(ctx context.Context, i int) (llm.Stream, error) {
		r := &req.Runtime
		if seed := r.Options.Seed; seed != nil && i > 0 {
			// Choice i samples with seed+i: the same seed would make every
			// choice the same answer.
			c := *r
			si := *seed + int64(i)
			c.Options.Seed = &si
			r = &c
		}
		return a.startGeneration(ctx, s, r)
	}, func(_ int, err error) {
		var ab llm.Abandoned
		if errors.As(err, &ab) {
			// The runtime still works on the request: its slot stays taken
			// until it is done, so the runtime never runs more than
			// --max-concurrent generations.
			go func() { <-ab.RuntimeDone(); a.lim.release(key.ID) }()
			return
		}
		a.lim.release(key.ID)
	})
	if err != nil {
		clientGone := gctx.Err() != nil
		finish() // every slot is settled by the callback above
		if clientGone && !errors.Is(err, llm.ErrTimeout) {
			a.m.ChatCompletion(metrics.FinishCancelled, req.Stream)
			return // client gone or shutting down: nobody to answer
		}
		a.m.ChatCompletion(metrics.FinishError, req.Stream)
		a.writeRuntimeError(ctx, err)
		return
	}

	a.m.StreamStarted()
	c := &completion{
		api:     a,
		served:  s,
		id:      openai.NewCompletionID(),
		created: start.Unix(),
		start:   start,
		stream:  stream,
		gctx:    gctx,
		keyID:   key.ID,
		isSSE:   req.Stream,

		logprobs: req.Runtime.Options.Logprobs,
	}
	c.choices = c.one[:]
	if n > 1 {
		c.choices = make([]choiceState, n)
	}
	done := func() {
		c.observe()
		a.m.StreamEnded()
		release()
	}
	if !req.Stream {
		defer done()
		c.respond(ctx)
		return
	}
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	conn := ctx.Conn()
	enc := openai.NewChunkEncoder(c.id, c.created, s.model, s.fingerprint, req.IncludeUsage)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer done()
		c.streamTo(w, conn, enc, req.IncludeUsage)
	})
}

// admitChat enters the served model's gate (waiting for a model switch in
// progress, bounded), decodes the request against that model and applies
// the key's per-minute limits. On false it has answered and left the gate;
// on true the caller leaves it when the generation ends.
func (a *API) admitChat(ctx *fasthttp.RequestCtx, key apikeys.Key) (*served, *openai.ChatRequest, bool) {
	s, err := a.gate.enter(a.base, a.cfg.SwitchWait, a.cfg.MaxQueue)
	if err != nil {
		a.m.Rejected(metrics.RejectSwitching)
		a.writeError(ctx, openai.Unavailable("The deployment is switching its model; please retry shortly."))
		ctx.Response.Header.Set("Retry-After", "5")
		return nil, nil, false
	}
	req, oerr := openai.DecodeChatRequest(ctx.PostBody(), s.model)
	if oerr == nil {
		oerr = a.checkLimits(s.ctx, s, &req.Runtime)
	}
	if oerr == nil && req.N > a.lim.maxSlots() {
		// Its slots could never be granted together (limiter.acquireN).
		oerr = &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "integer_above_max_value", Param: "n",
			Message: fmt.Sprintf("n is too large: %d. This deployment runs at most %d generations at once for a key, one per choice.", req.N, a.lim.maxSlots())}
	}
	if oerr != nil {
		a.gate.leave()
		a.writeError(ctx, oerr)
		return nil, nil, false
	}
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
		return s, req, true
	}
	a.gate.leave()
	return nil, nil, false
}

func (a *API) writeRuntimeError(ctx *fasthttp.RequestCtx, err error) {
	e := openai.RuntimeError(err)
	switch {
	case errors.Is(err, llm.ErrUnavailable):
		e = openai.Unavailable("The model runtime is unreachable or not ready; please retry shortly.")
	case e.Status >= 500 && e.Status != fasthttp.StatusGatewayTimeout:
		// An upstream failure, not ours: 502 says so and keeps 500 for bugs.
		e = &openai.Error{Status: fasthttp.StatusBadGateway, Message: "The model runtime failed to answer.", Type: openai.TypeServer}
	}
	a.log.Warn("chat request failed at the runtime", "status", e.Status, "err", err)
	a.writeError(ctx, e)
}

// completion is one chat completion being relayed: its choices'
// generations, merged.
type completion struct {
	api     *API
	served  *served // the model it runs on
	id      string
	created int64
	start   time.Time
	stream  choiceStream
	gctx    context.Context
	keyID   string
	isSSE   bool
	// logprobs: the request asked for them.
	logprobs bool

	// Observed as the completion runs; reported once by observe.
	firstAt, lastAt time.Time
	choices         []choiceState // one per choice; one[:] when n is 1
	one             [1]choiceState
}

// choiceState is what one choice's generation did.
type choiceState struct {
	finish           string // set when it ended
	prompt, complete int
	reasoning        int // pieces of thinking relayed (usage.completion_tokens_details)
	toolCalls        int // tool calls relayed
}

// token notes that a piece of content reached the client now.
func (c *completion) token(now time.Time) {
	if c.firstAt.IsZero() {
		c.firstAt = now
		c.api.m.ObserveTTFT(now.Sub(c.start))
	} else {
		c.api.m.ObserveInterToken(now.Sub(c.lastAt))
	}
	c.lastAt = now
}

// end records how choice i's generation ended. The key's usage counts
// what the runtime did: every generation's prompt and output tokens, and
// the request once.
func (c *completion) end(i int, ev llm.Event) {
	st := &c.choices[i]
	st.finish = finishReason(ev.FinishReason, st.toolCalls > 0)
	st.prompt, st.complete = ev.PromptTokens, ev.CompletionTokens
	requests := int64(0)
	if i == 0 {
		requests = 1
	}
	c.api.keys.RecordUsage(c.keyID, requests, int64(ev.PromptTokens), int64(ev.CompletionTokens))
}

// usage is the completion's token counts for its answer: the prompt once
// (as OpenAI reports it for n choices; the largest count of any choice,
// since a runtime's prompt cache may make later generations report less),
// and the runtime's completion tokens summed over the choices, with the
// reasoning pieces counted as reasoning tokens (each piece of thinking the
// runtime streams is one token; they are part of the completion tokens,
// as OpenAI counts them).
func (c *completion) usage() openai.Usage {
	var u openai.Usage
	for _, st := range c.choices {
		u.Prompt = max(u.Prompt, st.prompt)
		u.Completion += st.complete
		u.Reasoning += min(st.reasoning, st.complete)
	}
	return u
}

// observe reports the completion to metrics, once, at its end: each choice
// as a completion of its own, since each is a generation.
func (c *completion) observe() {
	m := c.api.m
	for _, st := range c.choices {
		switch {
		case st.finish != "":
			m.ChatCompletion(st.finish, c.isSSE)
			m.Tokens(st.prompt, st.complete)
		case c.gctx.Err() != nil:
			m.ChatCompletion(metrics.FinishCancelled, c.isSSE)
		default:
			m.ChatCompletion(metrics.FinishError, c.isSSE)
		}
	}
	m.ObserveChatDuration(time.Since(c.start))
}

// reply is one choice's answer as respond collects it.
type reply struct {
	text, reasoning strings.Builder
	calls           []llm.ToolCall
	lp              *[]llm.TokenLogprob
}

// respond collects the whole generation and answers it as one JSON object.
func (c *completion) respond(ctx *fasthttp.RequestCtx) {
	defer c.stream.Close()
	replies := make([]reply, len(c.choices))
	if c.logprobs {
		for i := range replies {
			replies[i].lp = &[]llm.TokenLogprob{}
		}
	}
	for {
		i, ev, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			c.api.writeRuntimeError(ctx, err)
			return
		}
		r, st := &replies[i], &c.choices[i]
		if ev.Content != "" || ev.Reasoning != "" {
			c.token(time.Now())
		}
		if ev.Reasoning != "" {
			r.reasoning.WriteString(ev.Reasoning)
			st.reasoning++
		}
		r.text.WriteString(ev.Content)
		r.calls = append(r.calls, ev.ToolCalls...)
		st.toolCalls += len(ev.ToolCalls)
		if r.lp != nil {
			*r.lp = append(*r.lp, ev.Logprobs...)
		}
		if ev.Done {
			c.end(i, ev)
			if len(c.choices) == 1 {
				break
			}
		}
	}
	for i := range c.choices {
		if c.choices[i].finish == "" {
			c.end(i, llm.Event{}) // ended without a final event
		}
	}
	bp := c.api.bufs.Get().(*[]byte)
	defer c.api.bufs.Put(bp)
	if len(c.choices) == 1 {
		r := &replies[0]
		*bp = openai.AppendCompletion((*bp)[:0], c.id, c.created, c.served.model, c.served.fingerprint,
			openai.Reply{Content: r.text.String(), Reasoning: r.reasoning.String(), ToolCalls: r.calls, Logprobs: r.lp}, c.choices[0].finish, c.usage())
	} else {
		choices := make([]openai.Choice, len(c.choices))
		for i := range replies {
			r := &replies[i]
			choices[i] = openai.Choice{Finish: c.choices[i].finish,
				Reply: openai.Reply{Content: r.text.String(), Reasoning: r.reasoning.String(), ToolCalls: r.calls, Logprobs: r.lp}}
		}
		*bp = openai.AppendCompletionChoices((*bp)[:0], c.id, c.created, c.served.model, c.served.fingerprint, choices, c.usage())
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

func finishReason(r string, sawToolCalls bool) string {
	switch {
	case sawToolCalls:
		return llm.FinishToolCalls
	case r == "":
		return llm.FinishStop
	}
	return r
}

// flusher is what streamTo needs of the response writer.
type flusher interface {
	io.Writer
	Flush() error
}

// streamTo relays the generation as server-sent events. Each event is
// flushed as soon as nothing more is ready: fasthttp's stream writer is
// buffered, so without the flush a client would see chunks in batches, and
// with a flush per event a burst of ready tokens would cost a write each.
//
// With n choices, each gets its role chunk first and its own finish chunk
// when its generation ends; usage (when asked for) and [DONE] follow the
// last.
func (c *completion) streamTo(w flusher, conn interface{ SetWriteDeadline(time.Time) error }, enc *openai.ChunkEncoder, includeUsage bool) {
	defer c.stream.Close()
	stall := c.api.cfg.WriteStallTimeout
	var deadline time.Time
	// A client that stops reading must not pin a generation slot forever:
	// bound each write. Moving the deadline costs a timer update, so it is
	// moved only when a quarter of the window has passed.
	armDeadline := func(now time.Time) {
		if deadline.Sub(now) < stall*3/4 {
			deadline = now.Add(stall)
			_ = conn.SetWriteDeadline(deadline)
		}
	}
	defer conn.SetWriteDeadline(time.Time{})

	encs := []*openai.ChunkEncoder{enc}
	if n := len(c.choices); n > 1 {
		encs = make([]*openai.ChunkEncoder, n)
		for i := range encs {
			encs[i] = enc.ForChoice(i)
		}
	}
	bp := c.api.bufs.Get().(*[]byte)
	buf := (*bp)[:0]
	for _, e := range encs {
		buf = e.AppendRole(buf)
	}
	defer func() { *bp = buf[:0]; c.api.bufs.Put(bp) }()
	now := time.Now()
	send := func() bool {
		armDeadline(now)
		if _, err := w.Write(buf); err != nil {
			return false
		}
		buf = buf[:0]
		return w.Flush() == nil
	}
	if !send() {
		return
	}
	live := len(c.choices)
	for {
		i, ev, err := c.stream.Recv()
		now = time.Now() // one clock read per event, for metrics and the write deadline
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			// The response has started: report the failure in the stream's
			// own format, then end it cleanly.
			if c.gctx.Err() == nil {
				c.api.log.Warn("generation failed mid-stream", "err", err)
			}
			buf = enc.AppendError(buf, openai.RuntimeError(err))
			buf = enc.AppendDone(buf)
			send()
			return
		}
		e, st := encs[i], &c.choices[i]
		if ev.Reasoning != "" {
			buf = e.AppendReasoning(buf, ev.Reasoning)
			st.reasoning++
			c.token(now)
		}
		switch {
		case c.logprobs && (ev.Content != "" || len(ev.Logprobs) > 0):
			buf = e.AppendContentLogprobs(buf, ev.Content, ev.Logprobs)
		case ev.Content != "":
			buf = e.AppendContent(buf, ev.Content)
		}
		if ev.Content != "" {
			c.token(now)
		}
		if len(ev.ToolCalls) > 0 {
			buf = e.AppendToolCalls(buf, ev.ToolCalls, st.toolCalls)
			st.toolCalls += len(ev.ToolCalls)
		}
		if ev.Done {
			c.end(i, ev)
			buf = e.AppendFinish(buf, st.finish)
			if live--; live == 0 {
				if includeUsage {
					buf = enc.AppendUsage(buf, c.usage())
				}
				buf = enc.AppendDone(buf)
				send()
				return
			}
		}
		if c.stream.Buffered() && len(buf) < 32<<10 {
			continue // more is ready now: one write for the burst
		}
		if len(buf) > 0 && !send() {
			return // client gone: the deferred Close stops the generation
		}
	}
}
