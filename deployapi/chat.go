package deployapi

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

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
	var req *openai.ChatRequest
	sl, ok := a.admit(ctx, func(s *served) (demand, *openai.Error) {
		r, e := openai.DecodeChatRequest(ctx.PostBody(), s.model)
		if e == nil {
			e = a.checkLimits(s.ctx, s, &r.Runtime, &chatLimitParams)
		}
		if e != nil {
			return demand{}, e
		}
		req = r
		return generationDemand(s, &r.Runtime, r.N, schemaParam(&r.Runtime, "response_format")), nil
	})
	if !ok {
		return
	}
	c, ok := a.startCompletion(ctx, metrics.RouteChatCompletions, sl, start, req.Stream, func(gctx context.Context, i int) (llm.Stream, error) {
		return a.startGeneration(gctx, sl.s, choiceRequest(&req.Runtime, i))
	})
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
	enc := openai.NewChunkEncoder(c.id, c.created, c.served.model, c.served.fingerprint, req.IncludeUsage)
	c.streamSSE(ctx, newChatSink(enc, len(c.choices), req.IncludeUsage, c.logprobs))
}

// failed answers a request whose generation (or embedding) failed with
// err before its answer started: a model switch's drain ended it (503),
// its client is gone (nobody to answer: closeUnanswered), or the runtime
// failed (writeRuntimeError). A runtime that would not take the
// request's JSON schema is a 400 naming the parameter that carried it.
func (a *API) failed(ctx *fasthttp.RequestCtx, sl *slot, err error) {
	switch {
	case sl.s.ctx.Err() != nil && !errors.Is(err, llm.ErrTimeout):
		a.logPanic(err)
		a.writeError(ctx, openai.Unavailable("The deployment switched its model; please retry."))
	case sl.gctx.Err() != nil && !errors.Is(err, llm.ErrTimeout):
		a.logPanic(err) // nobody to answer, but a bug to report
		closeUnanswered(ctx)
	default:
		var inv *llm.InvalidRequestError
		if errors.As(err, &inv) && inv.Schema && inv.Param == "" && sl.est.schemaParam != "" {
			err = &llm.InvalidRequestError{Msg: inv.Msg, Param: sl.est.schemaParam, Schema: true}
		}
		a.writeRuntimeError(ctx, err)
	}
}

func (a *API) writeRuntimeError(ctx *fasthttp.RequestCtx, err error) {
	if a.logPanic(err) {
		a.writeError(ctx, openai.InternalError())
		return
	}
	e := openai.RuntimeError(err)
	switch {
	case errors.Is(err, llm.ErrUnavailable):
		e = openai.Unavailable("The model runtime is unreachable or not ready; please retry shortly.")
	case e.Status >= 500 && e.Status != fasthttp.StatusGatewayTimeout:
		// An upstream failure, not ours: 502 says so and keeps 500 for bugs.
		e = &openai.Error{Status: fasthttp.StatusBadGateway, Message: "The model runtime failed to answer.", Type: openai.TypeServer}
	}
	a.log.Warn("request failed at the runtime", "status", e.Status, "err", err)
	a.writeError(ctx, e)
}

// choiceRequest is the runtime request of choice i: choice i samples with
// seed+i, since the same seed would make every choice the same answer.
func choiceRequest(r *llm.Request, i int) *llm.Request {
	if r.Options.Seed == nil || i == 0 {
		return r
	}
	c := *r
	c.Options = choiceOptions(r.Options, i)
	return &c
}

func choiceOptions(o llm.Options, i int) llm.Options {
	if o.Seed != nil && i > 0 {
		si := *o.Seed + int64(i)
		o.Seed = &si
	}
	return o
}

// startCompletion starts the admitted request's generations, one per slot
// it holds (its choices), choice i with gen(ctx, i). On false it has
// answered (or the client is gone) and released the slots; on true the
// caller relays the completion and calls c.done at its end.
func (a *API) startCompletion(ctx *fasthttp.RequestCtx, route string, sl *slot, start time.Time, streamed bool,
	gen func(ctx context.Context, i int) (llm.Stream, error)) (*completion, bool) {
	n := sl.n
	// held are the generations that hold back what they generate
	// (forcedStream), whose tokens a cancellation must still charge.
	held := make([]generator, n)
	stream, err := startChoices(sl.gctx, n, func(ctx context.Context, i int) (llm.Stream, error) {
		st, err := gen(ctx, i)
		held[i], _ = st.(generator)
		return st, err
	}, func(_ int, err error) {
		if err == nil || readPrompt(err, sl.gctx) {
			// Closed after it started, or given up on while the runtime
			// read the prompt: the prompt was read, at least in part.
			sl.charge(sl.est.prompt, 0)
		}
		var ab llm.Abandoned
		if errors.As(err, &ab) {
			// The runtime still works on the request: its slot stays taken
			// until it is done, so the runtime never runs more than
			// --max-concurrent generations.
			go func() { <-ab.RuntimeDone(); a.lim.release(sl.key.ID) }()
			return
		}
		a.lim.release(sl.key.ID)
	})
	if err != nil {
		if sl.gctx.Err() != nil && !errors.Is(err, llm.ErrTimeout) {
			a.m.Generation(route, sl.s.model, metrics.FinishCancelled, streamed)
		} else {
			a.m.Generation(route, sl.s.model, metrics.FinishError, streamed)
		}
		a.failed(ctx, sl, err)
		sl.finish() // every slot is settled by the callback above
		return nil, false
	}

	a.m.StreamStarted()
	c := &completion{
		api:     a,
		route:   route,
		served:  sl.s,
		created: start.Unix(),
		start:   start,
		stream:  stream,
		gctx:    sl.gctx,
		isSSE:   streamed,
		sl:      sl,
		held:    held,
	}
	c.choices = c.one[:]
	if n > 1 {
		c.choices = make([]choiceState, n)
	}
	c.done = func() {
		c.observe()
		c.charge()
		a.m.StreamEnded()
		sl.release(a)
	}
	return c, true
}

// readPrompt reports whether a generation that failed to start with err
// had the runtime read its prompt: it timed out waiting for the runtime's
// first answer (504), or was given up on (its client gone, the model
// drained) while the runtime worked on it. A runtime that refused the
// request or could not be reached read nothing.
func readPrompt(err error, gctx context.Context) bool {
	var ab llm.Abandoned
	return errors.Is(err, llm.ErrTimeout) || errors.As(err, &ab) ||
		gctx.Err() != nil && !errors.Is(err, llm.ErrUnavailable) && !isInvalid(err)
}

func isInvalid(err error) bool {
	var inv *llm.InvalidRequestError
	return errors.As(err, &inv)
}

// generator is a generation's stream that holds back what it generates
// (forcedStream): generated is how many pieces it received.
type generator interface{ generated() int }

// completion is one completion being relayed: its choices' generations,
// merged.
type completion struct {
	api     *API
	route   string  // its route's metrics label
	served  *served // the model it runs on
	id      string
	created int64
	start   time.Time
	stream  choiceStream
	gctx    context.Context
	isSSE   bool
	sl      *slot
	held    []generator // per choice; nil where the stream holds nothing back
	// logprobs: the request asked for them.
	logprobs bool
	// done reports the generation and frees its slots; called once, when
	// the relay ends.
	done func()

	// Observed as the completion runs; reported once by observe.
	firstAt, lastAt time.Time
	choices         []choiceState // one per choice; one[:] when n is 1
	one             [1]choiceState
}

// choiceState is what one choice's generation did.
type choiceState struct {
	finish           string // set when it ended
	prompt, complete int
	// reported: the runtime counted its tokens (prompt, complete) in a
	// final event.
	reported  bool
	pieces    int // tokens relayed: content and thinking pieces, tool calls estimated
	reasoning int // pieces of thinking relayed (usage.completion_tokens_details)
	toolCalls int // tool calls relayed
}

// token notes that a piece of content reached the client now.
func (c *completion) token(now time.Time) {
	if c.firstAt.IsZero() {
		c.firstAt = now
		c.api.m.ObserveTTFT(c.route, now.Sub(c.start))
	} else {
		c.api.m.ObserveInterToken(now.Sub(c.lastAt))
	}
	c.lastAt = now
}

// seen notes an event of choice i as it is relayed.
func (c *completion) seen(i int, ev *llm.Event, now time.Time) {
	st := &c.choices[i]
	if ev.Reasoning != "" {
		st.reasoning++
	}
	if ev.Content != "" || ev.Reasoning != "" {
		st.pieces++
		c.token(now)
	}
	for _, tc := range ev.ToolCalls {
		st.pieces += estimateTokens(len(tc.Name) + len(tc.Arguments))
	}
	st.toolCalls += len(ev.ToolCalls)
}

// end records how choice i's generation ended.
func (c *completion) end(i int, ev llm.Event) {
	st := &c.choices[i]
	st.finish = finishReason(ev.FinishReason, st.toolCalls > 0)
	st.prompt, st.complete = ev.PromptTokens, ev.CompletionTokens
	st.reported = ev.PromptTokens > 0 || ev.CompletionTokens > 0
	if ev.Done && len(c.choices) > 1 {
		// The runtime is done with this generation: its slot may serve
		// another request while the other choices go on.
		c.sl.releaseOne(c.api)
	}
}

// charge adds what the completion's generations used to the request's
// usage: the runtime's counts where it reported them; for a generation
// that ended without (cancelled, failed, cut by a model switch), its
// prompt (as another choice's was counted, else estimated) and the tokens
// it generated up to its end. Called once, after the stream is closed.
func (c *completion) charge() {
	known := 0
	for _, st := range c.choices {
		if st.reported {
			known = max(known, st.prompt)
		}
	}
	if known == 0 {
		known = c.sl.est.prompt
	}
	prompt, complete := 0, 0
	for i, st := range c.choices {
		if st.reported {
			prompt, complete = prompt+st.prompt, complete+st.complete
			continue
		}
		out := st.pieces
		if g := c.held[i]; g != nil {
			out = max(out, g.generated())
		}
		prompt, complete = prompt+known, complete+out
	}
	c.sl.charge(prompt, complete)
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
// as a generation of its own. A streamed answer ends here, after its
// handler returned: its request's duration is observed here too (Handle
// observes the others).
func (c *completion) observe() {
	m, model := c.api.m, c.served.model
	for _, st := range c.choices {
		switch {
		case st.finish != "":
			m.Generation(c.route, model, st.finish, c.isSSE)
			m.Tokens(c.route, model, st.prompt, st.complete, min(st.reasoning, st.complete))
		case c.gctx.Err() != nil:
			m.Generation(c.route, model, metrics.FinishCancelled, c.isSSE)
		default:
			m.Generation(c.route, model, metrics.FinishError, c.isSSE)
		}
	}
	if c.isSSE {
		m.ObserveRequest(c.route, model, time.Since(c.start))
	}
	c.api.keys.RecordOutcome(c.sl.key.ID, c.outcome())
}

// collect runs every generation to its end for an answer that is not
// streamed, handing each event to each with its choice, and records each
// choice's end. It returns the runtime's error, if any.
func (c *completion) collect(each func(i int, ev *llm.Event)) error {
	defer c.stream.Close()
	var ev llm.Event // one for the request, not one on the heap per token
	for {
		i, e, err := c.stream.Recv()
		ev = e
		if err != nil {
			if isEOF(err) {
				break
			}
			return err
		}
		c.seen(i, &ev, time.Now())
		each(i, &ev)
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
	return nil
}

// reply is one choice's answer as respond collects it.
type reply struct {
	text, reasoning strings.Builder
	calls           []llm.ToolCall
	lp              *[]llm.TokenLogprob
}

// respond collects the whole generation and answers it as one JSON object.
func (c *completion) respond(ctx *fasthttp.RequestCtx) {
	replies := make([]reply, len(c.choices))
	if c.logprobs {
		for i := range replies {
			replies[i].lp = &[]llm.TokenLogprob{}
		}
	}
	err := c.collect(func(i int, ev *llm.Event) {
		r := &replies[i]
		r.reasoning.WriteString(ev.Reasoning)
		r.text.WriteString(ev.Content)
		r.calls = append(r.calls, ev.ToolCalls...)
		if r.lp != nil {
			*r.lp = append(*r.lp, ev.Logprobs...)
		}
	})
	if err != nil {
		c.api.failed(ctx, c.sl, err)
		return
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

// chatSink encodes a streamed chat completion as chat.completion.chunk
// events: each choice gets its role chunk first and its own finish chunk
// when its generation ends; usage (when asked for) and [DONE] follow the
// last.
type chatSink struct {
	choiceSink[*openai.ChunkEncoder]
	logprobs bool
}

func newChatSink(enc *openai.ChunkEncoder, n int, includeUsage, logprobs bool) *chatSink {
	k := &chatSink{logprobs: logprobs}
	k.init(enc, n, includeUsage)
	return k
}

func (k *chatSink) begin(dst []byte) []byte {
	for _, e := range k.encs {
		dst = e.AppendRole(dst)
	}
	return dst
}

func (k *chatSink) event(dst []byte, c *completion, i int, ev *llm.Event) []byte {
	e := k.encs[i]
	if ev.Reasoning != "" {
		dst = e.AppendReasoning(dst, ev.Reasoning)
	}
	switch {
	case k.logprobs && (ev.Content != "" || len(ev.Logprobs) > 0):
		dst = e.AppendContentLogprobs(dst, ev.Content, ev.Logprobs)
	case ev.Content != "":
		dst = e.AppendContent(dst, ev.Content)
	}
	if len(ev.ToolCalls) > 0 {
		// The calls are already counted in the choice's state.
		dst = e.AppendToolCalls(dst, ev.ToolCalls, c.choices[i].toolCalls-len(ev.ToolCalls))
	}
	return dst
}
