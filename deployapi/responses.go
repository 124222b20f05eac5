package deployapi

import (
	"context"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// handleResponses serves POST /api/v1/responses, the OpenAI Responses API,
// on the path chat completions take (keys, limits, admission, metrics,
// disconnect cancellation). Nothing is stored: a request carries its
// whole conversation.
func (a *API) handleResponses(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	var req *openai.ResponsesRequest
	sl, ok := a.admit(ctx, func(s *served) (demand, *openai.Error) {
		r, e := openai.DecodeResponsesRequest(ctx.PostBody(), s.model, a.cfg.Sealer)
		if e == nil && r.Truncate {
			fitContext(s.limits(s.ctx), &r.Runtime)
		}
		if e == nil {
			e = a.checkLimits(s.ctx, s, &r.Runtime, &responsesLimitParams)
		}
		if e != nil {
			return demand{}, e
		}
		req = r
		return generationDemand(s, &r.Runtime, 1, schemaParam(&r.Runtime, "text.format")), nil
	})
	if !ok {
		return
	}
	c, ok := a.startCompletion(ctx, metrics.RouteResponses, sl, start, req.Stream, func(gctx context.Context, _ int) (llm.Stream, error) {
		return a.startGeneration(gctx, sl.s, &req.Runtime)
	})
	if !ok {
		return
	}
	c.id = openai.NewResponseID()
	enc := openai.NewResponseEncoder(req, c.id, c.created, req.Stream)
	if !req.Stream {
		defer c.done()
		c.respondResponse(ctx, enc)
		return
	}
	c.streamSSE(ctx, responseSink{enc})
}

// respondResponse collects the whole generation and answers it as one
// response object.
func (c *completion) respondResponse(ctx *fasthttp.RequestCtx, enc *openai.ResponseEncoder) {
	err := c.collect(func(i int, ev *llm.Event) { responseSink{enc}.event(nil, c, i, ev) })
	if err != nil {
		c.api.failed(ctx, c.sl, err)
		return
	}
	enc.Finish(nil, incompleteReason(c.choices[0].finish), c.usage())
	bp := c.api.bufs.Get().(*[]byte)
	defer c.api.bufs.Put(bp)
	*bp = enc.AppendResponse((*bp)[:0])
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

// incompleteReason is incomplete_details.reason for a finish reason: a
// response cut by its token limit is incomplete, any other ending complete.
func incompleteReason(finish string) string {
	if finish == llm.FinishLength {
		return "max_output_tokens"
	}
	return ""
}

// responseSink encodes a streamed response as the Responses API's typed
// events.
type responseSink struct{ enc *openai.ResponseEncoder }

func (k responseSink) begin(dst []byte) []byte { return k.enc.Begin(dst) }

func (k responseSink) event(dst []byte, _ *completion, _ int, ev *llm.Event) []byte {
	if ev.Reasoning != "" {
		dst = k.enc.Reasoning(dst, ev.Reasoning)
	}
	if ev.Content != "" || len(ev.Logprobs) > 0 {
		dst = k.enc.TextLogprobs(dst, ev.Content, ev.Logprobs)
	}
	if len(ev.ToolCalls) > 0 {
		dst = k.enc.ToolCalls(dst, ev.ToolCalls)
	}
	return dst
}

// choiceEnd appends nothing: a response has one choice, which finish ends.
func (k responseSink) choiceEnd(dst []byte, _ *completion, _ int) []byte { return dst }

func (k responseSink) finish(dst []byte, c *completion) []byte {
	return k.enc.Finish(dst, incompleteReason(c.choices[0].finish), c.usage())
}

func (k responseSink) fail(dst []byte, e *openai.Error) []byte { return k.enc.Fail(dst, e) }
