package deployapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

// requestLog wraps the served runtime and keeps every request it gets (the
// fake keeps only the last).
type requestLog struct {
	llm.Runtime
	mu   sync.Mutex
	reqs []llm.Request
}

func (r *requestLog) Chat(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, *req)
	r.mu.Unlock()
	return r.Runtime.Chat(ctx, req)
}

func (r *requestLog) seeds() map[int64]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[int64]bool{}
	for _, q := range r.reqs {
		if q.Options.Seed != nil {
			out[*q.Options.Seed] = true
		}
	}
	return out
}

// logRequests makes ta's served model record its requests; call it before
// the first request.
func logRequests(ta *testAPI) *requestLog {
	s := ta.api.gate.cur.Load()
	l := &requestLog{Runtime: s.rt}
	s.rt = l
	return l
}

// n=3 without streaming: three choices indexed 0…2, each its own
// generation (seed, seed+1, seed+2), the prompt reported once and the
// output tokens summed; the key's usage counts what the runtime did.
func TestNChoicesNonStream(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"Hello", " world"}, PromptTokens: 7}, nil)
	log := logRequests(ta)
	resp := ta.post(t, `{"model":"hearth-tiny","n":3,"seed":5,"messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	m := decodeJSON(t, resp.Body)
	choices := m["choices"].([]any)
	if len(choices) != 3 {
		t.Fatalf("%d choices", len(choices))
	}
	for i, c := range choices {
		c := c.(map[string]any)
		if c["index"] != float64(i) || c["finish_reason"] != "stop" || c["message"].(map[string]any)["content"] != "Hello world" {
			t.Errorf("choice %d: %v", i, c)
		}
	}
	u := m["usage"].(map[string]any)
	if u["prompt_tokens"] != 7.0 || u["completion_tokens"] != 6.0 || u["total_tokens"] != 13.0 {
		t.Errorf("usage %v", u)
	}
	if got := ta.keys.Usage(ta.keyID); got.Requests != 1 || got.CompletionTokens != 6 || got.PromptTokens != 21 {
		t.Errorf("recorded usage %+v, want 1 request, 21 prompt and 6 completion tokens", got)
	}
	if seeds := log.seeds(); len(seeds) != 3 || !seeds[5] || !seeds[6] || !seeds[7] {
		t.Errorf("seeds %v, want 5, 6 and 7", seeds)
	}
	if ta.rt.Calls() != 3 || ta.api.lim.active() != 0 {
		t.Errorf("runtime called %d times, %d slots still taken", ta.rt.Calls(), ta.api.lim.active())
	}
}

// n=3 streamed: every choice gets its role chunk, its content and its own
// finish chunk; usage and [DONE] come after the last.
func TestNChoicesStream(t *testing.T) { overBoth(t, testNChoicesStream) }

func testNChoicesStream(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a", "b", "c"}, PromptTokens: 4}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","n":3,"stream":true,"stream_options":{"include_usage":true},`+
		`"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	events := readSSE(t, resp.Body)
	if events[len(events)-1].data != "[DONE]" {
		t.Fatalf("last event %q", events[len(events)-1].data)
	}
	roles, content, finishes := map[int]int{}, map[int]string{}, map[int][]string{}
	var usage map[string]any
	for k, e := range events[:len(events)-1] {
		ch := chunkOf(t, e)
		if u, ok := ch["usage"].(map[string]any); ok {
			if k != len(events)-2 {
				t.Errorf("usage chunk is not the last before [DONE]")
			}
			usage = u
			continue
		}
		for _, c := range ch["choices"].([]any) {
			c := c.(map[string]any)
			i := int(c["index"].(float64))
			if len(finishes[i]) > 0 {
				t.Errorf("choice %d has a chunk after its finish: %v", i, c)
			}
			d := c["delta"].(map[string]any)
			if d["role"] == "assistant" {
				roles[i]++
			}
			if s, ok := d["content"].(string); ok {
				content[i] += s
			}
			if f, ok := c["finish_reason"].(string); ok {
				finishes[i] = append(finishes[i], f)
			}
		}
	}
	for i := range 3 {
		if roles[i] != 1 || content[i] != "ab" || len(finishes[i]) != 1 || finishes[i][0] != "length" {
			t.Errorf("choice %d: %d role chunks, content %q, finishes %v", i, roles[i], content[i], finishes[i])
		}
	}
	if len(roles) != 3 {
		t.Errorf("chunks for choices %v", roles)
	}
	if usage["prompt_tokens"] != 4.0 || usage["completion_tokens"] != 6.0 {
		t.Errorf("usage %v", usage)
	}
	testutil.WaitFor(t, 10*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
}

// A request with n choices holds n slots while it runs (another request
// then finds none: 429 with no waiting room) and gives all of them back.
func TestNChoicesTakeAndReleaseSlots(t *testing.T) {
	hold := make(chan struct{})
	ta := startAPI(t, fake.Config{Tokens: []string{"x", "y"}, Hold: hold},
		func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 3, 0 })
	done := make(chan int)
	go func() {
		resp := ta.post(t, `{"model":"hearth-tiny","n":3,"messages":[{"role":"user","content":"hi"}]}`, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	testutil.WaitFor(t, 10*time.Second, "three generations running", func() bool { return len(ta.rt.Streams()) == 3 })
	if n := ta.api.lim.active(); n != 3 {
		t.Fatalf("%d slots taken, want 3", n)
	}
	resp := ta.post(t, chatBody("hi", ""), nil)
	resp.Body.Close()
	if resp.StatusCode != 429 {
		t.Errorf("with every slot taken: %d, want 429", resp.StatusCode)
	}
	// More choices than a key may run at once can never be granted.
	resp = ta.post(t, chatBody("hi", `,"n":4`), nil)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "n" {
		t.Errorf("n=4 over 3 slots: %d %v", resp.StatusCode, e)
	}
	close(hold)
	if code := <-done; code != 200 {
		t.Fatalf("n=3: status %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
}

// A choice whose generation ended gives its slot back while the other
// choices go on: another request can run in it.
func TestNChoicesFreeSlotsAsTheyEnd(t *testing.T) {
	hold := make(chan struct{})
	odd := func(r *llm.Request) bool { return r.Options.Seed != nil && *r.Options.Seed%2 == 1 }
	ta := startAPI(t, fake.Config{Tokens: []string{"x", "y"}, Hold: hold, HoldIf: odd},
		func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 2, 0 })
	done := make(chan int)
	go func() {
		// Choice 0 samples with seed 10 and ends; choice 1 (seed 11) is held.
		resp := ta.post(t, chatBody("hi", `,"n":2,"seed":10`), nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	testutil.WaitFor(t, 10*time.Second, "the first choice's slot back", func() bool {
		return len(ta.rt.Streams()) == 2 && ta.api.lim.active() == 1
	})
	resp := ta.post(t, chatBody("hi", `,"seed":10`), nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("with one choice ended: %d, want 200", resp.StatusCode)
	}
	close(hold)
	if code := <-done; code != 200 {
		t.Fatalf("n=2: status %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
	// Each slot was given back once: both can be taken again together.
	resp = ta.post(t, chatBody("hi", `,"n":2`), nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || ta.api.lim.active() != 0 {
		t.Fatalf("n=2 afterwards: %d, %d slots taken", resp.StatusCode, ta.api.lim.active())
	}
}

// A client that leaves cancels every choice's generation.
func TestNChoicesDisconnectCancelsAll(t *testing.T) { overBoth(t, testNChoicesDisconnectCancelsAll) }

func testNChoicesDisconnectCancelsAll(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 2, TokenDelay: slowToken}, nil)
	conn, err := ta.dial()
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"hearth-tiny","stream":true,"n":3,"messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", ta.secret, len(body), body)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":"x"`) {
			break
		}
	}
	streams := ta.rt.Streams()
	if len(streams) != 3 {
		t.Fatalf("%d generations, want 3", len(streams))
	}
	conn.Close()
	for i, st := range streams {
		select {
		case <-st.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("generation %d still running 10 s after the client left", i)
		}
		if cancelled, _ := st.Cancelled(); !cancelled {
			t.Errorf("generation %d ended without being cancelled", i)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
}

// Two requests of several slots each never deadlock: slots are granted
// all at once, and the waiter at the head of the fair order keeps the
// slots that free for itself, so a run of single-slot requests cannot
// starve it either.
func TestLimiterGrantsSeveralSlotsTogether(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(4, 0, 8)
		granted := make(chan string, 10)
		get := func(key string, n int) {
			go func() {
				if l.acquireN(context.Background(), key, n) == nil {
					granted <- key
				}
			}()
			synctest.Wait()
		}
		get("a", 3)
		get("b", 3) // 1 slot free: b waits, holding none
		get("c", 1) // behind b in the fair order: waits too
		if got := drain(granted); len(got) != 1 || got[0] != "a" || l.active() != 3 {
			t.Fatalf("granted %v with %d running", got, l.active())
		}
		l.release("a")
		if got := drain(granted); len(got) != 0 {
			t.Fatalf("granted %v with 2 slots free", got)
		}
		l.release("a") // 3 free: b gets them together
		if got := drain(granted); len(got) != 1 || got[0] != "b" || l.active() != 4 {
			t.Fatalf("granted %v with %d running", got, l.active())
		}
		l.release("a") // a's last: c's turn
		if got := drain(granted); len(got) != 1 || got[0] != "c" || l.active() != 4 {
			t.Fatalf("granted %v with %d running", got, l.active())
		}
		l.release("b")
		l.release("b")
		l.release("b")
		l.release("c")
		if l.active() != 0 {
			t.Fatalf("%d slots taken", l.active())
		}
	})
}

// toolBody is a request with a weather tool (integer, boolean and enum
// parameters) and a clock tool, plus extra fields.
func toolBody(extra string) string {
	return `{"model":"hearth-tiny","messages":[{"role":"user","content":"weather?"}],"tools":[` +
		`{"type":"function","function":{"name":"weather","description":"Weather at a place.","parameters":` + weatherSchema + `}},` +
		`{"type":"function","function":{"name":"now"}}],` + extra + `}`
}

const weatherSchema = `{"type":"object","properties":{"days":{"type":"integer"},"metric":{"type":"boolean"},` +
	`"unit":{"type":"string","enum":["c","f"]}},"required":["days","metric","unit"],"additionalProperties":false}`

// A named tool_choice is generated as its arguments under the tool's
// schema and comes back as one tool call, streamed and not.
func TestForcedNamedTool(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{`{"days": `, `3, "metric": true,`, ` "unit": "c"}`}, PromptTokens: 5}, nil)
	body := toolBody(`"tool_choice":{"type":"function","function":{"name":"weather"}}`)
	resp := ta.post(t, body, nil)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	ch := m["choices"].([]any)[0].(map[string]any)
	msg := ch["message"].(map[string]any)
	calls, _ := msg["tool_calls"].([]any)
	if ch["finish_reason"] != "tool_calls" || msg["content"] != nil || len(calls) != 1 {
		t.Fatalf("choice %v", ch)
	}
	call := calls[0].(map[string]any)
	fn := call["function"].(map[string]any)
	if id, _ := call["id"].(string); !strings.HasPrefix(id, "call_") || fn["name"] != "weather" ||
		fn["arguments"] != `{"days":3,"metric":true,"unit":"c"}` {
		t.Errorf("call %v", call)
	}
	// What the runtime got: the schema as format, no tools, and an
	// instruction naming the function.
	rq := ta.rt.LastRequest()
	if string(rq.Format) != weatherSchema || rq.Tools != nil || rq.ForceTool != "" ||
		rq.Messages[0].Role != "system" || !strings.Contains(rq.Messages[0].Content, `"weather"`) {
		t.Errorf("runtime request: format %s tools %v messages %+v", rq.Format, rq.Tools, rq.Messages)
	}

	resp = ta.post(t, strings.Replace(body, `{"model"`, `{"stream":true,"model"`, 1), nil)
	defer resp.Body.Close()
	var toolChunks, contentChunks int
	var finish string
	for _, e := range readSSE(t, resp.Body) {
		if e.data == "[DONE]" {
			continue
		}
		c := chunkOf(t, e)["choices"].([]any)[0].(map[string]any)
		d := c["delta"].(map[string]any)
		if tc, ok := d["tool_calls"].([]any); ok {
			toolChunks++
			fn := tc[0].(map[string]any)["function"].(map[string]any)
			if fn["arguments"] != `{"days":3,"metric":true,"unit":"c"}` {
				t.Errorf("streamed call %v", fn)
			}
		}
		if s, _ := d["content"].(string); s != "" {
			contentChunks++
		}
		if f, ok := c["finish_reason"].(string); ok {
			finish = f
		}
	}
	if toolChunks != 1 || contentChunks != 0 || finish != "tool_calls" {
		t.Errorf("stream: %d tool chunks, %d content chunks, finish %q", toolChunks, contentChunks, finish)
	}
}

// tool_choice "required" with several tools: the output names one of
// them, under a schema with one alternative per tool.
func TestForcedAnyTool(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{`{"name":"now",`, `"arguments":{}}`}}, nil)
	resp := ta.post(t, toolBody(`"tool_choice":"required"`), nil)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	ch := m["choices"].([]any)[0].(map[string]any)
	calls, _ := ch["message"].(map[string]any)["tool_calls"].([]any)
	if ch["finish_reason"] != "tool_calls" || len(calls) != 1 {
		t.Fatalf("choice %v", ch)
	}
	if fn := calls[0].(map[string]any)["function"].(map[string]any); fn["name"] != "now" || fn["arguments"] != `{}` {
		t.Errorf("call %v", fn)
	}
	var schema struct {
		AnyOf []struct {
			Properties struct {
				Name struct {
					Enum []string `json:"enum"`
				} `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"properties"`
		} `json:"anyOf"`
	}
	rq := ta.rt.LastRequest()
	if err := json.Unmarshal(rq.Format, &schema); err != nil || len(schema.AnyOf) != 2 ||
		schema.AnyOf[0].Properties.Name.Enum[0] != "weather" || string(schema.AnyOf[0].Properties.Arguments) != weatherSchema ||
		schema.AnyOf[1].Properties.Name.Enum[0] != "now" {
		t.Errorf("format %s (%v)", rq.Format, err)
	}
}

// A forced call cut by max_tokens is never a tool call: it ends with
// finish_reason length and the partial arguments as content.
func TestForcedToolCutByLength(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{`{"days": `, `3, "metric": true,`, ` "unit": "c"}`}}, nil)
	body := toolBody(`"tool_choice":{"type":"function","function":{"name":"weather"}},"max_tokens":2`)
	resp := ta.post(t, body, nil)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	ch := m["choices"].([]any)[0].(map[string]any)
	msg := ch["message"].(map[string]any)
	if ch["finish_reason"] != "length" || msg["tool_calls"] != nil || msg["content"] != `{"days": 3, "metric": true,` {
		t.Errorf("choice %v", ch)
	}
	resp = ta.post(t, strings.Replace(body, `{"model"`, `{"stream":true,"model"`, 1), nil)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(raw), "tool_calls") || !strings.Contains(string(raw), `"finish_reason":"length"`) {
		t.Errorf("stream:\n%s", raw)
	}
}

// Text that is not the call (here a stop sequence cut it) comes back as
// content, never as a malformed call.
func TestForcedToolNotJSON(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{`{"days": `, `3`, `}`}}, nil)
	resp := ta.post(t, toolBody(`"tool_choice":{"type":"function","function":{"name":"weather"}},"stop":["}"]`), nil)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	ch := m["choices"].([]any)[0].(map[string]any)
	if ch["finish_reason"] != "stop" || ch["message"].(map[string]any)["tool_calls"] != nil {
		t.Errorf("choice %v", ch)
	}
}

// parallel_tool_calls false with tool_choice auto: one call reaches the
// client, however many the model makes.
func TestOneToolCall(t *testing.T) {
	calls := []llm.ToolCall{{ID: "call_a", Name: "now", Arguments: json.RawMessage(`{}`)},
		{ID: "call_b", Name: "weather", Arguments: json.RawMessage(`{"days":1}`)}}
	ta := startAPI(t, fake.Config{Tokens: []string{""}, ToolCalls: calls}, nil)
	for _, stream := range []bool{false, true} {
		body := toolBody(fmt.Sprintf(`"parallel_tool_calls":false,"stream":%v`, stream))
		resp := ta.post(t, body, nil)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if n := strings.Count(string(raw), `"call_`); n != 1 || !strings.Contains(string(raw), "call_a") {
			t.Errorf("stream %v: %d calls in\n%s", stream, n, raw)
		}
	}
	// Left to the model, both come through.
	resp := ta.post(t, toolBody(`"parallel_tool_calls":true`), nil)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if n := strings.Count(string(raw), `"call_`); n != 2 {
		t.Errorf("parallel: %d calls in\n%s", n, raw)
	}
}

// A forced request with n=2 forces every choice.
func TestForcedToolWithChoices(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{`{"days":1,"metric":false,"unit":"f"}`}}, nil)
	resp := ta.post(t, toolBody(`"tool_choice":{"type":"function","function":{"name":"weather"}},"n":2`), nil)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	choices := m["choices"].([]any)
	ids := map[string]bool{}
	for i, c := range choices {
		c := c.(map[string]any)
		calls, _ := c["message"].(map[string]any)["tool_calls"].([]any)
		if c["finish_reason"] != "tool_calls" || len(calls) != 1 {
			t.Fatalf("choice %d: %v", i, c)
		}
		ids[calls[0].(map[string]any)["id"].(string)] = true
	}
	if len(choices) != 2 || len(ids) != 2 {
		t.Errorf("%d choices, %d distinct call ids", len(choices), len(ids))
	}
}

// A choice that fails mid-stream ends the whole answer with an error
// event and [DONE] (streamed) or a 502 (not streamed), and every slot and
// generation is let go.
func TestNChoicesFailure(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 10, StreamErr: errors.New("runner died"), FailAfter: 2}, nil)
	resp := ta.post(t, chatBody("hi", `,"n":3,"stream":true`), nil)
	evs := readSSE(t, resp.Body)
	resp.Body.Close()
	if len(evs) < 2 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream did not end cleanly: %v", evs)
	}
	if _, ok := chunkOf(t, evs[len(evs)-2])["error"].(map[string]any); !ok {
		t.Fatalf("no error event before [DONE]: %v", evs[len(evs)-2])
	}
	resp = ta.post(t, chatBody("hi", `,"n":3`), nil)
	if errorOf(t, resp); resp.StatusCode != 502 {
		t.Errorf("not streamed: %d, want 502", resp.StatusCode)
	}
	testutil.WaitFor(t, 10*time.Second, "the slots back", func() bool { return ta.api.lim.active() == 0 })
	for i, st := range ta.rt.Streams() {
		select {
		case <-st.Done():
		case <-time.After(10 * time.Second):
			t.Fatalf("generation %d still running", i)
		}
	}

	// A runtime that refuses the request: an HTTP error, no slot kept.
	ta.rt.SetConfig(fake.Config{ChatErr: &llm.InvalidRequestError{Msg: "bad schema"}})
	resp = ta.post(t, chatBody("hi", `,"n":3,"stream":true`), nil)
	if errorOf(t, resp); resp.StatusCode != 400 {
		t.Errorf("refused by the runtime: %d, want 400", resp.StatusCode)
	}
	if n := ta.api.lim.active(); n != 0 {
		t.Errorf("%d slots kept after a refused start", n)
	}
}

// Waiters held back only by their key's cap keep no slot from another
// key, even with the waiting room full.
func TestLimiterCappedWaitersKeepNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := newLimiter(4, 1, 1)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if err := l.acquire(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		waited := make(chan error, 1)
		go func() { waited <- l.acquire(ctx, "a") }() // a's second: waits on a's cap, fills the room
		synctest.Wait()
		if l.queued() != 1 {
			t.Fatalf("%d queued", l.queued())
		}
		if err := l.acquire(ctx, "b"); err != nil {
			t.Fatalf("b with 3 slots free: %v", err)
		}
		if err := l.acquireN(ctx, "c", 1); err != nil || l.active() != 3 || l.queued() != 1 {
			t.Fatalf("c: %v, %d running, %d queued", err, l.active(), l.queued())
		}
		l.release("a")
		if err := <-waited; err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"a", "b", "c"} {
			l.release(k)
		}
		if l.active() != 0 {
			t.Fatalf("%d running", l.active())
		}
	})
}
