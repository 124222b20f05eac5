package deployapi

import (
	"io"
	"testing"

	"github.com/hearthd/hearth/llm/fake"
)

// histogramCount is the sample count of the histogram name's series with
// the labels in want.
func histogramCount(t *testing.T, ta *testAPI, name string, want map[string]string) uint64 {
	t.Helper()
	return findMetric(t, ta, name, want).GetHistogram().GetSampleCount()
}

// Each route counts under its own label, with the model it served: a
// Responses or legacy completions request is not a chat completion, and
// embeddings count their inputs and tokens.
func TestMetricsByRoute(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a", "b"}, PromptTokens: 5, EmbedDims: 3}, nil)
	do := func(path, body string) {
		t.Helper()
		r := ta.postTo(t, path, body, nil)
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Fatalf("%s: %d", path, r.StatusCode)
		}
	}
	do("/chat/completions", `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`)
	do("/responses", `{"model":"hearth-tiny","input":"hi","stream":true}`)
	do("/responses", `{"model":"hearth-tiny","input":"hi"}`)
	do("/completions", `{"model":"hearth-tiny","prompt":"hi"}`)
	do("/embeddings", `{"model":"hearth-tiny","input":["one","two","three"]}`)
	if c := ta.get(t, "/api/v1/models"); c != 401 {
		t.Fatalf("models without a key: %d", c)
	}

	gen := func(route, stream string) float64 {
		return counterValue(t, ta, "hearth_generations_total",
			map[string]string{"route": route, "model": testModel, "finish_reason": "stop", "stream": stream})
	}
	if c, rs, r, co := gen("chat", "false"), gen("responses", "true"), gen("responses", "false"), gen("completions", "false"); c != 1 || rs != 1 || r != 1 || co != 1 {
		t.Errorf("generations: chat %v, responses streamed %v and not %v, completions %v; want 1 each", c, rs, r, co)
	}
	for route, want := range map[string]uint64{"chat": 1, "responses": 2, "completions": 1, "embeddings": 1, "models": 1} {
		if got := histogramCount(t, ta, "hearth_request_duration_seconds", map[string]string{"route": route, "model": testModel}); got != want {
			t.Errorf("%s request durations: %d, want %d", route, got, want)
		}
	}
	for route, want := range map[string]uint64{"chat": 1, "responses": 2, "completions": 1} {
		if got := histogramCount(t, ta, "hearth_time_to_first_token_seconds", map[string]string{"route": route}); got != want {
			t.Errorf("%s TTFT: %d, want %d", route, got, want)
		}
	}
	if got := counterValue(t, ta, "hearth_embeddings_total", map[string]string{"model": testModel}); got != 3 {
		t.Errorf("embeddings: %v, want 3", got)
	}
	tokens := func(route, kind string) float64 {
		return counterValue(t, ta, "hearth_tokens_total", map[string]string{"route": route, "model": testModel, "kind": kind})
	}
	if p, c := tokens("responses", "prompt"), tokens("responses", "completion"); p != 10 || c != 4 {
		t.Errorf("responses tokens: prompt %v completion %v, want 10 and 4", p, c)
	}
	if p := tokens("embeddings", "prompt"); p <= 0 {
		t.Errorf("embeddings tokens: %v", p)
	}
	if got := counterValue(t, ta, "hearth_http_requests_total", map[string]string{"route": "responses", "code": "200"}); got != 2 {
		t.Errorf("responses requests: %v", got)
	}
}
