package ollama

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"

	"github.com/hearthd/hearth/llm"
)

// TestPlainChatBody holds the hand-written request body to what
// encoding/json writes for the same request: the same JSON value, key for
// key, and a decline for every request it does not cover.
func TestPlainChatBody(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	n := func(v int) *int { return &v }
	i64 := func(v int64) *int64 { return &v }
	b := &Backend{cfg: Config{Model: "hearth-tiny"}}
	msgs := []llm.Message{{Role: "system", Content: "Be <brief> & \"exact\"\n"}, {Role: "user", Content: "héllo 😀 \x01 \u2028 \xff"}}
	for _, c := range []struct {
		name  string
		req   llm.Request
		plain bool
	}{
		{"no options", llm.Request{Messages: msgs}, true},
		{"no messages", llm.Request{}, true},
		{"every option", llm.Request{Messages: msgs, Options: llm.Options{
			Temperature: f(0.7), TopP: f(1), MaxTokens: n(64), Stop: []string{"\n\n", "END", `"q"`}, Seed: i64(-42),
			PresencePenalty: f(-1.5), FrequencyPenalty: f(2), TopK: i64(40), MinP: f(1e-7), RepetitionPenalty: f(1.1),
			Logprobs: true, TopLogprobs: 5, Think: llm.ThinkHigh,
		}}, true},
		{"top_k off", llm.Request{Messages: msgs, Options: llm.Options{TopK: i64(-1)}}, true},
		{"empty stop list", llm.Request{Messages: msgs, Options: llm.Options{Stop: []string{}}}, true},
		{"thinking off", llm.Request{Messages: msgs, Options: llm.Options{Think: llm.ThinkNone, MaxTokens: n(0)}}, true},
		{"a tool result", llm.Request{Messages: append(msgs, llm.Message{Role: "tool", Content: "21°C", ToolName: "weather"},
			llm.Message{Role: "user", Content: "x", ToolName: "not sent"})}, true},
		{"thinking given back", llm.Request{Messages: append(msgs, llm.Message{Role: "assistant", Content: "hi", Thinking: "they \"said\"\nhi"},
			llm.Message{Role: "user", Content: "again"})}, true},
		{"tool calls", llm.Request{Messages: []llm.Message{{Role: "assistant", Thinking: "t", ToolCalls: []llm.ToolCall{{Name: "f", Arguments: json.RawMessage(`{"a":1}`)}}}}}, false},
		{"tools", llm.Request{Messages: msgs, Tools: []llm.Tool{{Name: "f"}}}, false},
		{"format", llm.Request{Messages: msgs, Format: json.RawMessage(`"json"`)}, false},
	} {
		want, err := b.encodeChatBody(&c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, ok := b.plainChatBody(&c.req)
		if ok != c.plain {
			t.Errorf("%s: plain %v, want %v", c.name, ok, c.plain)
			continue
		}
		if !ok {
			continue
		}
		if g, w := decodeAny(t, got), decodeAny(t, want); !reflect.DeepEqual(g, w) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, want)
		}
		if body, _ := b.chatBody(&c.req); !bytes.Equal(body, got) {
			t.Errorf("%s: chatBody does not take the plain path", c.name)
		}
	}
}

func decodeAny(t *testing.T, b []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if d.More() {
		t.Fatalf("%s: trailing data", b)
	}
	return normNumbers(v)
}

// normNumbers turns json.Numbers into float64 so that 1 and 1.0, or 1e-07
// and 1e-7, compare as the numbers Ollama reads.
func normNumbers(v any) any {
	switch x := v.(type) {
	case json.Number:
		f, _ := x.Float64()
		return f
	case map[string]any:
		for k, e := range x {
			x[k] = normNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = normNumbers(e)
		}
	}
	return v
}
