package deployapi

import (
	"context"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// handleCompletions serves POST /api/v1/completions, OpenAI's legacy
// completions: each prompt continued as it is, n times. Admission (a slot
// per completion), usage, metrics (counted with chat completions), the
// choices and the relay are chat's.
func (a *API) handleCompletions(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	var req *openai.CompletionRequest
	sl, ok := a.admit(ctx, func(s *served) (demand, *openai.Error) {
		r, e := openai.DecodeCompletionRequest(ctx.PostBody(), s.model)
		if e == nil {
			e = a.checkCompletion(s.ctx, s, r)
		}
		if e != nil {
			return demand{}, e
		}
		req = r
		return completionDemand(s, r), nil
	})
	if !ok {
		return
	}
	c, ok := a.startCompletion(ctx, metrics.RouteCompletions, sl, start, req.Stream, func(gctx context.Context, i int) (llm.Stream, error) {
		// Choice i continues prompt i/n, as OpenAI orders them.
		r := req.Runtime
		r.Prompt = req.Prompts[i/req.N]
		r.Options = choiceOptions(r.Options, i%req.N)
		return sl.s.rt.(llm.Completer).Complete(gctx, &r)
	})
	if !ok {
		return
	}
	c.id = openai.NewTextCompletionID()
	if !req.Stream {
		defer c.done()
		c.respondText(ctx)
		return
	}
	enc := openai.NewTextChunkEncoder(c.id, c.created, c.served.model, c.served.fingerprint, req.IncludeUsage)
	c.streamSSE(ctx, newTextSink(enc, len(c.choices), req.IncludeUsage))
}

// checkCompletion refuses what the model cannot take, before the runtime
// sees it: a model that does not generate (an embedding model; 400 naming
// model), a suffix for a model without the "insert" capability (400
// naming suffix), and what checkLimits refuses for chat (a prompt
// certainly longer than the context, max_tokens above the output cap). A
// request without max_tokens gets OpenAI's default of 16, capped.
func (a *API) checkCompletion(ctx context.Context, s *served, req *openai.CompletionRequest) *openai.Error {
	r := &req.Runtime
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
	// The longest prompt decides whether every prompt fits.
	longest := ""
	for _, p := range req.Prompts {
		if len(p) > len(longest) {
			longest = p
		}
	}
	chat := llm.Request{Messages: []llm.Message{{Role: "user", Content: longest + r.Suffix}}, Options: r.Options}
	e := a.checkLimits(ctx, s, &chat, &chatLimitParams)
	if e != nil && e.Param == "messages" {
		e.Param = "prompt"
		e.Message = strings.ReplaceAll(e.Message, "messages", "prompt")
	}
	r.Options = chat.Options
	return e
}

// completionDemand is what a legacy completion takes: a generation per
// prompt and choice, each reading its prompt (estimated as their
// average) and writing at most max_tokens (checkCompletion set it).
func completionDemand(s *served, r *openai.CompletionRequest) demand {
	bytes := 0
	for _, p := range r.Prompts {
		bytes += len(p) + len(r.Runtime.Suffix)
	}
	return demand{slots: len(r.Prompts) * r.N, prompt: estimateTokens(bytes / max(1, len(r.Prompts))),
		output: maxOutput(s.knownLimits(), &r.Runtime.Options)}
}

// respondText collects the whole generation and answers one
// text_completion object.
func (c *completion) respondText(ctx *fasthttp.RequestCtx) {
	texts := make([]strings.Builder, len(c.choices))
	err := c.collect(func(i int, ev *llm.Event) { texts[i].WriteString(ev.Content) })
	if err != nil {
		c.api.failed(ctx, c.sl, err)
		return
	}
	choices := make([]openai.TextChoice, len(c.choices))
	for i := range choices {
		choices[i] = openai.TextChoice{Text: texts[i].String(), Finish: c.choices[i].finish}
	}
	bp := c.api.bufs.Get().(*[]byte)
	defer c.api.bufs.Put(bp)
	*bp = openai.AppendTextCompletionChoices((*bp)[:0], c.id, c.created, c.served.model, c.served.fingerprint, choices, c.usage())
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

// textSink encodes a streamed legacy completion as text_completion chunks:
// a chunk per piece of text, a chunk with each choice's finish reason,
// then usage (when asked for) and [DONE]. Nothing opens the stream: the
// headers go out at once all the same, so the client knows it was
// admitted before the first token.
type textSink struct {
	choiceSink[*openai.TextChunkEncoder]
}

func newTextSink(enc *openai.TextChunkEncoder, n int, includeUsage bool) *textSink {
	k := &textSink{}
	k.init(enc, n, includeUsage)
	return k
}

func (k *textSink) begin(dst []byte) []byte { return dst }

func (k *textSink) event(dst []byte, _ *completion, i int, ev *llm.Event) []byte {
	if ev.Content != "" {
		dst = k.encs[i].AppendText(dst, ev.Content)
	}
	return dst
}
