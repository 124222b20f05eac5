package deployapi

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

// postBody sends body to route (below /api/v1) with the test key.
func (ta *testAPI) postBody(t *testing.T, route, body string) *http.Response {
	t.Helper()
	return ta.postToAs(t, route, ta.secret, body)
}

func (ta *testAPI) postToAs(t *testing.T, route, secret, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", ta.url+route, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func TestEmbeddings(t *testing.T) {
	ta := startAPI(t, fake.Config{EmbedDims: 3}, nil)
	resp := ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":["hello world","abc"],"user":"u"}`)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %v", resp.StatusCode, m)
	}
	want := map[string]any{
		"object": "list",
		"model":  "hearth-tiny",
		"data": []any{
			map[string]any{"object": "embedding", "index": 0.0, "embedding": []any{11.0, 0.0, 0.5}},
			map[string]any{"object": "embedding", "index": 1.0, "embedding": []any{3.0, 1.0, 0.5}},
		},
		"usage": map[string]any{"prompt_tokens": 3.0, "total_tokens": 3.0},
	}
	if fmt.Sprint(m) != fmt.Sprint(want) {
		t.Fatalf("got  %v\nwant %v", m, want)
	}
	if got := ta.rt.LastEmbed(); fmt.Sprint(got.Input) != "[hello world abc]" || got.Dimensions != 0 {
		t.Fatalf("runtime got %+v", got)
	}
	if u := ta.keys.Usage(ta.keyID); u != (apikeys.Usage{Requests: 1, PromptTokens: 3}) {
		t.Fatalf("usage %+v", u)
	}

	// base64: little-endian float32, and dimensions reach the runtime.
	resp = ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":"abcd","encoding_format":"base64","dimensions":2}`)
	m = decodeJSON(t, resp.Body)
	resp.Body.Close()
	b64, _ := m["data"].([]any)[0].(map[string]any)["embedding"].(string)
	raw, err := base64.StdEncoding.DecodeString(b64)
	if resp.StatusCode != 200 || err != nil || len(raw) != 8 {
		t.Fatalf("base64: %d %v %v", resp.StatusCode, m, err)
	}
	if a, b := math.Float32frombits(binary.LittleEndian.Uint32(raw)), math.Float32frombits(binary.LittleEndian.Uint32(raw[4:])); a != 4 || b != 0 {
		t.Fatalf("base64 decodes to %v, %v", a, b)
	}
	// More dimensions than the runtime gives: its refusal names dimensions.
	resp = ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":"abcd","dimensions":9}`)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "dimensions" {
		t.Fatalf("dimensions: %d %v", resp.StatusCode, e)
	}
}

// Refused requests never reach the runtime, and each 400 names the
// parameter at fault.
func TestEmbeddingsBadInput(t *testing.T) {
	ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: 16}}, nil)
	for _, c := range []struct {
		body   string
		status int
		param  any
	}{
		{`{"model":"hearth-tiny","input":""}`, 400, "input"},
		{`{"model":"hearth-tiny","input":[]}`, 400, "input"},
		{`{"model":"hearth-tiny","input":["a",""]}`, 400, "input[1]"},
		{`{"model":"hearth-tiny","input":[1,2]}`, 400, "input"},
		{`{"model":"hearth-tiny"}`, 400, "input"},
		{`{"model":"hearth-tiny","input":"x","encoding_format":"int8"}`, 400, "encoding_format"},
		{`{"model":"hearth-tiny","input":"x","dimensions":-1}`, 400, "dimensions"},
		{`{"model":"hearth-tiny","input":"x","extra":1}`, 400, "extra"},
		{`{"model":"other","input":"x"}`, 404, nil},
		{`{"model":"hearth-tiny","input":"` + strings.Repeat("w", 8*17) + `"}`, 400, "input"},
		{`{"model":"hearth-tiny","input":["a","` + strings.Repeat("w", 8*17) + `"]}`, 400, "input[1]"},
		{`not json`, 400, nil},
	} {
		resp := ta.postBody(t, "/embeddings", c.body)
		e := errorOf(t, resp)
		if resp.StatusCode != c.status || e["param"] != c.param {
			t.Errorf("%.60s: %d %v", c.body, resp.StatusCode, e)
		}
	}
	if n := ta.rt.Calls(); n != 0 {
		t.Fatalf("the runtime was called %d times for refused requests", n)
	}
	if u := ta.keys.Usage(ta.keyID); u.Requests != 0 {
		t.Fatalf("refused requests counted: %+v", u)
	}
	resp := ta.postToAs(t, "/embeddings", "hearth_live_00000000000000000000000000000000", `{"model":"hearth-tiny","input":"x"}`)
	if e := errorOf(t, resp); resp.StatusCode != 401 || e["code"] != "invalid_api_key" {
		t.Fatalf("bad key: %d %v", resp.StatusCode, e)
	}
	get, _ := ta.client.Get(ta.url + "/embeddings")
	get.Body.Close()
	if get.StatusCode != 405 {
		t.Fatalf("GET: %d", get.StatusCode)
	}
}

// A model the runtime cannot embed with is a 400 naming model; a runtime
// failure keeps chat's status mapping.
func TestEmbeddingsRuntimeRefusal(t *testing.T) {
	ta := startAPI(t, fake.Config{EmbedErr: &llm.InvalidRequestError{Param: "model", Msg: "This deployment's model cannot create embeddings."}}, nil)
	resp := ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":"x"}`)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "model" || !strings.Contains(e["message"].(string), "cannot create embeddings") {
		t.Fatalf("%d %v", resp.StatusCode, e)
	}
	ta.rt.SetConfig(fake.Config{EmbedErr: fmt.Errorf("down: %w", llm.ErrUnavailable)})
	resp = ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":"x"}`)
	if e := errorOf(t, resp); resp.StatusCode != 503 {
		t.Fatalf("unavailable: %d %v", resp.StatusCode, e)
	}
	testutil.WaitFor(t, 5*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
}

// A batch is one request against the key's per-minute limit.
func TestEmbeddingsBatchIsOneRequest(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	secret, key := ta.keys.AddLimited("limited", 1, 0)
	batch := `{"model":"hearth-tiny","input":[` + strings.Repeat(`"a b",`, 99) + `"a b"]}`
	resp := ta.postToAs(t, "/embeddings", secret, batch)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rateHeaders(resp, "requests") != [3]string{"1", "0", "1m0s"} {
		t.Fatalf("batch: %d %v", resp.StatusCode, rateHeaders(resp, "requests"))
	}
	if u := ta.keys.Usage(key.ID); u != (apikeys.Usage{Requests: 1, PromptTokens: 200}) {
		t.Fatalf("usage %+v", u)
	}
	resp = ta.postToAs(t, "/embeddings", secret, `{"model":"hearth-tiny","input":"x"}`)
	if e := errorOf(t, resp); resp.StatusCode != 429 || e["code"] != "rate_limit_exceeded" {
		t.Fatalf("second request: %d %v", resp.StatusCode, e)
	}
}

func TestCompletions(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{" a", " b"}, TokenCount: 40}, nil)
	resp := ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":"Once upon a time","temperature":0.2,"stop":"zz","top_k":5}`)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d %v", resp.StatusCode, m)
	}
	id, _ := m["id"].(string)
	choice := m["choices"].([]any)[0].(map[string]any)
	if !strings.HasPrefix(id, "cmpl-") || m["object"] != "text_completion" || m["model"] != "hearth-tiny" ||
		choice["text"] != strings.Repeat(" a b", 8) || choice["finish_reason"] != "length" || choice["index"] != 0.0 ||
		choice["logprobs"] != nil {
		t.Fatalf("answer %v", m)
	}
	if u := m["usage"].(map[string]any); u["prompt_tokens"] != 4.0 || u["completion_tokens"] != 16.0 || u["total_tokens"] != 20.0 {
		t.Fatalf("usage %v", u)
	}
	got := ta.rt.LastCompletion()
	if got.Prompt != "Once upon a time" || got.Suffix != "" || *got.Options.MaxTokens != 16 || *got.Options.Temperature != 0.2 ||
		fmt.Sprint(got.Options.Stop) != "[zz]" || *got.Options.TopK != 5 || got.Options.Seed != nil {
		t.Fatalf("runtime got %+v", got)
	}
	if u := ta.keys.Usage(ta.keyID); u != (apikeys.Usage{Requests: 1, PromptTokens: 4, CompletionTokens: 16}) {
		t.Fatalf("key usage %+v", u)
	}
}

func TestCompletionsStream(t *testing.T) { overBoth(t, testCompletionsStream) }

func testCompletionsStream(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x", "y"}}, nil)
	resp := ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":["go"],"stream":true,"stream_options":{"include_usage":true}}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readSSE(t, resp.Body)
	if len(evs) != 5 || evs[4].data != "[DONE]" {
		t.Fatalf("events %v", evs)
	}
	var text []string
	var id string
	for i, e := range evs[:4] {
		c := chunkOf(t, e)
		if c["object"] != "text_completion" || (id != "" && c["id"] != id) {
			t.Fatalf("chunk %d: %v", i, c)
		}
		id = c["id"].(string)
		choices := c["choices"].([]any)
		if i == 3 {
			u := c["usage"].(map[string]any)
			if len(choices) != 0 || u["completion_tokens"] != 2.0 || u["prompt_tokens"] != 1.0 {
				t.Fatalf("usage chunk %v", c)
			}
			continue
		}
		if _, ok := c["usage"]; !ok || c["usage"] != nil {
			t.Fatalf("chunk %d lacks usage:null: %v", i, c)
		}
		ch := choices[0].(map[string]any)
		text = append(text, ch["text"].(string))
		if want := map[bool]any{true: "stop", false: nil}[i == 2]; ch["finish_reason"] != want {
			t.Fatalf("chunk %d finish %v", i, ch["finish_reason"])
		}
	}
	if strings.Join(text, "|") != "x|y|" {
		t.Fatalf("text %q", text)
	}
}

func TestCompletionsBadInput(t *testing.T) {
	ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: 64, Capabilities: []string{"completion"}}}, nil)
	for _, c := range []struct {
		body   string
		status int
		param  any
	}{
		{`{"model":"hearth-tiny","prompt":""}`, 400, "prompt"},
		{`{"model":"hearth-tiny","prompt":["a","b","c"],"n":3}`, 400, "n"},
		{`{"model":"hearth-tiny","prompt":[1,2]}`, 400, "prompt"},
		{`{"model":"hearth-tiny"}`, 400, "prompt"},
		{`{"model":"hearth-tiny","prompt":"x","suffix":"y"}`, 400, "suffix"},
		{`{"model":"hearth-tiny","prompt":"x","n":9}`, 400, "n"},
		{`{"model":"hearth-tiny","prompt":"x","best_of":2}`, 400, "best_of"},
		{`{"model":"hearth-tiny","prompt":"x","echo":true}`, 400, "echo"},
		{`{"model":"hearth-tiny","prompt":"x","logprobs":1}`, 400, "logprobs"},
		{`{"model":"hearth-tiny","prompt":"x","logit_bias":{"1":1}}`, 400, "logit_bias"},
		{`{"model":"hearth-tiny","prompt":"x","max_tokens":65}`, 400, "max_tokens"},
		{`{"model":"hearth-tiny","prompt":"x","messages":[]}`, 400, "messages"},
		{`{"model":"hearth-tiny","prompt":"` + strings.Repeat("w", 8*65) + `"}`, 400, "prompt"},
		{`{"model":"other","prompt":"x"}`, 404, nil},
	} {
		resp := ta.postBody(t, "/completions", c.body)
		e := errorOf(t, resp)
		if resp.StatusCode != c.status || e["param"] != c.param {
			t.Errorf("%.60s: %d %v", c.body, resp.StatusCode, e)
		}
	}
	if n := ta.rt.Calls(); n != 0 {
		t.Fatalf("the runtime was called %d times for refused requests", n)
	}
	// An embedding model does not generate.
	ta.rt.SetConfig(fake.Config{Limits: llm.Limits{Capabilities: []string{"embedding"}}})
	ta.forgetLimits()
	resp := ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":"x"}`)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "model" || ta.rt.Calls() != 0 {
		t.Fatalf("embedding model: %d %v (%d runtime calls)", resp.StatusCode, e, ta.rt.Calls())
	}
	// With the insert capability, a suffix reaches the runtime.
	ta.rt.SetConfig(fake.Config{Limits: llm.Limits{Capabilities: []string{"completion", "insert"}}})
	ta.forgetLimits()
	resp = ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":"def f(","suffix":"return x"}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if got := ta.rt.LastCompletion(); resp.StatusCode != 200 || got == nil || got.Suffix != "return x" {
		t.Fatalf("suffix: %d %+v", resp.StatusCode, got)
	}
}

// Without max_tokens a legacy completion gets OpenAI's 16, or the output
// cap when that is lower (not a 400 about a parameter never sent).
func TestCompletionsDefaultMaxTokens(t *testing.T) {
	for _, c := range []struct {
		cap, ctx, want int
	}{{0, 0, 16}, {0, 2048, 16}, {8, 2048, 8}, {0, 10, 10}, {100, 10, 16}} {
		ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: c.ctx}}, func(cfg *APIConfig) { cfg.MaxOutputTokens = c.cap })
		resp := ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":"x"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := ta.rt.LastCompletion(); resp.StatusCode != 200 || got == nil || *got.Options.MaxTokens != c.want {
			t.Errorf("cap %d, context %d: %d %+v, want max_tokens %d", c.cap, c.ctx, resp.StatusCode, got, c.want)
		}
	}
}

// A client that leaves a legacy completion stream cancels it at once.
func TestCompletionsDisconnectCancels(t *testing.T) { overBoth(t, testCompletionsDisconnectCancels) }

func testCompletionsDisconnectCancels(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 2, TokenDelay: slowToken}, nil)
	conn, err := ta.dial()
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"hearth-tiny","stream":true,"prompt":"hi"}`
	fmt.Fprintf(conn, "POST /api/v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", ta.secret, len(body), body)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"text":"x"`) {
			break
		}
	}
	leave(t, conn, ta.rt.LastStream())
	testutil.WaitFor(t, 10*time.Second, "the slot back", func() bool { return ta.api.lim.active() == 0 })
}

// The runtime's refusal of a request is a 400, and a failure in the middle
// of a stream ends it with an error event and [DONE].
func TestCompletionsRuntimeErrors(t *testing.T) {
	ta := startAPI(t, fake.Config{ChatErr: &llm.InvalidRequestError{Msg: "bad"}}, nil)
	resp := ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":"x"}`)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["message"] != "bad" {
		t.Fatalf("%d %v", resp.StatusCode, e)
	}
	ta.rt.SetConfig(fake.Config{Tokens: []string{"a"}, TokenCount: 5, StreamErr: io.ErrUnexpectedEOF, FailAfter: 2})
	resp = ta.postBody(t, "/completions", `{"model":"hearth-tiny","prompt":"x","stream":true}`)
	evs := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(evs) != 4 || !strings.Contains(evs[2].data, `"error"`) || evs[3].data != "[DONE]" {
		t.Fatalf("events %v", evs)
	}
	testutil.WaitFor(t, 5*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
}

// Oversized bodies get 413 on both routes.
func TestEmbeddingsAndCompletionsTooLarge(t *testing.T) {
	ta := startAPI(t, fake.Config{}, func(c *APIConfig) { c.MaxBodyBytes = 1 << 10 })
	for _, route := range []string{"/embeddings", "/completions"} {
		resp := ta.postBody(t, route, `{"model":"hearth-tiny","input":"`+strings.Repeat("a", 2<<10)+`"}`)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 {
			t.Errorf("%s: %d", route, resp.StatusCode)
		}
	}
}

// A client that leaves while its batch is being embedded cancels the
// runtime's work and frees the slot.
func TestEmbeddingsDisconnectCancels(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	ta := startAPI(t, fake.Config{Hold: hold}, nil)
	conn, err := ta.dial()
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"hearth-tiny","input":["a","b"]}`
	fmt.Fprintf(conn, "POST /api/v1/embeddings HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", ta.secret, len(body), body)
	testutil.WaitFor(t, 10*time.Second, "the embedding to start", func() bool { started, _ := ta.rt.Embeds(); return started == 1 })
	conn.Close()
	testutil.WaitFor(t, 10*time.Second, "the runtime call cancelled", func() bool { _, stopped := ta.rt.Embeds(); return stopped == 1 })
	testutil.WaitFor(t, 10*time.Second, "the slot back", func() bool { return ta.api.lim.active() == 0 })
}

// Both routes answer 503 while the model loads and once the drain began,
// without calling the runtime.
func TestEmbeddingsAndCompletionsNotServing(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	bodies := map[string]string{"/embeddings": `{"model":"hearth-tiny","input":"x"}`, "/completions": `{"model":"hearth-tiny","prompt":"x"}`}
	ta.api.SetWarm(false)
	for route, body := range bodies {
		resp := ta.postBody(t, route, body)
		if e := errorOf(t, resp); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s while loading: %d %v", route, resp.StatusCode, e)
		}
	}
	ta.api.SetWarm(true)
	ta.api.draining.Store(true)
	for route, body := range bodies {
		resp := ta.postBody(t, route, body)
		if e := errorOf(t, resp); resp.StatusCode != 503 {
			t.Errorf("%s while draining: %d %v", route, resp.StatusCode, e)
		}
	}
	if n := ta.rt.Calls(); n != 0 {
		t.Fatalf("runtime called %d times", n)
	}
}

// forgetLimits makes the next request ask the runtime for its limits again.
func (ta *testAPI) forgetLimits() {
	s := ta.api.gate.cur.Load()
	s.limMu.Lock()
	s.limKnown = false
	s.limMu.Unlock()
}

// An embedding ended by the hard stop (or a switch's drain timeout) is
// answered 503, not left without an answer.
func TestEmbeddingsEndedByTheStopGet503(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	ta := startAPI(t, fake.Config{Hold: hold}, nil)
	got := make(chan int, 1)
	req, _ := http.NewRequest("POST", ta.url+"/embeddings", strings.NewReader(`{"model":"hearth-tiny","input":"x"}`))
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	go func() {
		resp, err := ta.client.Do(req)
		if err != nil {
			got <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	testutil.WaitFor(t, 10*time.Second, "the embedding to start", func() bool { started, _ := ta.rt.Embeds(); return started == 1 })
	ta.api.Close()
	if status := <-got; status != 503 {
		t.Fatalf("status %d, want 503", status)
	}
}

// Several prompts, each n times: choice i continues prompt i/n, with
// seed+i%n, each a generation of its own; usage sums the generations.
func TestCompletionsPromptsTimesN(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x", "y"}, PromptTokens: 3}, nil)
	body := `{"model":"hearth-tiny","prompt":["one","two"],"n":2,"seed":10`
	resp := ta.postBody(t, "/completions", body+`}`)
	var got struct {
		Choices []struct {
			Text         string `json:"text"`
			Index        int    `json:"index"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			Prompt     int `json:"prompt_tokens"`
			Completion int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(got.Choices) != 4 || got.Usage.Completion != 8 || got.Usage.Prompt != 3 {
		t.Fatalf("answer %+v", got)
	}
	for i, c := range got.Choices {
		if c.Index != i || c.Text != "xy" || c.FinishReason != "stop" {
			t.Fatalf("choice %d: %+v", i, c)
		}
	}
	prompts := map[string][]int64{}
	for _, r := range ta.rt.Completions() {
		prompts[r.Prompt] = append(prompts[r.Prompt], *r.Options.Seed)
	}
	for p, seeds := range prompts {
		slices.Sort(seeds)
		if fmt.Sprint(seeds) != "[10 11]" {
			t.Fatalf("prompt %q ran with seeds %v, want [10 11]", p, seeds)
		}
	}
	if len(prompts) != 2 || prompts["one"] == nil || prompts["two"] == nil {
		t.Fatalf("prompts run %v", prompts)
	}

	// Streamed: each choice's chunks carry its index and end with its own
	// finish reason; usage and [DONE] come after the last.
	resp = ta.postBody(t, "/completions", body+`,"stream":true,"stream_options":{"include_usage":true}}`)
	defer resp.Body.Close()
	evs := readSSE(t, resp.Body)
	if n := len(evs); n != 4*3+2 || evs[n-1].data != "[DONE]" {
		t.Fatalf("events %v", evs)
	}
	text, finish := map[float64]string{}, map[float64]string{}
	for _, e := range evs[:len(evs)-2] {
		ch := chunkOf(t, e)["choices"].([]any)[0].(map[string]any)
		i := ch["index"].(float64)
		if _, done := finish[i]; done {
			t.Fatalf("choice %v got a chunk after its finish: %v", i, ch)
		}
		text[i] += ch["text"].(string)
		if f, ok := ch["finish_reason"].(string); ok {
			finish[i] = f
		}
	}
	for i := range 4 {
		if text[float64(i)] != "xy" || finish[float64(i)] != "stop" {
			t.Fatalf("choice %d: text %q finish %q", i, text[float64(i)], finish[float64(i)])
		}
	}
	if u := chunkOf(t, evs[len(evs)-2])["usage"].(map[string]any); u["completion_tokens"] != 8.0 {
		t.Fatalf("usage %v", u)
	}
}
