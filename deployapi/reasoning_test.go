package deployapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

// thinker is a fake reasoning model: its runtime lists the thinking
// capability and it thinks in two pieces before it answers.
var thinker = fake.Config{Limits: llm.Limits{Capabilities: []string{"completion", "thinking"}},
	Reasoning: []string{"Let me", " think."}}

// A reasoning model's thinking is kept apart from the answer: as
// reasoning_content in the message and in stream deltas (as vLLM and
// DeepSeek send it), counted in usage.completion_tokens_details.
func TestReasoningWireShape(t *testing.T) {
	ta := startAPI(t, thinker, nil)

	resp := ta.post(t, chatBody("hi", ""), nil)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var full struct {
		Choices []struct {
			Message struct {
				Content          string `json:"content"`
				ReasoningContent string `json:"reasoning_content"`
			}
		}
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
			Details          struct {
				ReasoningTokens int `json:"reasoning_tokens"`
			} `json:"completion_tokens_details"`
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&full); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	m := full.Choices[0].Message
	if m.Content != "Hello world" || m.ReasoningContent != "Let me think." || full.Usage.CompletionTokens != 4 || full.Usage.Details.ReasoningTokens != 2 {
		t.Fatalf("message %+v usage %+v", m, full.Usage)
	}
	// Asked nothing, a model that can think is asked to, apart.
	if got := ta.rt.LastRequest().Options.Think; got != llm.ThinkMedium {
		t.Fatalf("runtime asked think %q", got)
	}

	resp = ta.post(t, chatBody("hi", `,"stream":true,"stream_options":{"include_usage":true}`), nil)
	events := readSSE(t, resp.Body)
	resp.Body.Close()
	var reasoning, content strings.Builder
	var reasoningFirst bool
	var details int
	for _, ev := range events {
		if ev.data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta map[string]any
			}
			Usage *struct {
				Details struct {
					ReasoningTokens int `json:"reasoning_tokens"`
				} `json:"completion_tokens_details"`
			}
		}
		if err := json.Unmarshal([]byte(ev.data), &c); err != nil {
			t.Fatalf("%v: %s", err, ev.data)
		}
		if c.Usage != nil {
			details = c.Usage.Details.ReasoningTokens
		}
		for _, ch := range c.Choices {
			if r, ok := ch.Delta["reasoning_content"].(string); ok {
				reasoning.WriteString(r)
				if content.Len() == 0 {
					reasoningFirst = true
				}
				if _, both := ch.Delta["content"]; both {
					t.Fatalf("a delta with both: %s", ev.data)
				}
			}
			if s, ok := ch.Delta["content"].(string); ok {
				content.WriteString(s)
			}
		}
	}
	if reasoning.String() != "Let me think." || content.String() != "Hello world" || !reasoningFirst || details != 2 {
		t.Fatalf("stream: reasoning %q content %q first %v details %d", reasoning.String(), content.String(), reasoningFirst, details)
	}
}

// Who decides whether the model thinks: the request (reasoning_effort),
// the deployment (--reasoning=false), and what the model can do.
func TestReasoningEffort(t *testing.T) {
	noThink := fake.Config{Limits: llm.Limits{Capabilities: []string{"completion"}}}
	unknown := fake.Config{}
	for name, c := range map[string]struct {
		rt      fake.Config
		off     bool
		effort  string
		status  int
		think   string // what the runtime was asked
		content string
	}{
		"none":                           {thinker, false, "none", 200, llm.ThinkNone, "Hello world"},
		"high":                           {thinker, false, "high", 200, llm.ThinkHigh, "Hello world"},
		"minimal is low":                 {thinker, false, "minimal", 200, llm.ThinkLow, "Hello world"},
		"off: asked not to":              {thinker, true, "", 200, llm.ThinkNone, "Hello world"},
		"off: none is fine":              {thinker, true, "none", 200, llm.ThinkNone, "Hello world"},
		"off: an effort is refused":      {thinker, true, "high", 400, "", ""},
		"cannot reason: refused":         {noThink, false, "low", 400, "", ""},
		"cannot reason: none is dropped": {noThink, false, "none", 200, "", "Hello world"},
		"cannot reason: nothing asked":   {noThink, false, "", 200, "", "Hello world"},
		"unknown: passed on":             {unknown, false, "high", 200, llm.ThinkHigh, "Hello world"},
		"unknown: nothing asked":         {unknown, false, "", 200, "", "Hello world"},
	} {
		t.Run(name, func(t *testing.T) {
			ta := startAPI(t, c.rt, func(cfg *APIConfig) { cfg.NoReasoning = c.off })
			extra := ""
			if c.effort != "" {
				extra = `,"reasoning_effort":"` + c.effort + `"`
			}
			resp := ta.post(t, chatBody("hi", extra), nil)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			if c.status == 400 {
				if e := errorOf(t, resp); e["param"] != "reasoning_effort" {
					t.Fatalf("error %v", e)
				}
				if ta.rt.LastRequest() != nil {
					t.Fatal("the runtime was called")
				}
				return
			}
			m := decodeJSON(t, resp.Body)
			msg := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
			if msg["content"] != c.content {
				t.Fatalf("content %v", msg["content"])
			}
			if got := ta.rt.LastRequest().Options.Think; got != c.think {
				t.Fatalf("runtime asked think %q, want %q", got, c.think)
			}
			_, hasReasoning := msg["reasoning_content"]
			if want := c.think != "" && c.think != llm.ThinkNone && c.rt.Reasoning != nil; hasReasoning != want {
				t.Fatalf("reasoning_content present %v, want %v: %v", hasReasoning, want, msg)
			}
		})
	}
}
