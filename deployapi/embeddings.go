package deployapi

import (
	"context"
	"fmt"
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// handleEmbeddings serves POST /api/v1/embeddings. A batch is one request
// to the key's requests per minute, reserves its estimated tokens of the
// key's tokens per minute, and is charged the prompt tokens the runtime
// read. It runs in runtime calls of at most embedChunkTokens (embed), each
// holding the generation slot in turn. Whether the model can embed is the
// runtime's word (Ollama embeds with generative llama.cpp models although
// it lists no "embedding" capability for them, and refuses models of its
// new engine that have no pooling): its refusal is a 400 naming model.
func (a *API) handleEmbeddings(ctx *fasthttp.RequestCtx) {
	var req *openai.EmbeddingsRequest
	sl, ok := a.admit(ctx, func(s *served) (demand, *openai.Error) {
		r, e := openai.DecodeEmbeddingsRequest(ctx.PostBody(), s.model)
		if e == nil {
			e = a.checkEmbeddings(s.ctx, s, &r.Runtime)
		}
		if e != nil {
			return demand{}, e
		}
		req = r
		return demand{slots: 1, prompt: inputTokens(r.Runtime.Input)}, nil
	})
	if !ok {
		return
	}
	defer sl.release(a)
	emb, err := a.embed(sl, &req.Runtime)
	if err != nil {
		a.failed(ctx, sl, err)
		return
	}
	a.m.Tokens(metrics.RouteEmbeddings, sl.s.model, emb.PromptTokens, 0, 0)
	a.m.Embedded(sl.s.model, len(emb.Vectors))
	bp := a.bufs.Get().(*[]byte)
	defer a.bufs.Put(bp)
	*bp = openai.AppendEmbeddings((*bp)[:0], sl.s.model, emb.Vectors, req.Base64, emb.PromptTokens)
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

// embedChunkTokens bounds one runtime call of an embeddings batch, in
// estimated tokens (a longer single input is a call of its own): a batch
// lets other requests in between its calls, so they wait for at most one
// call, not the whole batch; and a runtime timeout bounds one call.
const embedChunkTokens = 2048

// maxEmbedTokens is the most tokens one embeddings request may ask for,
// estimated (estimateTokens), summed over its inputs: OpenAI's limit.
const maxEmbedTokens = 300_000

// embed embeds r's inputs in runtime calls of at most embedChunkTokens
// (at least one input each), giving the generation slot back between two
// calls and waiting its turn for it again (slot.yield): another key's
// request runs in between rather than after the whole batch. Each call's
// prompt tokens are charged as it ends, the runtime's count, or the
// estimate of a call that timed out or was given up on while the runtime
// read it: a batch cut short pays for what the runtime processed.
func (a *API) embed(sl *slot, r *llm.EmbedRequest) (*llm.Embeddings, error) {
	rt := sl.s.rt.(llm.Embedder)
	out := &llm.Embeddings{Vectors: make([][]float32, 0, len(r.Input))}
	for start := 0; start < len(r.Input); {
		if start > 0 {
			if err := sl.yield(a); err != nil {
				return nil, err
			}
		}
		end, est := start+1, estimateTokens(len(r.Input[start]))
		for ; end < len(r.Input); end++ {
			t := estimateTokens(len(r.Input[end]))
			if est+t > embedChunkTokens {
				break
			}
			est += t
		}
		part := llm.EmbedRequest{Input: r.Input[start:end], Dimensions: r.Dimensions}
		emb, err := rt.Embed(sl.gctx, &part)
		if err != nil {
			if readPrompt(err, sl.gctx) {
				sl.charge(est, 0)
			}
			return nil, err
		}
		sl.charge(emb.PromptTokens, 0)
		out.Vectors = append(out.Vectors, emb.Vectors...)
		out.PromptTokens += emb.PromptTokens
		start = end
	}
	return out, nil
}

// inputTokens is the estimated tokens of inputs.
func inputTokens(inputs []string) int {
	n := 0
	for _, in := range inputs {
		n += estimateTokens(len(in))
	}
	return n
}

// checkEmbeddings refuses, before the runtime sees it, a request to a
// runtime that cannot embed (400 naming model), one that asks for more
// than maxEmbedTokens (400 naming input), or with an input certainly
// longer than the context (400 context_length_exceeded naming it; the
// runtime would refuse it too, since inputs are never truncated).
func (a *API) checkEmbeddings(ctx context.Context, s *served, r *llm.EmbedRequest) *openai.Error {
	if _, ok := s.rt.(llm.Embedder); !ok {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: "model",
			Message: "This deployment's model runtime cannot create embeddings."}
	}
	if est := inputTokens(r.Input); est > maxEmbedTokens {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "max_tokens_per_request", Param: "input",
			Message: fmt.Sprintf("Requested about %d tokens (estimated at %d bytes a token), max %d tokens per request. Please send fewer or shorter inputs.",
				est, estBytesPerToken, maxEmbedTokens)}
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
