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
		return
	}
	release := func() { a.lim.release(key.ID); finish() }

	stream, err := s.rt.Chat(gctx, &req.Runtime)
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
	s, ok := a.enterGate(ctx)
	if !ok {
		return nil, nil, false
	}
	req, oerr := openai.DecodeChatRequest(ctx.PostBody(), s.model)
	if oerr == nil {
		oerr = a.checkLimits(s.ctx, s, &req.Runtime)
	}
	if oerr != nil {
		a.gate.leave()
		a.writeError(ctx, oerr)
		return nil, nil, false
	}
	if !a.allowKey(ctx, key) {
		a.gate.leave()
		return nil, nil, false
	}
	return s, req, true
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
	defer c.stream.Close()
	var text, reasoning strings.Builder
	var calls []llm.ToolCall
	var lp *[]llm.TokenLogprob
	if c.logprobs {
		lp = &[]llm.TokenLogprob{}
	}
	var last llm.Event
	for {
		ev, err := c.stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			c.api.writeRuntimeError(ctx, err)
			return
		}
		if ev.Content != "" || ev.Reasoning != "" {
			c.token(time.Now())
		}
		if ev.Reasoning != "" {
			reasoning.WriteString(ev.Reasoning)
			c.reasoning++
		}
		text.WriteString(ev.Content)
		calls = append(calls, ev.ToolCalls...)
		if lp != nil {
			*lp = append(*lp, ev.Logprobs...)
		}
		if ev.Done {
			last = ev
			break
		}
	}
	c.end(last, len(calls) > 0)
	bp := c.api.bufs.Get().(*[]byte)
	defer c.api.bufs.Put(bp)
	*bp = openai.AppendCompletion((*bp)[:0], c.id, c.created, c.served.model, c.served.fingerprint,
		openai.Reply{Content: text.String(), Reasoning: reasoning.String(), ToolCalls: calls, Logprobs: lp}, c.finish, c.usage(last))
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
	buffered, _ := c.stream.(llm.Buffered)

	bp := c.api.bufs.Get().(*[]byte)
	buf := enc.AppendRole((*bp)[:0])
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
	toolIndex := 0
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
			buf = enc.AppendError(buf, openai.RuntimeError(err))
			buf = enc.AppendDone(buf)
			send()
			return
		}
		if ev.Reasoning != "" {
			buf = enc.AppendReasoning(buf, ev.Reasoning)
			c.reasoning++
			c.token(now)
		}
		switch {
		case c.logprobs && (ev.Content != "" || len(ev.Logprobs) > 0):
			buf = enc.AppendContentLogprobs(buf, ev.Content, ev.Logprobs)
		case ev.Content != "":
			buf = enc.AppendContent(buf, ev.Content)
		}
		if ev.Content != "" {
			c.token(now)
		}
		if len(ev.ToolCalls) > 0 {
			buf = enc.AppendToolCalls(buf, ev.ToolCalls, toolIndex)
			toolIndex += len(ev.ToolCalls)
		}
		if ev.Done {
			c.end(ev, toolIndex > 0)
			buf = enc.AppendFinish(buf, c.finish)
			if includeUsage {
				buf = enc.AppendUsage(buf, c.usage(ev))
			}
			buf = enc.AppendDone(buf)
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
