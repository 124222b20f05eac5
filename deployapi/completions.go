package deployapi

import (
	"bufio"
	"context"
	"errors"
	"io"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// handleCompletions serves POST /api/v1/completions, OpenAI's legacy
// completions: one prompt continued as it is. Admission, usage, metrics
// (counted with chat completions) and the relay's rules are chat's.
func (a *API) handleCompletions(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	var req *openai.CompletionRequest
	sl, ok := a.admit(ctx, func(s *served) (e *openai.Error) {
		if req, e = openai.DecodeCompletionRequest(ctx.PostBody(), s.model); e != nil {
			return e
		}
		return a.checkCompletion(s.ctx, s, &req.Runtime)
	})
	if !ok {
		return
	}
	a.serveCompletion(ctx, sl, start, req.Stream, req.IncludeUsage, &req.Runtime)
}

// serveCompletion runs one prompt's generation on an admitted slot and
// answers it, as one JSON object or as server-sent events. It frees the
// slot when the generation ends.
func (a *API) serveCompletion(ctx *fasthttp.RequestCtx, sl *slot, start time.Time, sse, includeUsage bool, r *llm.CompletionRequest) {
	stream, err := sl.s.rt.(llm.Completer).Complete(sl.gctx, r)
	if err != nil {
		clientGone := sl.gctx.Err() != nil
		var ab llm.Abandoned
		if errors.As(err, &ab) {
			// The runtime still reads the prompt: the slot stays taken
			// until it is done, as for chat.
			sl.finish()
			go func() { <-ab.RuntimeDone(); a.lim.release(sl.key.ID) }()
		} else {
			sl.release(a)
		}
		if clientGone && !errors.Is(err, llm.ErrTimeout) {
			a.m.ChatCompletion(metrics.FinishCancelled, sse)
			return
		}
		a.m.ChatCompletion(metrics.FinishError, sse)
		a.writeRuntimeError(ctx, err)
		return
	}

	a.m.StreamStarted()
	c := &completion{
		api:     a,
		served:  sl.s,
		id:      openai.NewTextCompletionID(),
		created: start.Unix(),
		start:   start,
		stream:  stream,
		gctx:    sl.gctx,
		keyID:   sl.key.ID,
		isSSE:   sse,
	}
	done := func() {
		c.observe()
		a.m.StreamEnded()
		sl.release(a)
	}
	if !sse {
		defer done()
		c.respondText(ctx)
		return
	}
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	conn := ctx.Conn()
	enc := openai.NewTextChunkEncoder(c.id, c.created, sl.s.model, sl.s.fingerprint, includeUsage)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer done()
		c.streamText(w, conn, enc, includeUsage)
	})
}

// checkCompletion refuses what the model cannot take, before the runtime
// sees it: a model that does not generate (an embedding model; 400 naming
// model), a suffix for a model without the "insert" capability (400
// naming suffix), and what checkLimits refuses for chat (a prompt
// certainly longer than the context, max_tokens above the output cap). A
// request without max_tokens gets OpenAI's default of 16, capped.
func (a *API) checkCompletion(ctx context.Context, s *served, r *llm.CompletionRequest) *openai.Error {
	if _, ok := s.rt.(llm.Completer); !ok {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: "model",
			Message: "This deployment's model runtime cannot continue a raw prompt; use /chat/completions."}
	}
	l := s.limits(ctx)
	if !l.Can("completion") {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: "model",
			Message: "This deployment's model does not generate text (its runtime lists no \"completion\" capability); it serves /embeddings."}
	}
	if r.Suffix != "" && !l.Can("insert") {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: "suffix",
			Message: "This deployment's model cannot fill in the middle (its runtime lists no \"insert\" capability); omit suffix."}
	}
	if r.Options.MaxTokens == nil {
		// OpenAI's default for legacy completions, never above the cap.
		n := openai.DefaultCompletionMaxTokens
		if limit := a.cfg.MaxOutputTokens; limit > 0 && limit < n {
			n = limit
		} else if limit <= 0 && l.ContextLength > 0 && l.ContextLength < n {
			n = l.ContextLength
		}
		r.Options.MaxTokens = &n
	}
	chat := llm.Request{Messages: []llm.Message{{Role: "user", Content: r.Prompt + r.Suffix}}, Options: r.Options}
	e := a.checkLimits(ctx, s, &chat)
	if e != nil && e.Param == "messages" {
		e.Param = "prompt"
		e.Message = strings.ReplaceAll(e.Message, "messages", "prompt")
	}
	r.Options = chat.Options
	return e
}

// respondText collects the whole generation and answers one
// text_completion object.
func (c *completion) respondText(ctx *fasthttp.RequestCtx) {
	defer c.stream.Close()
	var text strings.Builder
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
		if ev.Content != "" {
			c.token(time.Now())
			text.WriteString(ev.Content)
		}
		if ev.Done {
			last = ev
			break
		}
	}
	c.end(last, false)
	bp := c.api.bufs.Get().(*[]byte)
	defer c.api.bufs.Put(bp)
	*bp = openai.AppendTextCompletion((*bp)[:0], c.id, c.created, c.served.model, c.served.fingerprint, text.String(), c.finish, c.usage(last))
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

// streamText relays the generation as server-sent events with streamTo's
// rules: a chunk per piece of text, flushed as soon as nothing more is
// ready, each write bounded by the write-stall timeout, and a failure
// after the start reported as an error event before [DONE].
func (c *completion) streamText(w flusher, conn interface{ SetWriteDeadline(time.Time) error }, enc *openai.TextChunkEncoder, includeUsage bool) {
	defer c.stream.Close()
	stall := c.api.cfg.WriteStallTimeout
	var deadline time.Time
	defer conn.SetWriteDeadline(time.Time{})
	buffered, _ := c.stream.(llm.Buffered)
	bp := c.api.bufs.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() { *bp = buf[:0]; c.api.bufs.Put(bp) }()
	var now time.Time
	send := func() bool {
		if deadline.Sub(now) < stall*3/4 {
			deadline = now.Add(stall)
			_ = conn.SetWriteDeadline(deadline)
		}
		if _, err := w.Write(buf); err != nil {
			return false
		}
		buf = buf[:0]
		return w.Flush() == nil
	}
	// The headers go out at once, as chat's role chunk does: the client
	// knows it was admitted before the first token.
	if now = time.Now(); !send() {
		return
	}
	for {
		ev, err := c.stream.Recv()
		now = time.Now()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if c.gctx.Err() == nil {
				c.api.log.Warn("completion failed mid-stream", "err", err)
			}
			buf = enc.AppendError(buf, openai.RuntimeError(err))
			buf = enc.AppendDone(buf)
			send()
			return
		}
		if ev.Content != "" {
			buf = enc.AppendText(buf, ev.Content)
			c.token(now)
		}
		if ev.Done {
			c.end(ev, false)
			buf = enc.AppendFinish(buf, c.finish)
			if includeUsage {
				buf = enc.AppendUsage(buf, c.usage(ev))
			}
			buf = enc.AppendDone(buf)
			send()
			return
		}
		if buffered != nil && buffered.Buffered() && len(buf) < 32<<10 {
			continue
		}
		if len(buf) > 0 && !send() {
			return
		}
	}
}
