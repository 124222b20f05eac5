package deployapi

import (
	"bufio"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// handleResponses serves POST /api/v1/responses, the OpenAI Responses API,
// on the path chat completions take (keys, limits, admission, metrics,
// disconnect cancellation). Nothing is stored: a request carries its
// whole conversation.
func (a *API) handleResponses(ctx *fasthttp.RequestCtx) {
	c, req, ok := startGeneration(a, ctx, openai.DecodeResponsesRequest, responsesParts, &responsesLimitParams)
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
	conn := ctx.Conn()
	setSSEHeaders(ctx)
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer c.done()
		c.relay(w, conn, responseSink{enc})
	})
}

// responsesParts is what the shared generation path needs of a request.
func responsesParts(r *openai.ResponsesRequest) (*llm.Request, bool) { return &r.Runtime, r.Stream }

// respondResponse collects the whole generation and answers it as one
// response object.
func (c *completion) respondResponse(ctx *fasthttp.RequestCtx, enc *openai.ResponseEncoder) {
	last, err := c.collect(func(ev *llm.Event) { responseSink{enc}.event(nil, ev) })
	if err != nil {
		c.api.writeRuntimeError(ctx, err)
		return
	}
	enc.Finish(nil, incompleteReason(c.finish), c.usage(last))
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

func (k responseSink) event(dst []byte, ev *llm.Event) []byte {
	if ev.Reasoning != "" {
		dst = k.enc.Reasoning(dst, ev.Reasoning)
	}
	if ev.Content != "" {
		dst = k.enc.Text(dst, ev.Content)
	}
	if len(ev.ToolCalls) > 0 {
		dst = k.enc.ToolCalls(dst, ev.ToolCalls)
	}
	return dst
}

func (k responseSink) finish(dst []byte, c *completion, last *llm.Event) []byte {
	return k.enc.Finish(dst, incompleteReason(c.finish), c.usage(*last))
}

func (k responseSink) fail(dst []byte, e *openai.Error) []byte { return k.enc.Fail(dst, e) }
