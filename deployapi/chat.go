package deployapi

import (
	"bufio"
	"context"
	"errors"
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
func (a *API) handleChat(ctx *fasthttp.RequestCtx) {
	c, req, ok := startGeneration(a, ctx, openai.DecodeChatRequest, chatParts, &chatLimitParams)
	if !ok {
		return
	}
	c.id = openai.NewCompletionID()
	c.logprobs = req.Runtime.Options.Logprobs
	if !req.Stream {
		defer c.done()
		c.respond(ctx)
		return
	}
	conn := ctx.Conn()
	sink := &chatSink{
		enc:          openai.NewChunkEncoder(c.id, c.created, c.served.model, c.served.fingerprint, req.IncludeUsage),
		includeUsage: req.IncludeUsage,
		logprobs:     c.logprobs,
	}
	setSSEHeaders(ctx)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer c.done()
		c.relay(w, conn, sink)
	})
}

// chatParts is what the shared generation path needs of a chat request.
func chatParts(r *openai.ChatRequest) (*llm.Request, bool) { return &r.Runtime, r.Stream }

func setSSEHeaders(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
}

// startGeneration is the path every generating route shares, up to the
// runtime accepting the request: the drain check, auth, decoding with
// decode (parts gives the runtime request and whether it streams), the
// key's limits, admission and the runtime's answer. On false it has
// answered; on true the caller relays the completion and calls c.done at
// its end.
//
// Everything that can fail with a status code happens here, before the
// response starts, so a streaming client gets a proper HTTP error rather
// than a broken stream.
func startGeneration[R any](a *API, ctx *fasthttp.RequestCtx, decode func(body []byte, model string) (*R, *openai.Error),
	parts func(*R) (*llm.Request, bool), params *limitParams) (*completion, *R, bool) {
	start := time.Now()
	if a.draining.Load() {
		a.m.Rejected(metrics.RejectDraining)
		a.writeError(ctx, openai.Unavailable("The server is shutting down; please retry."))
		return nil, nil, false
	}
	key, ok := a.authenticate(ctx)
	if !ok {
		return nil, nil, false
	}
	s, req, ok := admit(a, ctx, key, decode, parts, params)
	if !ok {
		return nil, nil, false
	}
	rreq, streamed := parts(req)
	a.inflight.Add(1)
	gctx, cancel := context.WithCancel(s.ctx)
	stopWatch := watchPeerClose(ctx.Conn(), cancel)
	finish := func() {
		stopWatch()
		cancel()
		a.gate.leave()
		a.inflight.Done()
	}

	if err := a.lim.acquire(gctx, key.ID); err != nil {
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
		return nil, nil, false
	}
	release := func() { a.lim.release(key.ID); finish() }

	stream, err := s.rt.Chat(gctx, rreq)
	if err != nil {
		clientGone := gctx.Err() != nil
		var ab llm.Abandoned
		if errors.As(err, &ab) {
			// The runtime still works on the request: its slot stays taken
			// until it is done, so the runtime never runs more than
			// --max-concurrent generations.
			finish()
			go func() { <-ab.RuntimeDone(); a.lim.release(key.ID) }()
		} else {
			release()
		}
		if clientGone && !errors.Is(err, llm.ErrTimeout) {
			a.m.ChatCompletion(metrics.FinishCancelled, streamed)
			return nil, nil, false // client gone or shutting down: nobody to answer
		}
		a.m.ChatCompletion(metrics.FinishError, streamed)
		a.writeRuntimeError(ctx, err)
		return nil, nil, false
	}

	a.m.StreamStarted()
	c := &completion{
		api:     a,
		served:  s,
		created: start.Unix(),
		start:   start,
		stream:  stream,
		gctx:    gctx,
		keyID:   key.ID,
		isSSE:   streamed,
	}
	c.done = func() {
		c.observe()
		a.m.StreamEnded()
		release()
	}
	return c, req, true
}

// admit enters the served model's gate (waiting for a model switch in
// progress, bounded), decodes the request against that model and applies
// the key's per-minute limits. On false it has answered and left the gate;
// on true the caller leaves it when the generation ends.
func admit[R any](a *API, ctx *fasthttp.RequestCtx, key apikeys.Key, decode func(body []byte, model string) (*R, *openai.Error),
	parts func(*R) (*llm.Request, bool), params *limitParams) (*served, *R, bool) {
	s, err := a.gate.enter(a.base, a.cfg.SwitchWait, a.cfg.MaxQueue)
	if err != nil {
		a.m.Rejected(metrics.RejectSwitching)
		a.writeError(ctx, openai.Unavailable("The deployment is switching its model; please retry shortly."))
		ctx.Response.Header.Set("Retry-After", "5")
		return nil, nil, false
	}
	req, oerr := decode(ctx.PostBody(), s.model)
	if oerr == nil {
		rreq, _ := parts(req)
		oerr = a.checkLimits(s.ctx, s, rreq, params)
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

// completion is one chat completion being relayed.
type completion struct {
	api     *API
	served  *served // the model it runs on
	id      string
	created int64
	start   time.Time
	stream  llm.Stream
	gctx    context.Context
	keyID   string
	isSSE   bool
	// logprobs: the request asked for them.
	logprobs bool
	// done reports the generation and frees its slot; called once, when
	// the relay ends.
	done func()

	// Observed as the completion runs; reported once by observe.
	firstAt, lastAt  time.Time
	finish           string
	prompt, complete int
	reasoning        int // pieces of thinking relayed (usage.completion_tokens_details)
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

// end records how the generation ended.
func (c *completion) end(ev llm.Event, sawToolCalls bool) {
	c.finish = finishReason(ev.FinishReason, sawToolCalls)
	c.prompt, c.complete = ev.PromptTokens, ev.CompletionTokens
	c.api.keys.RecordUsage(c.keyID, 1, int64(ev.PromptTokens), int64(ev.CompletionTokens))
}

// usage is the completion's token counts for its answer: the runtime's,
// with the reasoning pieces counted as reasoning tokens (each piece of
// thinking the runtime streams is one token; they are part of the
// completion tokens, as OpenAI counts them).
func (c *completion) usage(last llm.Event) openai.Usage {
	return openai.Usage{Prompt: last.PromptTokens, Completion: last.CompletionTokens,
		Reasoning: min(c.reasoning, last.CompletionTokens)}
}

// observe reports the completion to metrics, once, at its end.
func (c *completion) observe() {
	m := c.api.m
	switch {
	case c.finish != "":
		m.ChatCompletion(c.finish, c.isSSE)
		m.Tokens(c.prompt, c.complete)
	case c.gctx.Err() != nil:
		m.ChatCompletion(metrics.FinishCancelled, c.isSSE)
	default:
		m.ChatCompletion(metrics.FinishError, c.isSSE)
	}
	m.ObserveChatDuration(time.Since(c.start))
}

// respond collects the whole generation and answers it as one JSON object.
func (c *completion) respond(ctx *fasthttp.RequestCtx) {
	var text, reasoning strings.Builder
	var calls []llm.ToolCall
	var lp *[]llm.TokenLogprob
	if c.logprobs {
		lp = &[]llm.TokenLogprob{}
	}
	last, err := c.collect(func(ev *llm.Event) {
		reasoning.WriteString(ev.Reasoning)
		text.WriteString(ev.Content)
		calls = append(calls, ev.ToolCalls...)
		if lp != nil {
			*lp = append(*lp, ev.Logprobs...)
		}
	})
	if err != nil {
		c.api.writeRuntimeError(ctx, err)
		return
	}
	bp := c.api.bufs.Get().(*[]byte)
	defer c.api.bufs.Put(bp)
	*bp = openai.AppendCompletion((*bp)[:0], c.id, c.created, c.served.model, c.served.fingerprint,
		openai.Reply{Content: text.String(), Reasoning: reasoning.String(), ToolCalls: calls, Logprobs: lp}, c.finish, c.usage(last))
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

// collect runs the whole generation for an answer that is not streamed,
// handing each event to each, and records its end. It returns the final
// event, or the runtime's error.
func (c *completion) collect(each func(*llm.Event)) (llm.Event, error) {
	defer c.stream.Close()
	sawToolCalls := false
	for {
		ev, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			// A stream that ends without its final event ends as stop.
			c.end(llm.Event{}, sawToolCalls)
			return llm.Event{}, nil
		}
		if err != nil {
			return llm.Event{}, err
		}
		if ev.Content != "" || ev.Reasoning != "" {
			c.token(time.Now())
		}
		if ev.Reasoning != "" {
			c.reasoning++
		}
		sawToolCalls = sawToolCalls || len(ev.ToolCalls) > 0
		each(&ev)
		if ev.Done {
			c.end(ev, sawToolCalls)
			return ev, nil
		}
	}
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

// flusher is what relay needs of the response writer.
type flusher interface {
	io.Writer
	Flush() error
}

// streamSink encodes a streamed generation's events in one route's wire
// format; relay decides when they are written.
type streamSink interface {
	// begin appends what opens the stream.
	begin(dst []byte) []byte
	// event appends what an event carries: content, reasoning, tool calls
	// (also on the final event).
	event(dst []byte, ev *llm.Event) []byte
	// finish appends what closes the stream, after c.end recorded how the
	// generation ended.
	finish(dst []byte, c *completion, last *llm.Event) []byte
	// fail appends the report of a failure after the stream started.
	fail(dst []byte, e *openai.Error) []byte
}

// relay streams the generation as server-sent events encoded by sink.
// Each event is flushed as soon as nothing more is ready: fasthttp's
// stream writer is buffered, so without the flush a client would see
// chunks in batches, and with a flush per event a burst of ready tokens
// would cost a write each.
func (c *completion) relay(w flusher, conn interface{ SetWriteDeadline(time.Time) error }, sink streamSink) {
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
	buffered, _ := c.stream.(llm.Buffered)

	bp := c.api.bufs.Get().(*[]byte)
	buf := sink.begin((*bp)[:0])
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
	sawToolCalls := false
	for {
		ev, err := c.stream.Recv()
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
			buf = sink.fail(buf, openai.RuntimeError(err))
			send()
			return
		}
		if ev.Reasoning != "" {
			c.reasoning++
		}
		if ev.Content != "" || ev.Reasoning != "" {
			c.token(now)
		}
		sawToolCalls = sawToolCalls || len(ev.ToolCalls) > 0
		buf = sink.event(buf, &ev)
		if ev.Done {
			c.end(ev, sawToolCalls)
			buf = sink.finish(buf, c, &ev)
			send()
			return
		}
		if buffered != nil && buffered.Buffered() && len(buf) < 32<<10 {
			continue // more is ready now: one write for the burst
		}
		if len(buf) > 0 && !send() {
			return // client gone: the deferred Close stops the generation
		}
	}
}

// chatSink encodes a streamed chat completion as chat.completion.chunk
// events.
type chatSink struct {
	enc          *openai.ChunkEncoder
	includeUsage bool
	logprobs     bool
	toolIndex    int // tool calls sent so far
}

func (k *chatSink) begin(dst []byte) []byte { return k.enc.AppendRole(dst) }

func (k *chatSink) event(dst []byte, ev *llm.Event) []byte {
	if ev.Reasoning != "" {
		dst = k.enc.AppendReasoning(dst, ev.Reasoning)
	}
	switch {
	case k.logprobs && (ev.Content != "" || len(ev.Logprobs) > 0):
		dst = k.enc.AppendContentLogprobs(dst, ev.Content, ev.Logprobs)
	case ev.Content != "":
		dst = k.enc.AppendContent(dst, ev.Content)
	}
	if len(ev.ToolCalls) > 0 {
		dst = k.enc.AppendToolCalls(dst, ev.ToolCalls, k.toolIndex)
		k.toolIndex += len(ev.ToolCalls)
	}
	return dst
}

func (k *chatSink) finish(dst []byte, c *completion, last *llm.Event) []byte {
	dst = k.enc.AppendFinish(dst, c.finish)
	if k.includeUsage {
		dst = k.enc.AppendUsage(dst, c.usage(*last))
	}
	return k.enc.AppendDone(dst)
}

func (k *chatSink) fail(dst []byte, e *openai.Error) []byte {
	return k.enc.AppendDone(k.enc.AppendError(dst, e))
}
