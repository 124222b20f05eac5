package deployapi

import (
	"context"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// handleEmbeddings serves POST /api/v1/embeddings. A batch is one request
// to every limit: one slot, one request of the key's per-minute requests,
// and its prompt tokens as usage. Whether the model can embed is the
// runtime's word (Ollama embeds with generative llama.cpp models although it
// lists no "embedding" capability for them, and refuses models of its new
// engine that have no pooling): its refusal is a 400 naming model.
func (a *API) handleEmbeddings(ctx *fasthttp.RequestCtx) {
	var req *openai.EmbeddingsRequest
	sl, ok := a.admit(ctx, func(s *served) (int, *openai.Error) {
		r, e := openai.DecodeEmbeddingsRequest(ctx.PostBody(), s.model)
		if e == nil {
			e = a.checkEmbeddings(s.ctx, s, &r.Runtime)
		}
		req = r
		return 1, e
	})
	if !ok {
		return
	}
	defer sl.release(a)
	emb, err := sl.s.rt.(llm.Embedder).Embed(sl.gctx, &req.Runtime)
	if err != nil {
		switch {
		case sl.s.ctx.Err() != nil:
			// Ended by a model switch's drain timeout or the hard stop.
			a.writeError(ctx, openai.Unavailable("The deployment switched its model; please retry."))
		case sl.gctx.Err() != nil:
			// The client left: nobody to answer.
		default:
			a.writeRuntimeError(ctx, err)
		}
		return
	}
	a.keys.RecordUsage(sl.key.ID, 1, int64(emb.PromptTokens), 0)
	a.m.Tokens(emb.PromptTokens, 0)
	bp := a.bufs.Get().(*[]byte)
	defer a.bufs.Put(bp)
	*bp = openai.AppendEmbeddings((*bp)[:0], sl.s.model, emb.Vectors, req.Base64, emb.PromptTokens)
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

// checkEmbeddings refuses, before the runtime sees it, a request to a
// runtime that cannot embed (400 naming model) or with an input certainly
// longer than the context (400 context_length_exceeded naming it; the
// runtime would refuse it too, since inputs are never truncated).
func (a *API) checkEmbeddings(ctx context.Context, s *served, r *llm.EmbedRequest) *openai.Error {
	if _, ok := s.rt.(llm.Embedder); !ok {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: "model",
			Message: "This deployment's model runtime cannot create embeddings."}
	}
	l := s.limits(ctx)
	if l.ContextLength <= 0 {
		return nil
	}
	for i, in := range r.Input {
		if est := len(in) / bytesPerToken; est > l.ContextLength {
			param := "input"
			if len(r.Input) > 1 {
				param = "input[" + strconv.Itoa(i) + "]"
			}
			return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "context_length_exceeded", Param: param,
				Message: fmt.Sprintf("This model's maximum context length is %d tokens, however you requested at least %d tokens (estimated) in %s. Please reduce your input.",
					l.ContextLength, est, param)}
		}
	}
	return nil
}
