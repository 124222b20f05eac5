package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/llm"
)

var (
	_ llm.Completer = (*Backend)(nil)
	_ llm.Embedder  = (*Backend)(nil)
)

// Complete implements llm.Completer through /api/generate: the prompt is
// sent raw (no template) when there is no suffix, since it is a text to
// continue; with a suffix the model's template places prompt and suffix
// (Ollama refuses a suffix for a model whose template has no place for it,
// a model without the "insert" capability). Otherwise it behaves as Chat.
func (b *Backend) Complete(ctx context.Context, req *llm.CompletionRequest) (llm.Stream, error) {
	stream := true
	body, err := json.Marshal(&api.GenerateRequest{
		Model:     b.cfg.Model,
		Prompt:    req.Prompt,
		Suffix:    req.Suffix,
		Raw:       req.Suffix == "",
		Stream:    &stream,
		KeepAlive: keepForever,
		Options:   options(&req.Options),
	})
	if err != nil {
		return nil, fmt.Errorf("ollama: encode generate request: %w", err)
	}
	return b.generation(ctx, b.genURL, body)
}

// embedRequest is api.EmbedRequest with dimensions, which current Ollama
// honours and the oldest supported version ignores (Embed checks what came
// back).
type embedRequest struct {
	api.EmbedRequest
	Dimensions int `json:"dimensions,omitempty"`
}

// maxEmbedAnswer bounds an /api/embed answer: 2048 vectors of 4096
// dimensions in JSON are about 100 MiB.
const maxEmbedAnswer = 256 << 20

// errEmbedTimeout is the cause of an embedding that took longer than
// Config.FirstByteTimeout.
var errEmbedTimeout = errors.New("embedding timed out")

// Embed implements llm.Embedder through /api/embed. An input longer than
// the context is refused rather than silently truncated (OpenAI refuses
// it too). The whole answer is bounded by Config.FirstByteTimeout, since
// it arrives at once.
func (b *Backend) Embed(ctx context.Context, req *llm.EmbedRequest) (*llm.Embeddings, error) {
	truncate := false
	body, err := json.Marshal(&embedRequest{
		EmbedRequest: api.EmbedRequest{Model: b.cfg.Model, Input: req.Input, KeepAlive: keepForever, Truncate: &truncate},
		Dimensions:   req.Dimensions,
	})
	if err != nil {
		return nil, fmt.Errorf("ollama: encode embed request: %w", err)
	}
	deadline := time.Now().Add(b.watch.restartWait())
	for sends := 0; ; sends++ {
		epoch, err := b.watch.waitUp(ctx, deadline)
		if err != nil {
			return nil, err
		}
		out, err := b.embed(ctx, req, body)
		if err == nil || sends == maxResends || ctx.Err() != nil || !b.watch.cut(err, epoch) {
			return out, err
		}
	}
}

// embed sends one embed request (Embed).
func (b *Backend) embed(ctx context.Context, req *llm.EmbedRequest, body []byte) (*llm.Embeddings, error) {
	if b.cfg.FirstByteTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, b.cfg.FirstByteTimeout, errEmbedTimeout)
		defer cancel()
	}
	defer b.watch.call(b)()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, b.embURL, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("ollama: build embed request: %w", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(hreq)
	if err != nil {
		return nil, b.embedError(ctx, err)
	}
	defer resp.Body.Close()
	b.watch.note()
	if resp.StatusCode != http.StatusOK {
		return nil, b.embedStatusError(resp)
	}
	var out api.EmbedResponse
	if err := json.NewDecoder(io.LimitReader(b.watch.body(resp.Body), maxEmbedAnswer)).Decode(&out); err != nil {
		if ctx.Err() != nil {
			return nil, b.embedError(ctx, err)
		}
		return nil, fmt.Errorf("%w: model runtime at %s sent a malformed embedding answer: %w", llm.ErrUnavailable, b.base, err)
	}
	if len(out.Embeddings) != len(req.Input) {
		return nil, fmt.Errorf("%w: model runtime at %s sent %d embeddings for %d inputs", llm.ErrUnavailable, b.base, len(out.Embeddings), len(req.Input))
	}
	if d := req.Dimensions; d > 0 {
		for _, v := range out.Embeddings {
			if len(v) != d {
				return nil, &llm.InvalidRequestError{Param: "dimensions", Msg: fmt.Sprintf(
					"This deployment's model runtime cannot give embeddings of %d dimensions (its vectors have %d); omit dimensions.", d, len(v))}
			}
		}
	}
	return &llm.Embeddings{Vectors: out.Embeddings, PromptTokens: out.PromptEvalCount}, nil
}

// embedError classifies a failed embed request.
func (b *Backend) embedError(ctx context.Context, err error) error {
	if context.Cause(ctx) == errEmbedTimeout {
		return fmt.Errorf("%w: model runtime at %s did not embed within %s", llm.ErrTimeout, b.base, b.cfg.FirstByteTimeout)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("ollama: embed: %w", ctx.Err())
	}
	return b.unreachable(err)
}

// embedStatusError is statusError for /api/embed: a model that cannot embed
// (Ollama's new engine answers 501 for a model without pooling) is a 400
// about the model, and any other refusal a 400 about the input.
func (b *Backend) embedStatusError(resp *http.Response) error {
	switch {
	case resp.StatusCode == http.StatusNotImplemented:
		return &llm.InvalidRequestError{Param: "model", Msg: "This deployment's model cannot create embeddings (its runtime says: " + clipMsg(errorMessage(resp)) + ")."}
	case resp.StatusCode == http.StatusBadRequest:
		msg := errorMessage(resp)
		if strings.Contains(msg, "does not support embeddings") {
			return &llm.InvalidRequestError{Param: "model", Msg: "This deployment's model cannot create embeddings (its runtime says: " + clipMsg(msg) + ")."}
		}
		return &llm.InvalidRequestError{Param: "input", Msg: msg}
	}
	return b.statusError(resp)
}

// clipMsg bounds a runtime's message quoted in an answer.
func clipMsg(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}
