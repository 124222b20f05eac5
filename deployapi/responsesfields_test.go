package deployapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/sealbox"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

// include reasoning.encrypted_content hands the thinking out sealed; sent
// back in the next request's input, the runtime is given it again as the
// assistant's thinking. Another node's seal is a 400 that never reaches
// the runtime.
func TestResponsesEncryptedReasoning(t *testing.T) {
	seal := sealbox.Ephemeral()
	ta := startAPI(t, thinker, func(c *APIConfig) { c.Sealer = seal })
	r := response(t, ta.postResponses(t, respBody(`,"include":["reasoning.encrypted_content"],"store":false`)))
	if len(r.Output) != 2 || r.Output[0].Type != "reasoning" || r.Output[0].EncryptedContent == "" ||
		strings.Contains(r.Output[0].EncryptedContent, "think") {
		t.Fatalf("response %s", r.RawJSON())
	}
	out, _ := json.Marshal([]json.RawMessage{json.RawMessage(r.Output[0].RawJSON()), json.RawMessage(r.Output[1].RawJSON())})
	next := `{"model":"hearth-tiny","input":[{"role":"user","content":"hi there"},` + string(out[1:len(out)-1]) +
		`,{"role":"user","content":"go on"}],"reasoning":{"context":"all_turns"}}`
	_ = response(t, ta.postResponses(t, next))
	msgs := ta.rt.LastRequest().Messages
	if len(msgs) != 3 || msgs[1].Role != "assistant" || msgs[1].Content != "Hello world" || msgs[1].Thinking != "Let me think." {
		t.Fatalf("runtime messages %+v", msgs)
	}

	// Streamed, the reasoning item's done event carries it too.
	resp := ta.postResponses(t, respBody(`,"include":["reasoning.encrypted_content"],"stream":true`))
	evs := readResponseEvents(t, resp.Body)
	resp.Body.Close()
	sealed := ""
	for _, ev := range evs {
		if ev.typ == "response.output_item.done" && ev.u.AsResponseOutputItemDone().Item.Type == "reasoning" {
			sealed = ev.u.AsResponseOutputItemDone().Item.EncryptedContent
		}
	}
	if sealed == "" {
		t.Fatalf("no encrypted_content in the stream: %v", eventTypes(evs))
	}

	other := startAPI(t, thinker, func(c *APIConfig) { c.Sealer = sealbox.Ephemeral() })
	resp = other.postResponses(t, next)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["code"] != "invalid_encrypted_content" || e["param"] != "input[1].encrypted_content" {
		t.Fatalf("another node's seal: %d %v", resp.StatusCode, e)
	}
	if other.rt.Calls() != 0 {
		t.Fatal("a refused request reached the runtime")
	}
}

// truncation "auto" drops the oldest input items until the input fits the
// context with room for max_output_tokens; without it, the same input is
// a 400 context_length_exceeded.
func TestResponsesTruncationAuto(t *testing.T) {
	ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: 128, Capabilities: []string{"completion", "tools"}}}, nil)
	long := strings.Repeat("x", 300)
	input := `"input":[{"role":"developer","content":"rules"},{"role":"user","content":"` + long + `"},` +
		`{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"` + long + `"},` +
		`{"role":"assistant","content":"` + long + `"},{"role":"user","content":"` + long + `"},{"role":"user","content":"last"}]`
	body := `{"model":"hearth-tiny","instructions":"sys",` + input + `,"max_output_tokens":16,` +
		`"tools":[{"type":"function","name":"f"}]`
	resp := ta.postResponses(t, body+`}`)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["code"] != "context_length_exceeded" || e["param"] != "input" {
		t.Fatalf("without truncation: %d %v", resp.StatusCode, e)
	}
	r := response(t, ta.postResponses(t, body+`,"truncation":"auto"}`))
	if r.Truncation != "auto" {
		t.Fatalf("truncation echoed %q", r.Truncation)
	}
	var got []string
	for _, m := range ta.rt.LastRequest().Messages {
		got = append(got, m.Role+":"+m.Content[:min(len(m.Content), 5)])
	}
	// The budget (128 − 16 tokens, 4 bytes each: 448 bytes) holds the
	// system messages, the last two items and the tool: the oldest three
	// went, the call with its output.
	if want := []string{"system:sys", "system:rules", "user:xxxxx", "user:last"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runtime messages %v, want %v", got, want)
	}

	// Without max_output_tokens the whole context is the budget (512
	// bytes), and only what does not fit goes: the oldest.
	r = response(t, ta.postResponses(t, `{"model":"hearth-tiny","truncation":"auto","input":[{"role":"user","content":"`+long+long+
		`"},{"role":"assistant","content":"short"},{"role":"user","content":"last"}]}`))
	got = got[:0]
	for _, m := range ta.rt.LastRequest().Messages {
		got = append(got, m.Role+":"+m.Content[:min(len(m.Content), 5)])
	}
	if want := []string{"assistant:short", "user:last"}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("runtime messages %v, want %v", got, want)
	}
}

// max_tool_calls bounds the function calls that come back; the later ones
// are dropped, streamed or not.
func TestResponsesMaxToolCalls(t *testing.T) {
	calls := []llm.ToolCall{{ID: "a", Name: "f", Arguments: json.RawMessage(`{}`)}, {ID: "b", Name: "f", Arguments: json.RawMessage(`{}`)},
		{ID: "c", Name: "f", Arguments: json.RawMessage(`{}`)}}
	ta := startAPI(t, fake.Config{ToolCalls: calls}, nil)
	tools := `,"tools":[{"type":"function","name":"f"}]`
	for _, tc := range []struct {
		extra string
		want  int
	}{{"", 3}, {`,"max_tool_calls":2`, 2}, {`,"max_tool_calls":2,"parallel_tool_calls":false`, 1}} {
		r := response(t, ta.postResponses(t, respBody(tools+tc.extra)))
		n := 0
		for _, it := range r.Output {
			if it.Type == "function_call" {
				n++
			}
		}
		if n != tc.want {
			t.Errorf("%s: %d calls, want %d: %s", tc.extra, n, tc.want, r.RawJSON())
		}
		resp := ta.postResponses(t, respBody(tools+tc.extra+`,"stream":true`))
		evs := readResponseEvents(t, resp.Body)
		resp.Body.Close()
		if got := strings.Count(fmt.Sprint(eventTypes(evs)), "function_call_arguments.done"); got != tc.want {
			t.Errorf("%s streamed: %d calls, want %d", tc.extra, got, tc.want)
		}
	}
	// No call allowed: the model is offered no tools.
	_ = response(t, ta.postResponses(t, respBody(tools+`,"max_tool_calls":0`)))
	if got := ta.rt.LastRequest(); len(got.Tools) != 0 {
		t.Fatalf("max_tool_calls 0: tools offered %+v", got.Tools)
	}
}

// include message.output_text.logprobs gives each token's logprob in the
// deltas and the output part, where the runtime answers them; where it
// cannot, the request is a 400 naming include.
func TestResponsesLogprobs(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a", "b"}, Logprobs: true}, nil)
	body := respBody(`,"include":["message.output_text.logprobs"],"top_logprobs":2`)
	r := response(t, ta.postResponses(t, body))
	lp := r.Output[0].Content[0].Logprobs
	if len(lp) != 2 || lp[0].Token != "a" || lp[1].Token != "b" || lp[0].Logprob != -1 || r.TopLogprobs != 2 {
		t.Fatalf("response %s", r.RawJSON())
	}
	if o := ta.rt.LastRequest().Options; !o.Logprobs || o.TopLogprobs != 2 {
		t.Fatalf("runtime options %+v", o)
	}
	resp := ta.postResponses(t, strings.TrimSuffix(body, "}")+`,"stream":true}`)
	evs := readResponseEvents(t, resp.Body)
	resp.Body.Close()
	if d := evs[4].u.AsResponseOutputTextDelta(); d.Delta != "a" || len(d.Logprobs) != 1 || d.Logprobs[0].Token != "a" {
		t.Fatalf("delta %s", evs[4].data)
	}
	// top_logprobs alone asks for nothing, as OpenAI has it.
	_ = response(t, ta.postResponses(t, respBody(`,"top_logprobs":2`)))
	if o := ta.rt.LastRequest().Options; o.Logprobs || o.TopLogprobs != 0 {
		t.Fatalf("top_logprobs alone: runtime options %+v", o)
	}

	no := startAPI(t, fake.Config{Logprobs: false}, nil)
	resp = no.postResponses(t, body)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "include" {
		t.Fatalf("a runtime without logprobs: %d %v", resp.StatusCode, e)
	}
}
