package deployapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

func chatBody(content, extra string) string {
	return `{"model":"hearth-tiny","messages":[{"role":"user","content":"` + content + `"}]` + extra + `}`
}

// A prompt certainly longer than the model's context is refused before the
// runtime sees it, with OpenAI's context_length_exceeded.
func TestPromptOverTheContextIs400(t *testing.T) {
	ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: 100}}, nil)
	resp := ta.post(t, chatBody(strings.Repeat("a", 8*101), ""), nil)
	e := errorOf(t, resp)
	if resp.StatusCode != 400 || e["code"] != "context_length_exceeded" || e["param"] != "messages" {
		t.Fatalf("%d %v", resp.StatusCode, e)
	}
	if ta.rt.LastRequest() != nil {
		t.Fatal("the runtime was called")
	}
	if resp := ta.post(t, chatBody(strings.Repeat("a", 8*99), ""), nil); resp.StatusCode != 200 {
		t.Fatalf("a prompt within the context: %d", resp.StatusCode)
	}
}

// max_tokens above the deployment's cap is a 400 naming max_tokens; a
// request naming none is capped, unless the model's own num_predict is
// lower.
func TestOutputCap(t *testing.T) {
	for name, c := range map[string]struct {
		lim     llm.Limits
		cfgCap  int
		extra   string
		status  int
		sentMax int // the max_tokens the runtime got; 0: none
	}{
		"huge max_tokens":                      {llm.Limits{ContextLength: 2048}, 0, `,"max_tokens":2147483647`, 400, 0},
		"huge completion tokens":               {llm.Limits{ContextLength: 2048}, 0, `,"max_completion_tokens":4096`, 400, 0},
		"within the context":                   {llm.Limits{ContextLength: 2048}, 0, `,"max_tokens":2048`, 200, 2048},
		"over the configured cap":              {llm.Limits{ContextLength: 2048}, 50, `,"max_tokens":51`, 400, 0},
		"none: the cap":                        {llm.Limits{ContextLength: 2048}, 0, ``, 200, 2048},
		"none: a lower num_predict stays":      {llm.Limits{ContextLength: 2048, NumPredict: 64}, 0, ``, 200, 0},
		"none: a higher num_predict is capped": {llm.Limits{ContextLength: 2048, NumPredict: 40960}, 0, ``, 200, 2048},
		"unknown limits":                       {llm.Limits{}, 0, `,"max_tokens":2147483647`, 200, 2147483647},
	} {
		t.Run(name, func(t *testing.T) {
			ta := startAPI(t, fake.Config{Limits: c.lim}, func(cfg *APIConfig) { cfg.MaxOutputTokens = c.cfgCap })
			resp := ta.post(t, chatBody("hi", c.extra), nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if c.status == 400 {
				if e := errorOf(t, resp); e["param"] != "max_tokens" {
					t.Fatalf("error %v", e)
				}
				return
			}
			got := ta.rt.LastRequest().Options.MaxTokens
			if (c.sentMax == 0) != (got == nil) || got != nil && *got != c.sentMax {
				t.Fatalf("runtime got max_tokens %v, want %d", got, c.sentMax)
			}
		})
	}
}

// Without --max-body-bytes the body limit follows the context length: 32
// bytes per token, at least 1 MiB.
func TestBodyLimitFollowsTheContext(t *testing.T) {
	body := chatBody(strings.Repeat("a", 5<<20), "")
	for name, c := range map[string]struct {
		ctx    int
		status int
	}{
		"small context: the 1 MiB floor": {2048, 413},
		"large context":                  {256 << 10, 400}, // read, then too long for the context
	} {
		t.Run(name, func(t *testing.T) {
			ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: c.ctx}}, func(cfg *APIConfig) { cfg.MaxBodyBytes = 0 })
			ta.post(t, chatBody("hi", ""), nil).Body.Close() // the limits are known from here on
			resp := ta.post(t, body, map[string]string{"Content-Type": "application/json"})
			resp.Body.Close()
			if resp.StatusCode != c.status {
				t.Fatalf("5 MiB body: %d, want %d", resp.StatusCode, c.status)
			}
		})
	}
}

// abandoned is a runtime error whose runtime goes on working until done
// is closed.
type abandoned struct{ done chan struct{} }

func (abandoned) Error() string                  { return "model runtime timed out" }
func (abandoned) Unwrap() error                  { return llm.ErrTimeout }
func (a abandoned) RuntimeDone() <-chan struct{} { return a.done }

// A request the runtime goes on with after hearthd gave up (504) keeps its
// slot until the runtime is done: meanwhile a new request finds every
// slot taken.
func TestAbandonedRequestKeepsItsSlot(t *testing.T) {
	ab := abandoned{done: make(chan struct{})}
	ta := startAPI(t, fake.Config{ChatErr: ab}, func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 1, 0 })
	if resp := ta.post(t, chatBody("hi", ""), nil); resp.StatusCode != 504 {
		t.Fatalf("first: %d, want 504", resp.StatusCode)
	}
	ta.rt.SetConfig(fake.Config{})
	if resp := ta.post(t, chatBody("hi", ""), nil); resp.StatusCode != 429 {
		t.Fatalf("while the runtime still works: %d, want 429", resp.StatusCode)
	}
	close(ab.done)
	testutil.WaitFor(t, 10*time.Second, "the slot to be freed", func() bool {
		resp := ta.post(t, chatBody("hi", ""), nil)
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// logprobs are relayed where the runtime gives them, streamed and not, and
// refused with a 400 naming logprobs where it cannot.
func TestLogprobs(t *testing.T) {
	t.Run("runtime without", func(t *testing.T) {
		ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 2}, nil)
		resp := ta.post(t, chatBody("hi", `,"logprobs":true`), nil)
		if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "logprobs" {
			t.Fatalf("%d %v", resp.StatusCode, e)
		}
		if ta.rt.LastRequest() != nil {
			t.Fatal("the runtime was called")
		}
	})
	ta := startAPI(t, fake.Config{Tokens: []string{"a", "b"}, TokenCount: 2, Logprobs: true}, nil)
	// Whether the runtime answers logprobs is asked once a request wants
	// them, not before: the question may cost the runtime a generation.
	plain := ta.post(t, chatBody("hi", ""), nil)
	plain.Body.Close()
	if plain.StatusCode != 200 {
		t.Fatalf("plain request: %d", plain.StatusCode)
	}
	if n := ta.rt.LogprobsAsked(); n != 0 {
		t.Fatalf("a request without logprobs asked the runtime about them %d times", n)
	}
	resp := ta.post(t, chatBody("hi", `,"logprobs":true,"top_logprobs":2`), nil)
	m := decodeJSON(t, resp.Body)
	content := m["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["content"].([]any)
	if len(content) != 2 || content[0].(map[string]any)["token"] != "a" || content[1].(map[string]any)["logprob"] != -1.0 {
		t.Fatalf("logprobs %v", content)
	}
	if o := ta.rt.LastRequest().Options; !o.Logprobs || o.TopLogprobs != 2 {
		t.Fatalf("runtime options %+v", o)
	}
	resp = ta.post(t, chatBody("hi", `,"stream":true,"logprobs":true`), nil)
	var tokens []string
	for _, ev := range readSSE(t, resp.Body) {
		if ev.data == "[DONE]" {
			continue
		}
		ch := chunkOf(t, ev)["choices"].([]any)
		if len(ch) == 0 {
			continue
		}
		if lp, ok := ch[0].(map[string]any)["logprobs"].(map[string]any); ok {
			for _, c := range lp["content"].([]any) {
				tokens = append(tokens, c.(map[string]any)["token"].(string))
			}
		}
	}
	if strings.Join(tokens, "") != "ab" {
		t.Fatalf("streamed logprob tokens %q", tokens)
	}
	if n := ta.rt.LogprobsAsked(); n != 1 {
		t.Fatalf("the runtime was asked about logprobs %d times, want once", n)
	}
}

// A runtime that cannot be asked whether it answers logprobs is not judged
// by it: the request gets 503 with Retry-After, reaches no generation, and
// the next one asks again.
func TestLogprobsUnknown(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 1, LogprobsErr: llm.ErrUnavailable}, nil)
	for i := 1; i <= 2; i++ {
		resp := ta.post(t, chatBody("hi", `,"logprobs":true`), nil)
		if e := errorOf(t, resp); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || e["type"] != "server_error" {
			t.Fatalf("%d %v", resp.StatusCode, e)
		}
		if ta.rt.LastRequest() != nil {
			t.Fatal("the runtime was called")
		}
		if n := ta.rt.LogprobsAsked(); n != i {
			t.Fatalf("asked %d times after %d requests", n, i)
		}
	}
}

// What the runtime says the model can do is on /models, and a request that
// needs a capability the model lacks is a 400 naming the parameter before
// the runtime sees it; a runtime that lists nothing is not second-guessed.
func TestCapabilities(t *testing.T) {
	tools := `,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`
	ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: 2048, Capabilities: []string{"completion"}}}, nil)
	resp := ta.post(t, chatBody("hi", tools), nil)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "tools" || e["code"] != "unsupported_parameter" {
		t.Fatalf("tools to a model without them: %d %v", resp.StatusCode, e)
	}
	if ta.rt.LastRequest() != nil {
		t.Fatal("the runtime was called")
	}
	var m struct {
		ID            string   `json:"id"`
		ContextLength int      `json:"context_length"`
		Capabilities  []string `json:"capabilities"`
	}
	ta.getJSON(t, "/models/hearth-tiny", &m)
	if m.ID != "hearth-tiny" || m.ContextLength != 2048 || len(m.Capabilities) != 1 || m.Capabilities[0] != "completion" {
		t.Fatalf("model %+v", m)
	}

	for _, caps := range [][]string{{"completion", "tools"}, nil} {
		ta := startAPI(t, fake.Config{Limits: llm.Limits{Capabilities: caps}}, nil)
		if resp := ta.post(t, chatBody("hi", tools), nil); resp.StatusCode != 200 {
			t.Fatalf("tools with capabilities %q: %d", caps, resp.StatusCode)
		}
	}
}

// getJSON GETs path below the API with the key and decodes the answer.
func (ta *testAPI) getJSON(t *testing.T, path string, v any) {
	t.Helper()
	req, _ := http.NewRequest("GET", ta.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatal(err)
	}
}
