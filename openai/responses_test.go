package openai

import (
	"encoding/json"
	"math"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/packages/respjson"
	"github.com/openai/openai-go/v3/responses"

	"github.com/hearthd/hearth/internal/sealbox"
	"github.com/hearthd/hearth/llm"
)

func rbody(extra string) string {
	return `{"model":"` + testModel + `","input":"hi"` + extra + `}`
}

func TestDecodeResponsesRequestMapping(t *testing.T) {
	ptr := func(v float64) *float64 { return &v }
	tests := []struct {
		name string
		body string
		want llm.Request
	}{
		{"string input", rbody(""), llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}}},
		{"settings", rbody(`,"instructions":"be brief","temperature":0.5,"top_p":1,"max_output_tokens":16,` +
			`"reasoning":{"effort":"minimal"},"text":{"format":{"type":"json_object"},"verbosity":"medium"},` +
			`"store":false,"user":"u","safety_identifier":"s","prompt_cache_key":"k","metadata":{"a":"b"},` +
			`"truncation":"disabled","service_tier":"auto","include":[],"top_logprobs":0,"background":false,` +
			`"stream":true,"stream_options":{"include_obfuscation":false}`),
			llm.Request{
				Messages: []llm.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}},
				Options: llm.Options{Temperature: ptr(0.5), TopP: ptr(1), MaxTokens: func() *int { n := 16; return &n }(),
					Think: llm.ThinkLow},
				Format: json.RawMessage(`"json"`),
			}},
		{"json schema", rbody(`,"text":{"format":{"type":"json_schema","name":"x","strict":true,"schema":{"type":"object"}}}`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, Format: json.RawMessage(`{"type":"object"}`)}},
		{"tools forced", rbody(`,"tools":[{"type":"function","name":"get_weather","description":"W.","parameters":{"type":"object"},"strict":true},` +
			`{"type":"function","name":"now"}],"tool_choice":"required","parallel_tool_calls":false`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, Tools: []llm.Tool{
				{Name: "get_weather", Description: "W.", Parameters: json.RawMessage(`{"type":"object"}`)},
				{Name: "now", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
			}, ForceTool: llm.ToolAny, MaxToolCalls: 1}},
		{"named tool", rbody(`,"tools":[{"type":"function","name":"now"}],"tool_choice":{"type":"function","name":"now"}`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, Tools: []llm.Tool{
				{Name: "now", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}, ForceTool: "now"}},
		{"tool_choice none", rbody(`,"tools":[{"type":"function","name":"now"}],"tool_choice":"none"`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}}},
		{"items and tool round trip", `{"model":"` + testModel + `","instructions":"sys","input":[
				{"role":"developer","content":"be brief"},
				{"type":"message","role":"user","content":[{"type":"input_text","text":"what's "},{"type":"input_text","text":"up?"}]},
				{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"hmm"}]},
				{"id":"msg_1","type":"message","role":"assistant","status":"completed",
					"content":[{"type":"output_text","text":"Let me see.","annotations":[],"logprobs":[]}]},
				{"type":"function_call","id":"fc_1","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Oslo\"}","status":"completed"},
				{"type":"function_call","call_id":"call_2","name":"now","arguments":""},
				{"type":"function_call_output","call_id":"call_1","output":"cold"},
				{"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"noon"}]},
				{"type":"function_call_output","call_id":"call_1","name":"now","output":"!"},
				{"type":"function_call","call_id":"call_3","name":"now","arguments":"{}"}
			]}`,
			llm.Request{Messages: []llm.Message{
				{Role: "system", Content: "sys"},
				{Role: "system", Content: "be brief"},
				{Role: "user", Content: "what's up?"},
				{Role: "assistant", Content: "Let me see.", Thinking: "hmm", ToolCalls: []llm.ToolCall{
					{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)},
					{ID: "call_2", Name: "now", Arguments: json.RawMessage(`{}`)},
				}},
				{Role: "tool", Content: "cold", ToolName: "get_weather"},
				{Role: "tool", Content: "noon", ToolName: "now"},
				{Role: "tool", Content: "!", ToolName: "now"},
				{Role: "assistant", ToolCalls: []llm.ToolCall{{ID: "call_3", Name: "now", Arguments: json.RawMessage(`{}`)}}},
			}}},
		{"fields accepted and ignored", rbody(`,"reasoning":{"summary":"auto","generate_summary":"concise","context":"auto","mode":"standard"},` +
			`"prompt_cache_retention":"24h","prompt_cache_options":{"ttl":"30m"},"access_programs":{"cyber":"standard"},` +
			`"context_management":[{"type":"compaction","compact_threshold":1000}],"service_tier":"default",` +
			`"include":["web_search_call.action.sources","file_search_call.results"],"top_logprobs":3,` +
			`"tools":[{"type":"function","name":"f","defer_loading":true,"allowed_callers":["direct"],"async":false,"output_schema":{"type":"string"}}]`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, Tools: []llm.Tool{
				{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}},
		{"logprobs, verbosity, max_tool_calls", rbody(`,"instructions":"sys","include":["message.output_text.logprobs"],"top_logprobs":3,` +
			`"text":{"verbosity":"low"},"max_tool_calls":2,"tools":[{"type":"function","name":"f"}]`),
			llm.Request{Messages: []llm.Message{{Role: "system", Content: "sys\n\n" + verbosityHints["low"]}, {Role: "user", Content: "hi"}},
				Options: llm.Options{Logprobs: true, TopLogprobs: 3}, MaxToolCalls: 2,
				Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}},
		{"verbosity high without instructions", rbody(`,"text":{"verbosity":"high"}`),
			llm.Request{Messages: []llm.Message{{Role: "system", Content: verbosityHints["high"]}, {Role: "user", Content: "hi"}}}},
		{"max_tool_calls 0 offers no tools", rbody(`,"max_tool_calls":0,"parallel_tool_calls":false,"tools":[{"type":"function","name":"f"}]`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, MaxToolCalls: 1}},
		{"max_tool_calls tighter than parallel_tool_calls", rbody(`,"max_tool_calls":3,"parallel_tool_calls":false,"tools":[{"type":"function","name":"f"}]`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, MaxToolCalls: 1,
				Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}},
		{"allowed tools", rbody(`,"tools":[{"type":"function","name":"f"},{"type":"function","name":"g"}],` +
			`"tool_choice":{"type":"allowed_tools","mode":"required","tools":[{"type":"function","name":"g"}]}`),
			llm.Request{Messages: []llm.Message{{Role: "user", Content: "hi"}}, ForceTool: llm.ToolAny,
				Tools: []llm.Tool{{Name: "g", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}},
		{"reasoning of earlier turns dropped", `{"model":"` + testModel + `","input":[
				{"role":"user","content":"a"},
				{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"s"}],"content":[{"type":"reasoning_text","text":"t1"}]},
				{"role":"assistant","content":"b"},
				{"role":"user","content":"c"},
				{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"t2"},{"type":"reasoning_text","text":"t3"}]},
				{"type":"function_call","call_id":"x","name":"f","arguments":"{}","namespace":"ns","caller":{"type":"direct"},"async":false},
				{"type":"function_call_output","call_id":"x","output":"o","namespace":"ns","caller":{"type":"direct"}}]}`,
			llm.Request{Messages: []llm.Message{
				{Role: "user", Content: "a"}, {Role: "assistant", Content: "b"}, {Role: "user", Content: "c"},
				{Role: "assistant", Thinking: "t2\nt3", ToolCalls: []llm.ToolCall{{ID: "x", Name: "f", Arguments: json.RawMessage(`{}`)}}},
				{Role: "tool", Content: "o", ToolName: "f"},
			}}},
		{"reasoning of all turns", `{"model":"` + testModel + `","reasoning":{"context":"all_turns"},"input":[
				{"role":"user","content":"a"},
				{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"t1"}]},
				{"role":"assistant","content":"b"},
				{"role":"user","content":"c"}]}`,
			llm.Request{Messages: []llm.Message{
				{Role: "user", Content: "a"}, {Role: "assistant", Content: "b", Thinking: "t1"}, {Role: "user", Content: "c"},
			}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, e := DecodeResponsesRequest([]byte(tt.body), testModel, sealbox.Ephemeral())
			if e != nil {
				t.Fatalf("unexpected error: %v", e)
			}
			if !reflect.DeepEqual(got.Runtime, tt.want) {
				t.Fatalf("runtime request\n got  %s\n want %s", dumpString(got.Runtime), dumpString(tt.want))
			}
		})
	}
}

func dumpString(v any) string {
	var sb strings.Builder
	dump(&sb, reflect.ValueOf(v))
	return sb.String()
}

// Every refusal is a 400 (404 for the model) naming the parameter at fault.
func TestDecodeResponsesRequestRefusals(t *testing.T) {
	tests := []struct{ body, param, code string }{
		{`{"input":"hi"}`, "model", "missing_required_parameter"},
		{`{"model":"other","input":"hi"}`, "", "model_not_found"},
		{`{"model":"` + testModel + `"}`, "input", "missing_required_parameter"},
		{`{"model":"` + testModel + `","input":[]}`, "input", "empty_array"},
		{`{"model":"` + testModel + `","input":1}`, "input", "invalid_type"},
		{rbody(`,"foo":1`), "foo", "unknown_parameter"},
		{rbody(`,"store":true`), "store", "unsupported_value"},
		{rbody(`,"previous_response_id":"resp_1"`), "previous_response_id", "unsupported_parameter"},
		{rbody(`,"conversation":"conv_1"`), "conversation", "unsupported_parameter"},
		{rbody(`,"prompt":{"id":"p"}`), "prompt", "unsupported_parameter"},
		{rbody(`,"background":true`), "background", "unsupported_value"},
		{rbody(`,"include":["reasoning.everything"]`), "include[0]", "invalid_value"},
		{rbody(`,"truncation":"sometimes"`), "truncation", "invalid_value"},
		{rbody(`,"top_logprobs":21`), "top_logprobs", "integer_above_max_value"},
		{rbody(`,"max_tool_calls":-1`), "max_tool_calls", "integer_below_min_value"},
		{rbody(`,"max_tool_calls":0,"tools":[{"type":"function","name":"f"}],"tool_choice":"required"`), "max_tool_calls", "invalid_value"},
		{rbody(`,"moderation":{"model":"omni-moderation-latest"}`), "moderation", "unsupported_parameter"},
		{rbody(`,"reasoning":{"mode":"pro"}`), "reasoning.mode", "unsupported_value"},
		{rbody(`,"reasoning":{"context":"forever"}`), "reasoning.context", "invalid_value"},
		{rbody(`,"context_management":[{"compact_threshold":1}]`), "context_management[0].type", "missing_required_parameter"},
		{rbody(`,"tools":[{"type":"namespace","name":"n","tools":[]}]`), "tools[0].type", "unsupported_value"},
		{rbody(`,"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"function","name":"g"}]}`),
			"tool_choice.tools", "invalid_value"},
		{rbody(`,"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"allowed_tools","mode":"auto","tools":[{"type":"mcp","server_label":"s"}]}`),
			"tool_choice.tools[0].type", "unsupported_value"},
		{`{"model":"` + testModel + `","input":[{"type":"reasoning","summary":[],"encrypted_content":"AAAA"}]}`,
			"input[0].encrypted_content", "invalid_encrypted_content"},
		{`{"model":"` + testModel + `","input":[{"type":"reasoning","summary":[],"encrypted_content":"not base64!"}]}`,
			"input[0].encrypted_content", "invalid_encrypted_content"},
		{`{"model":"` + testModel + `","input":[{"type":"reasoning","summary":[],"content":[{"type":"summary_text","text":"x"}]}]}`,
			"input[0].content[0].type", "invalid_value"},
		{rbody(`,"max_output_tokens":0`), "max_output_tokens", "integer_below_min_value"},
		{rbody(`,"temperature":3`), "temperature", "decimal_above_max_value"},
		{rbody(`,"instructions":1`), "instructions", "invalid_type"},
		{rbody(`,"stream_options":{}`), "stream_options", "invalid_value"},
		{rbody(`,"stream":true,"stream_options":{"include_obfuscation":true}`), "stream_options.include_obfuscation", "unsupported_value"},
		{rbody(`,"reasoning":{"effort":"maximal"}`), "reasoning.effort", "invalid_value"},
		{rbody(`,"reasoning":{"summary":"brief"}`), "reasoning.summary", "invalid_value"},
		{rbody(`,"text":{"format":{"type":"xml"}}`), "text.format.type", "invalid_value"},
		{rbody(`,"text":{"format":{"type":"json_schema","schema":{}}}`), "text.format.name", "missing_required_parameter"},
		{rbody(`,"text":{"format":{"type":"json_schema","name":"x"}}`), "text.format.schema", "missing_required_parameter"},
		{rbody(`,"text":{"format":{"type":"text","x":1}}`), "text.format.x", "unknown_parameter"},
		{rbody(`,"text":{"verbosity":"loud"}`), "text.verbosity", "invalid_value"},
		{rbody(`,"metadata":{"a":1}`), "metadata.a", "invalid_type"},
		{rbody(`,"metadata":{"a":"` + strings.Repeat("x", 513) + `"}`), "metadata.a", "string_above_max_length"},
		{rbody(`,"metadata":{` + strings.Repeat(`"k":"v",`, 0) + manyPairs(17) + `}`), "metadata", "object_above_max_properties"},
		{rbody(`,"tools":[{"type":"web_search"}]`), "tools[0].type", "unsupported_value"},
		{rbody(`,"tools":[{"type":"function","name":"f"},{"type":"code_interpreter"}]`), "tools[1].type", "unsupported_value"},
		{rbody(`,"tools":[{"type":"function","name":"f"},{"type":"function","name":"f"}]`), "tools[1].name", "invalid_value"},
		{rbody(`,"tools":[{"type":"function","name":"f","function":{}}]`), "tools[0].function", "unknown_parameter"},
		{rbody(`,"tools":[{"type":"function","name":"bad name"}]`), "tools[0].name", "invalid_value"},
		{rbody(`,"tool_choice":"required"`), "tool_choice", "invalid_value"},
		{rbody(`,"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"}`), "tool_choice.name", "invalid_value"},
		{rbody(`,"tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"web_search_preview"}`), "tool_choice.type", "unsupported_value"},
		{rbody(`,"tool_choice":"any"`), "tool_choice", "invalid_value"},
		{rbody(`,"parallel_tool_calls":"no"`), "parallel_tool_calls", "invalid_type"},
		{`{"model":"` + testModel + `","input":[{"role":"tool","content":"x"}]}`, "input[0].role", "invalid_value"},
		{`{"model":"` + testModel + `","input":[{"role":"user"}]}`, "input[0].content", "missing_required_parameter"},
		{`{"model":"` + testModel + `","input":[{"role":"user","content":"x","name":"n"}]}`, "input[0].name", "unknown_parameter"},
		{`{"model":"` + testModel + `","input":[{"role":"user","content":[{"type":"input_image","image_url":"u"}]}]}`,
			"input[0].content[0].type", "unsupported_content_type"},
		{`{"model":"` + testModel + `","input":[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]}`,
			"input[0].content[0].type", "unsupported_content_type"},
		{`{"model":"` + testModel + `","input":[{"role":"user","content":[{"type":"refusal","refusal":"r"}]}]}`,
			"input[0].content[0].type", "invalid_value"},
		{`{"model":"` + testModel + `","input":[{"role":"user","content":[{"type":"input_text","text":"a","x":1}]}]}`,
			"input[0].content[0].x", "unknown_parameter"},
		{`{"model":"` + testModel + `","input":[{"type":"item_reference","id":"msg_1"}]}`, "input[0].type", "unsupported_value"},
		{`{"model":"` + testModel + `","input":[{"type":"web_search_call"}]}`, "input[0].type", "unsupported_value"},
		{`{"model":"` + testModel + `","input":[{"type":"thing"}]}`, "input[0].type", "invalid_value"},
		{`{"model":"` + testModel + `","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"[]"}]}`,
			"input[0].arguments", "invalid_value"},
		{`{"model":"` + testModel + `","input":[{"type":"function_call","name":"f","arguments":"{}"}]}`,
			"input[0].call_id", "missing_required_parameter"},
		{`{"model":"` + testModel + `","input":[{"type":"function_call_output","call_id":"c"}]}`,
			"input[0].output", "missing_required_parameter"},
		{`{"model":"` + testModel + `","input":[{"type":"function_call_output","call_id":"c","output":"r"}]}`, "input", ""},
		{`{"model":"` + testModel + `","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"d","output":"r"}]}`, "input", ""},
		{`{"model":"` + testModel + `","input":[{"type":"function_call_output","call_id":"c","output":"r"},` +
			`{"type":"function_call","call_id":"c","name":"f","arguments":"{}"}]}`, "input", ""},
		{`{"model":"` + testModel + `","input":[{"type":"function_call_output","call_id":"c","output":[{"type":"input_image"}]}]}`,
			"input[0].output[0].type", "unsupported_content_type"},
		{`{"model":"` + testModel + `","input":[{"type":"reasoning","id":"r","foo":1}]}`, "input[0].foo", "unknown_parameter"},
	}
	for _, tt := range tests {
		_, e := DecodeResponsesRequest([]byte(tt.body), testModel, sealbox.Ephemeral())
		if e == nil {
			t.Errorf("%s: accepted", tt.body)
			continue
		}
		if e.Param != tt.param || e.Code != tt.code || (e.Status != 400) != (tt.code == "model_not_found") {
			t.Errorf("%s:\n got  %d param=%q code=%q %s\n want param=%q code=%q", tt.body, e.Status, e.Param, e.Code, e.Message, tt.param, tt.code)
		}
	}
}

func manyPairs(n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`"k` + string(rune('a'+i)) + `":"v"`)
	}
	return sb.String()
}

// Every known top-level field reaches its decoder: a value no field
// accepts gets a 400 naming that field, never the unknown-field error.
func TestEveryResponsesFieldIsDecoded(t *testing.T) {
	for _, name := range responsesFields.names() {
		key, _ := json.Marshal(name)
		v := `{"x":[1]}`
		if slices.Contains([]string{"prompt_cache_options", "access_programs", "background_options", "image"}, name) { // any object
			v = `[1]`
		}
		_, e := DecodeResponsesRequest([]byte(`{"model":"`+testModel+`","input":"hi",`+string(key)+`:`+v+`}`), testModel, sealbox.Ephemeral())
		if name == "model" || name == "input" {
			_, e = DecodeResponsesRequest([]byte(`{"model":1,"input":1}`), testModel, sealbox.Ephemeral())
		}
		// An unknown key inside the field's object is about the field too.
		if e == nil || e.Param == "" || !strings.HasPrefix(e.Param, name) && name != "input" || e.Param == "x" {
			t.Errorf("%s: got %+v, want a 400 about %s", name, e, name)
		}
	}
}

// The request echoed in every response object.
func TestResponsesEcho(t *testing.T) {
	req, e := DecodeResponsesRequest([]byte(rbody(`,"instructions":"be\nbrief","max_output_tokens":16,"temperature":0.5,`+
		`"tools":[{"type":"function","name":"f","parameters":{ "type" : "object" },"strict":false}],"tool_choice":{"type":"function","name":"f"},`+
		`"parallel_tool_calls":false,"metadata":{"z":"1","a":"2"},"reasoning":{"effort":"high"},`+
		`"text":{"format":{"type":"json_schema","name":"s","description":"d","schema":{"type":"object"},"strict":true}}`)), testModel, sealbox.Ephemeral())
	if e != nil {
		t.Fatal(e)
	}
	want := `"instructions":"be\nbrief","max_output_tokens":16,"max_tool_calls":null,"model":"` + testModel + `","parallel_tool_calls":false,` +
		`"previous_response_id":null,"reasoning":{"effort":"high","summary":null},"store":false,"temperature":0.5,` +
		`"text":{"format":{"type":"json_schema","name":"s","description":"d","schema":{"type":"object"},"strict":true},"verbosity":"medium"},` +
		`"tool_choice":{"type":"function","name":"f"},` +
		`"tools":[{"type":"function","name":"f","description":null,"parameters":{"type":"object"},"strict":false}],` +
		`"top_logprobs":0,"top_p":null,"truncation":"disabled","user":null,"safety_identifier":null,"prompt_cache_key":null,"metadata":{"a":"2","z":"1"},`
	if req.echo != want {
		t.Fatalf("echo\n got  %s\n want %s", req.echo, want)
	}
}

// idPattern matches the random IDs of a response, replaced in golden files,
// and sealedPattern a reasoning item's sealed thinking (a random nonce).
var (
	idPattern     = regexp.MustCompile(`"(resp|msg|fc|rs|call)_[0-9A-Za-z]{20,}"`)
	sealedPattern = regexp.MustCompile(`"encrypted_content":"[A-Za-z0-9+/=]{40,}"`)
)

// A reasoning item handed out sealed comes back in the next request's
// input as the thinking of the assistant's answer, as OpenAI's stateless
// reasoning round trip has it; under another key, or tampered with, it is
// refused.
func TestEncryptedReasoningRoundTrip(t *testing.T) {
	seal := sealbox.Ephemeral()
	req, e := DecodeResponsesRequest([]byte(rbody(`,"include":["reasoning.encrypted_content"]`)), testModel, seal)
	if e != nil {
		t.Fatal(e)
	}
	for _, stream := range []bool{false, true} {
		r := NewResponseEncoder(req, NewResponseID(), 1, stream)
		b := r.Begin(nil)
		b = r.Reasoning(b, "The user says hi.\n")
		b = r.Reasoning(b, "Greet back.")
		b = r.Text(b, "Hello!")
		b = r.Finish(b, "", Usage{})
		var resp responses.Response
		if err := json.Unmarshal(r.AppendResponse(nil), &resp); err != nil {
			t.Fatal(err)
		}
		if stream && !strings.Contains(string(b), `"encrypted_content":"`) {
			t.Errorf("no encrypted_content in the stream's events:\n%s", b)
		}
		// The whole output sent back as input, as the SDKs do.
		var input []json.RawMessage
		for _, it := range resp.Output {
			input = append(input, json.RawMessage(it.RawJSON()))
		}
		input = append(input, json.RawMessage(`{"role":"user","content":"and now?"}`))
		in, _ := json.Marshal(input)
		if !strings.Contains(string(in), "encrypted_content") {
			t.Fatalf("the output has no encrypted_content: %s", in)
		}
		body := []byte(`{"model":"` + testModel + `","reasoning":{"context":"all_turns"},"input":[{"role":"user","content":"hi"},` + string(in[1:]) + `}`)
		next, e := DecodeResponsesRequest(body, testModel, seal)
		if e != nil {
			t.Fatal(e)
		}
		want := []llm.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "Hello!", Thinking: "The user says hi.\nGreet back."},
			{Role: "user", Content: "and now?"}}
		if !reflect.DeepEqual(next.Runtime.Messages, want) {
			t.Errorf("stream %v: input decoded to\n%s\nwant\n%s", stream, dumpString(next.Runtime.Messages), dumpString(want))
		}
		// The sealed thinking wins over a plain one sent beside it.
		forged := strings.Replace(string(body), `"type":"reasoning_text","text":"The user says hi.\nGreet back."`,
			`"type":"reasoning_text","text":"forged"`, 1)
		if forged == string(body) {
			t.Fatalf("the reasoning item has no plain content to forge: %s", body)
		}
		if next, e := DecodeResponsesRequest([]byte(forged), testModel, seal); e != nil || next.Runtime.Messages[1].Thinking != want[1].Thinking {
			t.Errorf("plain content beside the sealed one: %v, %+v", e, next)
		}
		// Another node's key, or a changed byte, does not open it.
		if _, e := DecodeResponsesRequest(body, testModel, sealbox.Ephemeral()); e == nil || e.Code != "invalid_encrypted_content" ||
			!strings.HasSuffix(e.Param, ".encrypted_content") {
			t.Errorf("another key: got %v, want invalid_encrypted_content", e)
		}
		if _, e := DecodeResponsesRequest(body, testModel, nil); e == nil || e.Code != "invalid_encrypted_content" {
			t.Errorf("no key: got %v, want invalid_encrypted_content", e)
		}
		m := sealedPattern.FindIndex(body)
		tampered := append([]byte{}, body...)
		tampered[m[1]-3] ^= 1 // a base64 character of the tag
		if _, e := DecodeResponsesRequest(tampered, testModel, seal); e == nil || e.Code != "invalid_encrypted_content" {
			t.Errorf("tampered: got %v, want invalid_encrypted_content", e)
		}
	}
	// Without a key the include is refused, so a client is not handed
	// reasoning items it cannot send back.
	if _, e := DecodeResponsesRequest([]byte(rbody(`,"include":["reasoning.encrypted_content"]`)), testModel, nil); e == nil || e.Param != "include[0]" {
		t.Errorf("include without a key: got %v", e)
	}
}

// A response's encodings, streamed and not, in every shape: text,
// reasoning then text, tool calls, cut by the token limit, failed. Each is
// pinned by a golden file, and decoded by openai-go with every field of
// the types it knows valid.
func TestResponseEncodingGolden(t *testing.T) {
	type step func(r *ResponseEncoder, dst []byte) []byte
	text := func(s string) step { return func(r *ResponseEncoder, dst []byte) []byte { return r.Text(dst, s) } }
	think := func(s string) step { return func(r *ResponseEncoder, dst []byte) []byte { return r.Reasoning(dst, s) } }
	calls := func(c ...llm.ToolCall) step {
		return func(r *ResponseEncoder, dst []byte) []byte { return r.ToolCalls(dst, c) }
	}
	finish := func(reason string, u Usage) step {
		return func(r *ResponseEncoder, dst []byte) []byte { return r.Finish(dst, reason, u) }
	}
	cases := []struct {
		name  string
		body  string
		steps []step
	}{
		{"text", rbody(`,"metadata":{"k":"v"}`), []step{text("Hé \"q\"\n"), text("😀 \u2028"), finish("", Usage{Prompt: 5, Completion: 2})}},
		{"reasoning", rbody(`,"reasoning":{"effort":"low"}`), []step{think("Let me"), think(" think."), text("Hi"),
			finish("", Usage{Prompt: 5, Completion: 3, Reasoning: 2})}},
		{"tools", rbody(`,"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],"tool_choice":"required"`),
			[]step{text("Checking."), calls(llm.ToolCall{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)},
				llm.ToolCall{Name: "now"}), finish("", Usage{Prompt: 9, Completion: 4})}},
		{"incomplete", rbody(`,"max_output_tokens":2`), []step{text("a"), text("b"), finish("max_output_tokens", Usage{Prompt: 1, Completion: 2})}},
		{"failed", rbody(``), []step{text("a"), func(r *ResponseEncoder, dst []byte) []byte { return r.Fail(dst, InternalError()) }}},
		{"encrypted", rbody(`,"include":["reasoning.encrypted_content"],"reasoning":{"effort":"high","summary":"auto"},"store":false`),
			[]step{think("Hm."), text("Hi"), finish("", Usage{Prompt: 5, Completion: 2, Reasoning: 1})}},
		{"logprobs", rbody(`,"include":["message.output_text.logprobs"],"top_logprobs":1,"text":{"verbosity":"low"},"truncation":"auto","max_tool_calls":2`),
			[]step{func(r *ResponseEncoder, dst []byte) []byte {
				return r.TextLogprobs(dst, "Hi", []llm.TokenLogprob{{Token: "Hi", Logprob: -0.5, Bytes: []byte("Hi"),
					TopLogprobs: []llm.TopLogprob{{Token: "Hi", Logprob: -0.5, Bytes: []byte("Hi")}}}})
			}, func(r *ResponseEncoder, dst []byte) []byte {
				return r.TextLogprobs(dst, "!", []llm.TokenLogprob{{Token: "!", Logprob: math.Inf(-1)}})
			}, finish("", Usage{Prompt: 5, Completion: 2})}},
		{"logprobs-off", rbody(``), []step{func(r *ResponseEncoder, dst []byte) []byte {
			return r.TextLogprobs(dst, "Hi", []llm.TokenLogprob{{Token: "Hi", Logprob: -0.5}})
		}, finish("", Usage{Prompt: 5, Completion: 1})}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, e := DecodeResponsesRequest([]byte(tc.body), testModel, sealbox.Ephemeral())
			if e != nil {
				t.Fatal(e)
			}
			var out []byte
			for _, stream := range []bool{false, true} {
				r := NewResponseEncoder(req, NewResponseID(), 1700000000, stream)
				b := r.Begin(nil)
				for _, s := range tc.steps {
					b = s(r, b)
				}
				if !stream {
					if len(b) != 0 {
						t.Fatalf("events without stream: %q", b)
					}
					b = r.AppendResponse(nil)
					var resp responses.Response
					if err := json.Unmarshal(b, &resp); err != nil {
						t.Fatal(err)
					}
					sdkValid(t, "response", reflect.ValueOf(resp))
					b = append(b, '\n')
				} else {
					checkEvents(t, b)
				}
				b = sealedPattern.ReplaceAll(idPattern.ReplaceAll(b, []byte(`"${1}_ID"`)), []byte(`"encrypted_content":"SEALED"`))
				out = append(out, b...)
				out = append(out, '\n')
			}
			golden := "testdata/responses/" + tc.name + ".txt"
			if *updateGolden {
				if err := os.MkdirAll("testdata/responses", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, out, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if string(want) != string(out) {
				t.Errorf("%s differs (go test -run Golden -update, and review the diff):\n%s", golden, out)
			}
		})
	}
}

// checkEvents checks a stream's events: `event: T` then `data: {"type":T,
// "sequence_number":N,…}` with N counting from 0, each decoded by openai-go.
func checkEvents(t *testing.T, b []byte) {
	t.Helper()
	s := string(b)
	if !strings.HasSuffix(s, "\n\n") {
		t.Fatalf("stream does not end with an event: %q", s)
	}
	for i, ev := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		typ, data, ok := strings.Cut(ev, "\n")
		typ, ok1 := strings.CutPrefix(typ, "event: ")
		data, ok2 := strings.CutPrefix(data, "data: ")
		if !ok || !ok1 || !ok2 || strings.Contains(data, "\n") {
			t.Fatalf("event %d malformed: %q", i, ev)
		}
		var head struct {
			Type string `json:"type"`
			Seq  *int   `json:"sequence_number"`
		}
		if err := json.Unmarshal([]byte(data), &head); err != nil {
			t.Fatalf("event %d: %v: %s", i, err, data)
		}
		if head.Type != typ || head.Seq == nil || *head.Seq != i {
			t.Fatalf("event %d: type %q seq %v under event: %s", i, head.Type, head.Seq, typ)
		}
		var u responses.ResponseStreamEventUnion
		if err := json.Unmarshal([]byte(data), &u); err != nil {
			t.Fatalf("event %d: openai-go: %v", i, err)
		}
		sdkValid(t, typ, reflect.ValueOf(u.AsAny()))
	}
}

// sdkValid fails if openai-go found a field of v (recursively) present but
// of a type it does not expect.
func sdkValid(t *testing.T, path string, v reflect.Value) {
	t.Helper()
	switch v.Kind() {
	case reflect.Interface, reflect.Pointer:
		if !v.IsNil() {
			sdkValid(t, path, v.Elem())
		}
	case reflect.Slice:
		for i := range v.Len() {
			sdkValid(t, path+"[]", v.Index(i))
		}
	case reflect.Struct:
		// A union is checked as the variant its type names too.
		if m := v.MethodByName("AsAny"); m.IsValid() && m.Type().NumIn() == 0 {
			sdkValid(t, path+"("+v.Type().Name()+")", m.Call(nil)[0])
		}
		for i := range v.NumField() {
			f, ft := v.Field(i), v.Type().Field(i)
			if !ft.IsExported() {
				continue
			}
			if ft.Name == "JSON" && f.Kind() == reflect.Struct {
				for j := range f.NumField() {
					if !f.Type().Field(j).IsExported() {
						continue
					}
					m, ok := f.Field(j).Interface().(respjson.Field)
					if ok && m.Raw() != respjson.Omitted && m.Raw() != respjson.Null && !m.Valid() {
						t.Errorf("%s.%s: openai-go cannot decode %s", path, f.Type().Field(j).Name, m.Raw())
					}
				}
				continue
			}
			sdkValid(t, path+"."+ft.Name, f)
		}
	}
}

// A streamed text token costs no allocation once the buffers have room.
func TestResponseTextDoesNotAllocate(t *testing.T) {
	req, e := DecodeResponsesRequest([]byte(rbody("")), testModel, sealbox.Ephemeral())
	if e != nil {
		t.Fatal(e)
	}
	r := NewResponseEncoder(req, NewResponseID(), 1700000000, true)
	buf := r.Text(r.Begin(nil), "x")
	r.items[r.open].text = make([]byte, 0, 1<<20)
	buf = make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		buf = r.Text(buf[:0], " token\n\"é\"\u2028\xff")
	})
	if allocs != 0 {
		t.Errorf("Text allocates %v times per call", allocs)
	}
}

// Whatever a request decodes to, its response and events are valid JSON
// and the settings it echoes hold no line break (which would end an event).
func FuzzDecodeResponsesRequest(f *testing.F) {
	for _, s := range []string{
		rbody(""),
		rbody(`,"instructions":"a\nb","temperature":0.5,"max_output_tokens":3,"metadata":{"k":"v\u2028"},"stream":true`),
		rbody(`,"tools":[{"type":"function","name":"f","parameters":{ "type":"object",` + "\n" + `"properties":{}}}],"tool_choice":{"type":"function","name":"f"}`),
		rbody(`,"text":{"format":{"type":"json_schema","name":"s","schema":{"type":"object"}}}`),
		`{"model":"` + testModel + `","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"c","output":"r"},{"role":"user","content":[{"type":"input_text","text":"a"}]}]}`,
		`{"model":"x","input":[]}`, `[]`, `null`, `{}`, rbody(`,"store":true`),
		rbody(`,"include":["reasoning.encrypted_content","message.output_text.logprobs"],"top_logprobs":2,"truncation":"auto",` +
			`"max_tool_calls":1,"text":{"verbosity":"high"},"reasoning":{"summary":"auto","context":"all_turns","mode":"standard"}`),
		rbody(`,"tools":[{"type":"function","name":"f","defer_loading":true}],"tool_choice":{"type":"allowed_tools","mode":"auto",` +
			`"tools":[{"type":"function","name":"f"}]},"context_management":[{"type":"compaction"}],"prompt_cache_options":{}`),
		`{"model":"` + testModel + `","input":[{"role":"user","content":"a"},{"type":"reasoning","summary":[],` +
			`"content":[{"type":"reasoning_text","text":"t"}],"encrypted_content":"AAAA"},{"role":"assistant","content":"b"}]}`,
		`{"model":"` + testModel + `","input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}],` +
			`"content":[{"type":"reasoning_text","text":"t"}]},{"type":"function_call","call_id":"c","name":"f","arguments":"{}",` +
			`"namespace":"n","caller":{"type":"direct"}},{"type":"function_call_output","call_id":"c","output":"o"}]}`,
	} {
		f.Add([]byte(s), "tok\n")
	}
	f.Fuzz(func(t *testing.T, b []byte, tok string) {
		req, e := DecodeResponsesRequest(b, testModel, sealbox.Ephemeral())
		if (req == nil) == (e == nil) {
			t.Fatalf("got request %v and error %v", req, e)
		}
		if e != nil {
			if e.Status < 400 || e.Status > 499 || e.Message == "" {
				t.Fatalf("bad error %+v", e)
			}
			return
		}
		if strings.ContainsAny(req.echo, "\r\n") {
			t.Fatalf("echo has a line break: %s", req.echo)
		}
		r := NewResponseEncoder(req, NewResponseID(), 1, true)
		ev := r.Begin(nil)
		ev = r.Reasoning(ev, tok)
		ev = r.Text(ev, tok)
		ev = r.TextLogprobs(ev, tok, []llm.TokenLogprob{{Token: tok, Logprob: -1, Bytes: []byte(tok)}})
		ev = r.ToolCalls(ev, []llm.ToolCall{{Name: tok, Arguments: json.RawMessage(`{"a":1}`)}})
		ev = r.Finish(ev, "", Usage{Prompt: 1, Completion: 2})
		for _, e := range strings.Split(strings.TrimSuffix(string(ev), "\n\n"), "\n\n") {
			_, data, _ := strings.Cut(e, "\ndata: ")
			if !json.Valid([]byte(data)) || strings.Contains(data, "\n") {
				t.Fatalf("bad event %q", e)
			}
		}
		if !json.Valid(r.AppendResponse(nil)) {
			t.Fatalf("invalid response %s", r.AppendResponse(nil))
		}
	})
}
