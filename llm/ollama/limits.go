package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/llm"
)

// Limits implements llm.Limited from /api/show: the context is the model's
// num_ctx parameter if its Modelfile sets one (the context Ollama runs it
// with), else the length it was trained for (model_info's
// <architecture>.context_length); NumPredict is its num_predict parameter.
func (b *Backend) Limits(ctx context.Context) (llm.Limits, error) {
	resp, err := b.api.Show(ctx, &api.ShowRequest{Model: b.cfg.Model})
	if err != nil {
		return llm.Limits{}, b.apiError("show model "+b.cfg.Model, err)
	}
	return limitsOf(resp), nil
}

// AnswersLogprobs implements llm.LogprobsAnswerer: it asks the runtime for
// one token with its log probability; older Ollama ignores the request,
// current Ollama answers it. Asking rather than going by the version keeps
// this right for builds and versions not known here.
func (b *Backend) AnswersLogprobs(ctx context.Context) (bool, error) {
	if b.embeddingOnly(ctx) {
		return false, nil // no generation to ask logprobs of
	}
	stream := false
	body, err := json.Marshal(&chatRequest{
		ChatRequest: api.ChatRequest{Model: b.cfg.Model, Stream: &stream, KeepAlive: keepForever,
			Messages: []api.Message{{Role: "user", Content: "hi"}}, Options: map[string]any{"num_predict": 1}},
		Logprobs: true, TopLogprobs: 1,
	})
	if err != nil {
		return false, fmt.Errorf("ollama: encode the logprobs probe: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.chatURL, bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("ollama: logprobs probe: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.hc.Do(req)
	if err != nil {
		return false, b.unreachable(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, b.statusError(resp)
	}
	var answer struct {
		Logprobs []json.RawMessage `json:"logprobs"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&answer); err != nil {
		return false, fmt.Errorf("%w: model runtime at %s: logprobs probe: %w", llm.ErrUnavailable, b.base, err)
	}
	return len(answer.Logprobs) > 0, nil
}

func limitsOf(resp *api.ShowResponse) llm.Limits {
	var l llm.Limits
	if len(resp.Capabilities) > 0 {
		l.Capabilities = make([]string, len(resp.Capabilities))
		for i, c := range resp.Capabilities {
			l.Capabilities[i] = string(c)
		}
	}
	for line := range strings.Lines(resp.Parameters) {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil || n <= 0 {
			continue
		}
		switch f[0] {
		case "num_ctx":
			l.ContextLength = n
		case "num_predict":
			l.NumPredict = n
		}
	}
	if l.ContextLength == 0 {
		arch, _ := resp.ModelInfo["general.architecture"].(string)
		if v, ok := resp.ModelInfo[arch+".context_length"].(float64); ok && v > 0 {
			l.ContextLength = int(v)
		}
	}
	return l
}
