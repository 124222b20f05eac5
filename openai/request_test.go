package openai

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/hearthd/hearth/llm"
)

const testModel = "llama3.2:1b"

func f64(v float64) *float64 { return &v }
func i64(v int64) *int64     { return &v }
func intp(v int) *int        { return &v }

// body builds a request for testModel with one user message plus extra
// top-level fields (a JSON object body without braces, or "").
func body(extra string) string {
	b := `{"model":"` + testModel + `","messages":[{"role":"user","content":"hi"}]`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

var hiUser = []llm.Message{{Role: "user", Content: "hi"}}

// mappingTests are accepted requests and what they decode to.
var mappingTests = []struct {
	name string
	body string
	want ChatRequest
}{
	{"minimal leaves everything unset", body(""),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"options", body(`"temperature":0.7,"top_p":0.9,"max_completion_tokens":64,"seed":-42,` +
		`"presence_penalty":-1.5,"frequency_penalty":2,"stop":["a","b"]`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{
			Temperature: f64(0.7), TopP: f64(0.9), MaxTokens: intp(64), Seed: i64(-42),
			PresencePenalty: f64(-1.5), FrequencyPenalty: f64(2), Stop: []string{"a", "b"},
		}}}},
	{"zero values are set, not absent", body(`"temperature":0,"top_p":0,"seed":0,"presence_penalty":0`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{
			Temperature: f64(0), TopP: f64(0), Seed: i64(0), PresencePenalty: f64(0),
		}}}},
	{"vLLM's sampling extras", body(`"top_k":40,"min_p":0.05,"repetition_penalty":1.1`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{
			TopK: i64(40), MinP: f64(0.05), RepetitionPenalty: f64(1.1),
		}}}},
	{"max_tokens alone", body(`"max_tokens":7`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{MaxTokens: intp(7)}}}},
	{"max_tokens equal to max_completion_tokens", body(`"max_tokens":7,"max_completion_tokens":7`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{MaxTokens: intp(7)}}}},
	{"stop string", body(`"stop":"\n\n"`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{Stop: []string{"\n\n"}}}}},
	{"empty stop strings dropped", body(`"stop":["","x",""]`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{Stop: []string{"x"}}}}},
	{"empty stop string is no stop", body(`"stop":""`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"nulls are absent", body(`"temperature":null,"top_p":null,"max_tokens":null,"max_completion_tokens":null,` +
		`"stop":null,"seed":null,"presence_penalty":null,"frequency_penalty":null,"response_format":null,` +
		`"tools":null,"tool_choice":null,"stream":null,"stream_options":null,"user":null,"n":null,` +
		`"parallel_tool_calls":null,"logit_bias":null,"logprobs":null,"top_logprobs":null,"store":null,` +
		`"metadata":null,"service_tier":null,"modalities":null,"audio":null,"prediction":null,` +
		`"reasoning_effort":null,"web_search_options":null,"functions":null,"function_call":null`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"values that change nothing", body(`"n":1,"store":false,"logprobs":false,"top_logprobs":0,"logit_bias":{},` +
		`"metadata":{},"modalities":["text"],"service_tier":"auto","parallel_tool_calls":true,"user":"u-1",` +
		`"safety_identifier":"s","prompt_cache_key":"k","tool_choice":"auto","response_format":{"type":"text"}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"stream with usage", body(`"stream":true,"stream_options":{"include_usage":true,"include_obfuscation":false}`),
		ChatRequest{Model: testModel, Stream: true, IncludeUsage: true, Runtime: llm.Request{Messages: hiUser}}},
	{"stream without usage", body(`"stream":true,"stream_options":{"include_usage":false}`),
		ChatRequest{Model: testModel, Stream: true, Runtime: llm.Request{Messages: hiUser}}},
	{"stream false", body(`"stream":false`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"json_object", body(`"response_format":{"type":"json_object"}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Format: json.RawMessage(`"json"`)}}},
	{"json_schema", body(`"response_format":{"type":"json_schema","json_schema":{"name":"x_1","strict":true,"description":"d",` +
		`"schema":{"type":"object","properties":{"a":{"type":"string"}}}}}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser,
			Format: json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}}}`)}}},
	{"tools", body(`"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather.",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}},` +
		`{"type":"function","function":{"name":"now"}}],"tool_choice":"auto","parallel_tool_calls":true`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Tools: []llm.Tool{
			{Name: "get_weather", Description: "Weather.",
				Parameters: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}}}`)},
			{Name: "now", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
		}}}},
	{"tool_choice required forces any tool", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, ForceTool: llm.ToolAny,
			Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}}},
	{"tool_choice names a tool", body(`"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],` +
		`"tool_choice":{"type":"function","function":{"name":"g"}},"parallel_tool_calls":false`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, ForceTool: "g", MaxToolCalls: 1,
			Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
				{Name: "g", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}}},
	{"parallel_tool_calls false", body(`"parallel_tool_calls":false`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, MaxToolCalls: 1}}},
	{"allowed_tools keeps the tools named", body(`"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],` +
		`"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"g"}}]}}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser,
			Tools: []llm.Tool{{Name: "g", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}}},
	{"allowed_tools required forces one", body(`"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}],` +
		`"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}]}}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, ForceTool: llm.ToolAny,
			Tools: []llm.Tool{{Name: "f", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)},
				{Name: "g", Parameters: json.RawMessage(`{"type":"object","properties":{}}`)}}}}},
	{"verbosity low is an instruction", body(`"verbosity":"low"`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: []llm.Message{{Role: "system", Content: verbosityHints["low"]}, {Role: "user", Content: "hi"}}}}},
	{"verbosity medium changes nothing", body(`"verbosity":"medium"`), ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"template kwargs turn thinking off", body(`"chat_template_kwargs":{"enable_thinking":false,"custom":[1]}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{Think: llm.ThinkNone}}}},
	{"template kwargs give way to reasoning_effort", body(`"reasoning_effort":"high","chat_template_kwargs":{"thinking":false}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{Think: llm.ThinkHigh}}}},
	{"template kwargs effort", body(`"chat_template_kwargs":{"reasoning_effort":"low"}`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{Think: llm.ThinkLow}}}},
	{"ignored hints", `{"model":"` + testModel + `","prompt_cache_retention":"24h","prompt_cache_options":{"ttl":"30m"},"reasoning_effort":"xhigh",` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"hi","prompt_cache_breakpoint":{"mode":"explicit"}}]}]}`,
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser, Options: llm.Options{Think: llm.ThinkHigh}}}},
	{"n up to the cap", body(`"n":8`),
		ChatRequest{Model: testModel, N: 8, Runtime: llm.Request{Messages: hiUser}}},
	{"tool_choice none drops tools", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"none"`),
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
	{"roles, parts and tool round trip",
		`{"model":"` + testModel + `","messages":[
				{"role":"developer","content":"be brief"},
				{"role":"system","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"name":"sys"},
				{"role":"user","content":[{"type":"text","text":"what's "},{"type":"text","text":"up?"}],"name":"bob"},
				{"role":"assistant","content":null,"tool_calls":[
					{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}},
					{"id":"call_2","type":"function","function":{"name":"now","arguments":""}}],"refusal":null},
				{"role":"tool","tool_call_id":"call_1","content":"cold"},
				{"role":"tool","tool_call_id":"call_2","content":[{"type":"text","text":"noon"}]},
				{"role":"tool","tool_call_id":"call_gone","content":"?"},
				{"role":"assistant","content":[{"type":"text","text":"It is "},{"type":"refusal","refusal":"no"}]},
				{"role":"assistant","refusal":"I can't."},
				{"role":"assistant"}
			]}`,
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: []llm.Message{
			{Role: "system", Content: "be brief"},
			{Role: "system", Content: "ab"},
			{Role: "user", Content: "what's up?"},
			{Role: "assistant", ToolCalls: []llm.ToolCall{
				{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)},
				{ID: "call_2", Name: "now", Arguments: json.RawMessage(`{}`)},
			}},
			{Role: "tool", Content: "cold", ToolName: "get_weather"},
			{Role: "tool", Content: "noon", ToolName: "now"},
			{Role: "tool", Content: "?"},
			{Role: "assistant", Content: "It is no"},
			{Role: "assistant", Content: "I can't."},
			{Role: "assistant"},
		}}}},
	{"empty content string and unicode", `{"model":"` + testModel + `","messages":[{"role":"user","content":""},` +
		`{"role":"user","content":"h\u00e9 \ud83d\ude00 \u2028"}]}`,
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: []llm.Message{
			{Role: "user"}, {Role: "user", Content: "hé 😀 \u2028"}}}}},
	{"whitespace around the body", "  \n" + body("") + "\n ",
		ChatRequest{Model: testModel, Runtime: llm.Request{Messages: hiUser}}},
}

func TestDecodeChatRequestMapping(t *testing.T) {
	for _, tt := range mappingTests {
		t.Run(tt.name, func(t *testing.T) {
			got, e := DecodeChatRequest([]byte(tt.body), testModel)
			if e != nil {
				t.Fatalf("unexpected error: %v", e)
			}
			want := tt.want
			if want.N == 0 {
				want.N = 1 // the default; the table leaves it out
			}
			if !reflect.DeepEqual(*got, want) {
				t.Errorf("got  %#v\nwant %#v", *got, want)
			}
		})
	}
}

// errorTests are refused requests and the error each gets.
var errorTests = []struct {
	name   string
	body   string
	status int
	param  string // "" means null
	code   string
	msg    string // substring of the message
}{
	{"not json", `{"model":`, 400, "", "", "could not parse the JSON body"},
	{"garbage", `hello`, 400, "", "", "byte offset"},
	{"empty body", ``, 400, "", "", "could not parse"},
	{"trailing data", body("") + `{}`, 400, "", "", "could not parse"},
	{"array body", `[1]`, 400, "", "", "must be a JSON object, but got an array"},
	{"string body", `"x"`, 400, "", "", "must be a JSON object"},
	{"null body", `null`, 400, "", "", "must be a JSON object"},

	{"unknown field", body(`"foo":1`), 400, "foo", "unknown_parameter", "Unrecognized request argument supplied: foo"},
	{"unknown fields reported in order", body(`"zzz":1,"aaa":2`), 400, "aaa", "unknown_parameter", "aaa"},
	{"field names are case sensitive", body(`"Temperature":1`), 400, "Temperature", "unknown_parameter", ""},

	{"missing model", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "missing_required_parameter", "Missing required parameter: 'model'"},
	{"null model", `{"model":null,"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "missing_required_parameter", ""},
	{"model not a string", `{"model":1,"messages":[{"role":"user","content":"hi"}]}`, 400, "model", "invalid_type", "expected a string, but got an integer"},
	{"wrong model", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, 404, "", "model_not_found",
		"The model `gpt-4o` does not exist or you do not have access to it."},
	{"model differs in case", `{"model":"LLAMA3.2:1b","messages":[]}`, 404, "", "model_not_found", ""},

	{"missing messages", `{"model":"` + testModel + `"}`, 400, "messages", "missing_required_parameter", ""},
	{"empty messages", `{"model":"` + testModel + `","messages":[]}`, 400, "messages", "empty_array", ""},
	{"messages not array", `{"model":"` + testModel + `","messages":{}}`, 400, "messages", "invalid_type", "expected an array, but got an object"},
	{"message not object", `{"model":"` + testModel + `","messages":["hi"]}`, 400, "messages[0]", "invalid_type", ""},
	{"missing role", `{"model":"` + testModel + `","messages":[{"content":"hi"}]}`, 400, "messages[0].role", "missing_required_parameter", ""},
	{"unknown role", `{"model":"` + testModel + `","messages":[{"role":"user","content":"a"},{"role":"bot","content":"hi"}]}`,
		400, "messages[1].role", "invalid_value", "'bot'"},
	{"function role", `{"model":"` + testModel + `","messages":[{"role":"function","content":"hi","name":"f"}]}`,
		400, "messages[0].role", "invalid_value", ""},
	{"content wrong type", `{"model":"` + testModel + `","messages":[{"role":"user","content":"a"},{"role":"user","content":5}]}`,
		400, "messages[1].content", "invalid_type", "expected one of a string or array of objects, but got an integer"},
	{"content missing", `{"model":"` + testModel + `","messages":[{"role":"user"}]}`, 400, "messages[0].content", "missing_required_parameter", ""},
	{"content null for user", `{"model":"` + testModel + `","messages":[{"role":"user","content":null}]}`, 400, "messages[0].content", "missing_required_parameter", ""},
	{"image part", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text","text":"a"},` +
		`{"type":"image_url","image_url":{"url":"http://x/y.png"}}]}]}`, 400, "messages[0].content[1].type", "unsupported_content_type", "text only"},
	{"audio part", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`,
		400, "messages[0].content[0].type", "unsupported_content_type", ""},
	{"file part", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"file","file":{}}]}]}`,
		400, "messages[0].content[0].type", "unsupported_content_type", ""},
	{"unknown part type", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"video"}]}]}`,
		400, "messages[0].content[0].type", "invalid_value", ""},
	{"refusal part for user", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"refusal","refusal":"x"}]}]}`,
		400, "messages[0].content[0].type", "invalid_value", ""},
	{"text part without text", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text"}]}]}`,
		400, "messages[0].content[0].text", "missing_required_parameter", ""},
	{"text part text not string", `{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text","text":1}]}]}`,
		400, "messages[0].content[0].text", "invalid_type", ""},
	{"part not object", `{"model":"` + testModel + `","messages":[{"role":"user","content":["a"]}]}`,
		400, "messages[0].content[0]", "invalid_type", ""},
	{"unknown message field", `{"model":"` + testModel + `","messages":[{"role":"user","content":"a","foo":1}]}`,
		400, "messages[0].foo", "unknown_parameter", ""},
	{"tool_calls on user", `{"model":"` + testModel + `","messages":[{"role":"user","content":"a","tool_calls":[]}]}`,
		400, "messages[0].tool_calls", "unknown_parameter", ""},
	{"name not string", `{"model":"` + testModel + `","messages":[{"role":"user","content":"a","name":1}]}`,
		400, "messages[0].name", "invalid_type", ""},
	{"tool without id", `{"model":"` + testModel + `","messages":[{"role":"tool","content":"a"}]}`,
		400, "messages[0].tool_call_id", "missing_required_parameter", ""},
	{"tool without content", `{"model":"` + testModel + `","messages":[{"role":"tool","tool_call_id":"x"}]}`,
		400, "messages[0].content", "missing_required_parameter", ""},
	{"assistant audio", `{"model":"` + testModel + `","messages":[{"role":"assistant","audio":{"id":"a"}}]}`,
		400, "messages[0].audio", "unsupported_parameter", ""},
	{"assistant function_call", `{"model":"` + testModel + `","messages":[{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}`,
		400, "messages[0].function_call", "unsupported_parameter", ""},
	{"tool call args invalid json", `{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[` +
		`{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]}]}`,
		400, "messages[0].tool_calls[0].function.arguments", "invalid_value", ""},
	{"tool call args not object", `{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[` +
		`{"id":"c","type":"function","function":{"name":"f","arguments":"[1]"}}]}]}`,
		400, "messages[0].tool_calls[0].function.arguments", "invalid_value", ""},
	{"tool call args object not string", `{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[` +
		`{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]}]}`,
		400, "messages[0].tool_calls[0].function.arguments", "invalid_type", ""},
	{"tool call without id", `{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[` +
		`{"type":"function","function":{"name":"f","arguments":"{}"}}]}]}`,
		400, "messages[0].tool_calls[0].id", "missing_required_parameter", ""},
	{"tool call wrong type", `{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[` +
		`{"id":"c","type":"custom","function":{"name":"f","arguments":"{}"}}]}]}`,
		400, "messages[0].tool_calls[0].type", "unsupported_value", ""},
	{"tool call without name", `{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[` +
		`{"id":"c","type":"function","function":{"arguments":"{}"}}]}]}`,
		400, "messages[0].tool_calls[0].function.name", "missing_required_parameter", ""},

	{"temperature too high", body(`"temperature":2.5`), 400, "temperature", "decimal_above_max_value", "Expected a value <= 2, but got 2.5"},
	{"temperature negative", body(`"temperature":-0.1`), 400, "temperature", "decimal_below_min_value", ""},
	{"temperature huge", body(`"temperature":1e400`), 400, "temperature", "decimal_above_max_value", ""},
	{"temperature hugely negative", body(`"temperature":-1e400`), 400, "temperature", "decimal_below_min_value", ""},
	{"temperature string", body(`"temperature":"1"`), 400, "temperature", "invalid_type", "expected a decimal, but got a string"},
	{"top_p too high", body(`"top_p":1.01`), 400, "top_p", "decimal_above_max_value", ""},
	{"presence_penalty low", body(`"presence_penalty":-2.01`), 400, "presence_penalty", "decimal_below_min_value", ""},
	{"frequency_penalty high", body(`"frequency_penalty":3`), 400, "frequency_penalty", "decimal_above_max_value", ""},
	{"max_tokens zero", body(`"max_tokens":0`), 400, "max_tokens", "integer_below_min_value", ""},
	{"max_tokens decimal", body(`"max_tokens":1.5`), 400, "max_tokens", "invalid_type", "expected an integer, but got a decimal number"},
	{"max_tokens overflow", body(`"max_tokens":99999999999999999999`), 400, "max_tokens", "integer_above_max_value", ""},
	{"max_completion_tokens negative", body(`"max_completion_tokens":-1`), 400, "max_completion_tokens", "integer_below_min_value", ""},
	{"max_tokens disagree", body(`"max_tokens":5,"max_completion_tokens":6`), 400, "max_tokens", "invalid_value", "disagree"},
	{"seed decimal", body(`"seed":1.5`), 400, "seed", "invalid_type", ""},
	{"seed overflow", body(`"seed":-99999999999999999999`), 400, "seed", "integer_below_min_value", ""},
	{"stop too many", body(`"stop":["a","b","c","d","e"]`), 400, "stop", "array_above_max_length", ""},
	{"stop element not string", body(`"stop":["a",1]`), 400, "stop[1]", "invalid_type", ""},
	{"stop number", body(`"stop":1`), 400, "stop", "invalid_type", ""},

	{"response_format string", body(`"response_format":"json"`), 400, "response_format", "invalid_type", ""},
	{"response_format no type", body(`"response_format":{}`), 400, "response_format.type", "missing_required_parameter", ""},
	{"response_format bad type", body(`"response_format":{"type":"xml"}`), 400, "response_format.type", "invalid_value", ""},
	{"json_schema missing", body(`"response_format":{"type":"json_schema"}`), 400, "response_format.json_schema", "missing_required_parameter", ""},
	{"json_schema schema missing", body(`"response_format":{"type":"json_schema","json_schema":{"name":"x"}}`),
		400, "response_format.json_schema.schema", "missing_required_parameter", ""},
	{"json_schema schema not object", body(`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":true}}`),
		400, "response_format.json_schema.schema", "invalid_type", ""},
	{"json_schema bad name", body(`"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}`),
		400, "response_format.json_schema.name", "invalid_value", ""},
	{"response_format extra key", body(`"response_format":{"type":"json_object","schema":{}}`),
		400, "response_format.schema", "unknown_parameter", ""},

	{"tools not array", body(`"tools":{}`), 400, "tools", "invalid_type", ""},
	{"tool wrong type", body(`"tools":[{"type":"web_search"}]`), 400, "tools[0].type", "unsupported_value", ""},
	{"custom tool", body(`"tools":[{"type":"custom","custom":{"name":"f"}}]`), 400, "tools[0].type", "unsupported_value", "'custom'"},
	{"tool without function", body(`"tools":[{"type":"function"}]`), 400, "tools[0].function", "missing_required_parameter", ""},
	{"tool without name", body(`"tools":[{"type":"function","function":{}}]`), 400, "tools[0].function.name", "missing_required_parameter", ""},
	{"tool bad name", body(`"tools":[{"type":"function","function":{"name":"get weather"}}]`), 400, "tools[0].function.name", "invalid_value", ""},
	{"tool long name", body(`"tools":[{"type":"function","function":{"name":"` + strings.Repeat("a", 65) + `"}}]`),
		400, "tools[0].function.name", "invalid_value", ""},
	{"tool params not object", body(`"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]`),
		400, "tools[0].function.parameters", "invalid_type", ""},
	{"tool duplicate name", body(`"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]`),
		400, "tools[1].function.name", "invalid_value", "Duplicate"},
	{"tool unknown key", body(`"tools":[{"type":"function","function":{"name":"f","params":{}}}]`),
		400, "tools[0].function.params", "unknown_parameter", ""},
	{"too many tools", body(`"tools":[` + strings.Repeat(`{"type":"function","function":{"name":"f"}},`, 128) +
		`{"type":"function","function":{"name":"f"}}]`), 400, "tools", "array_above_max_length", ""},
	{"tool_choice required without tools", body(`"tool_choice":"required"`), 400, "tool_choice", "invalid_value", "needs at least one tool"},
	{"tool_choice names a missing tool", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}`),
		400, "tool_choice", "invalid_value", "'g' is not among 'tools'"},
	{"tool_choice named without tools", body(`"tool_choice":{"type":"function","function":{"name":"f"}}`),
		400, "tool_choice", "invalid_value", ""},
	{"tool_choice named, wrong type", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"custom","function":{"name":"f"}}`),
		400, "tool_choice.type", "unsupported_value", ""},
	{"allowed_tools names a missing tool", body(`"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"g"}}]}}`),
		400, "tool_choice.allowed_tools.tools", "invalid_value", "'g' is not among 'tools'"},
	{"allowed_tools bad mode", body(`"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"often","tools":[{"type":"function","function":{"name":"f"}}]}}`),
		400, "tool_choice.allowed_tools.mode", "invalid_value", ""},
	{"allowed_tools empty", body(`"tools":[{"type":"function","function":{"name":"f"}}],` +
		`"tool_choice":{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}`),
		400, "tool_choice.allowed_tools.tools", "empty_array", ""},
	{"verbosity unknown", body(`"verbosity":"loud"`), 400, "verbosity", "invalid_value", ""},
	{"moderation", body(`"moderation":{"model":"omni-moderation-latest"}`), 400, "moderation", "unsupported_parameter", "no moderation model"},
	{"template kwargs not an object", body(`"chat_template_kwargs":[]`), 400, "chat_template_kwargs", "invalid_type", ""},
	{"template kwargs thinking not a bool", body(`"chat_template_kwargs":{"enable_thinking":"no"}`), 400, "chat_template_kwargs.enable_thinking", "invalid_type", ""},
	{"prompt cache options not an object", body(`"prompt_cache_options":"x"`), 400, "prompt_cache_options", "invalid_type", ""},
	{"tool_choice named, no function", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function"}`),
		400, "tool_choice.function", "missing_required_parameter", ""},
	{"tool_choice named, unknown key", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f","x":1}}`),
		400, "tool_choice.function.x", "unknown_parameter", ""},
	{"tool_choice name not a string", body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":1}}`),
		400, "tool_choice.function.name", "invalid_type", ""},
	{"tool_choice unknown", body(`"tool_choice":"sometimes"`), 400, "tool_choice", "invalid_value", ""},
	{"tool_choice number", body(`"tool_choice":1`), 400, "tool_choice", "invalid_type", ""},
	{"parallel_tool_calls not bool", body(`"parallel_tool_calls":0`), 400, "parallel_tool_calls", "invalid_type", ""},
	{"functions", body(`"functions":[]`), 400, "functions", "unsupported_parameter", ""},
	{"function_call", body(`"function_call":"auto"`), 400, "function_call", "unsupported_parameter", ""},

	{"stream not bool", body(`"stream":"true"`), 400, "stream", "invalid_type", "expected a boolean, but got a string"},
	{"stream_options without stream", body(`"stream_options":{"include_usage":true}`), 400, "stream_options", "invalid_value", "only allowed when 'stream' is enabled"},
	{"stream_options with stream false", body(`"stream":false,"stream_options":{"include_usage":true}`), 400, "stream_options", "invalid_value", ""},
	{"include_usage not bool", body(`"stream":true,"stream_options":{"include_usage":1}`), 400, "stream_options.include_usage", "invalid_type", ""},
	{"stream_options unknown", body(`"stream":true,"stream_options":{"x":1}`), 400, "stream_options.x", "unknown_parameter", ""},
	{"include_obfuscation true", body(`"stream":true,"stream_options":{"include_obfuscation":true}`), 400, "stream_options.include_obfuscation", "unsupported_value", ""},

	{"n above the cap", body(`"n":9`), 400, "n", "integer_above_max_value", ""},
	{"n not an integer", body(`"n":1.5`), 400, "n", "invalid_type", ""},
	{"n 0", body(`"n":0`), 400, "n", "integer_below_min_value", ""},
	{"logit_bias", body(`"logit_bias":{"50256":-100}`), 400, "logit_bias", "unsupported_parameter", ""},
	{"top_k below -1", body(`"top_k":-2`), 400, "top_k", "integer_below_min_value", ""},
	{"top_k a decimal", body(`"top_k":1.5`), 400, "top_k", "invalid_type", ""},
	{"min_p over 1", body(`"min_p":1.5`), 400, "min_p", "decimal_above_max_value", ""},
	{"repetition_penalty negative", body(`"repetition_penalty":-1`), 400, "repetition_penalty", "decimal_below_min_value", ""},
	{"top_logprobs without logprobs", body(`"top_logprobs":3`), 400, "top_logprobs", "invalid_value", ""},
	{"top_logprobs over 20", body(`"logprobs":true,"top_logprobs":21`), 400, "top_logprobs", "integer_above_max_value", ""},
	{"store true", body(`"store":true`), 400, "store", "unsupported_value", ""},
	{"metadata", body(`"metadata":{"a":"b"}`), 400, "metadata", "unsupported_parameter", ""},
	{"service_tier flex", body(`"service_tier":"flex"`), 400, "service_tier", "unsupported_value", ""},
	{"modalities audio", body(`"modalities":["text","audio"]`), 400, "modalities[1]", "unsupported_value", ""},
	{"audio", body(`"audio":{"voice":"alloy","format":"wav"}`), 400, "audio", "unsupported_parameter", ""},
	{"prediction", body(`"prediction":{"type":"content","content":"x"}`), 400, "prediction", "unsupported_parameter", ""},
	{"reasoning_effort unknown", body(`"reasoning_effort":"extreme"`), 400, "reasoning_effort", "invalid_value", ""},
	{"reasoning_effort not a string", body(`"reasoning_effort":1`), 400, "reasoning_effort", "invalid_type", ""},
	{"web_search_options", body(`"web_search_options":{}`), 400, "web_search_options", "unsupported_parameter", ""},
	{"user not string", body(`"user":1`), 400, "user", "invalid_type", ""},
}

func TestDecodeChatRequestErrors(t *testing.T) {
	for _, tt := range errorTests {
		t.Run(tt.name, func(t *testing.T) {
			got, e := DecodeChatRequest([]byte(tt.body), testModel)
			if e == nil {
				t.Fatalf("decoded %+v, want error", got)
			}
			if got != nil {
				t.Errorf("got request %+v along with error", got)
			}
			if e.Status != tt.status || e.Param != tt.param || e.Code != tt.code {
				t.Errorf("got status %d param %q code %q, want %d %q %q (message %q)",
					e.Status, e.Param, e.Code, tt.status, tt.param, tt.code, e.Message)
			}
			if e.Type != TypeInvalidRequest {
				t.Errorf("type %q, want %q", e.Type, TypeInvalidRequest)
			}
			if e.Message == "" || !strings.Contains(e.Message, tt.msg) {
				t.Errorf("message %q does not contain %q", e.Message, tt.msg)
			}
		})
	}
}

// The decoded request must not share memory with the body: the HTTP server
// reuses its buffers.
func TestDecodeChatRequestDoesNotAliasBody(t *testing.T) {
	b := []byte(`{"model":"` + testModel + `","messages":[{"role":"assistant","content":"c","tool_calls":[` +
		`{"id":"i","type":"function","function":{"name":"n","arguments":"{\"a\":1}"}}]},` +
		`{"role":"tool","tool_call_id":"i","content":"r"}],"stop":"s",` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object"}}},` +
		`"tools":[{"type":"function","function":{"name":"n","description":"d","parameters":{"type":"object"}}}]}`)
	r1, e := DecodeChatRequest(b, testModel)
	if e != nil {
		t.Fatal(e)
	}
	want, _ := DecodeChatRequest(append([]byte(nil), b...), testModel)
	for i := range b {
		b[i] = 'x'
	}
	if !reflect.DeepEqual(r1, want) {
		t.Errorf("request changed when the body was overwritten:\n%#v\n%#v", r1, want)
	}
}

// Errors repeat at most a bounded piece of what was sent: a huge unknown
// key, role or number comes back clipped, once in the message and once in
// param, never whole.
func TestErrorsDoNotEchoUnboundedInput(t *testing.T) {
	huge := strings.Repeat("é", 1<<20)
	for name, body := range map[string]string{
		"unknown key":   `{"model":"m","messages":[{"role":"user","content":"hi"}],"` + huge + `":1}`,
		"role":          `{"model":"m","messages":[{"role":"` + huge + `","content":"hi"}]}`,
		"integer":       `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":` + strings.Repeat("9", 1<<20) + `}`,
		"decimal":       `{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":` + strings.Repeat("9", 1<<20) + `.5}`,
		"part type":     `{"model":"m","messages":[{"role":"user","content":[{"type":"` + huge + `"}]}]}`,
		"nested key":    `{"model":"m","messages":[{"role":"user","content":"hi","` + huge + `":1}]}`,
		"tool_choice":   `{"model":"m","messages":[{"role":"user","content":"hi"}],"tool_choice":"` + huge + `"}`,
		"response type": `{"model":"m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"` + huge + `"}}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, e := DecodeChatRequest([]byte(body), "m")
			if e == nil {
				t.Fatal("accepted")
			}
			out := AppendErrorJSON(nil, e)
			if len(out) > 1024 || !utf8.Valid(out) {
				t.Fatalf("error answer of %d bytes (valid UTF-8: %v): %.200s", len(out), utf8.Valid(out), out)
			}
		})
	}
	if e := ModelNotFound(huge); len(AppendErrorJSON(nil, e)) > 1024 {
		t.Fatal("model_not_found repeats the whole model name")
	}
}

// reasoning_effort asks a reasoning model to think (or not) with an effort
// the runtime understands; "minimal" is the least it offers.
func TestReasoningEffort(t *testing.T) {
	for in, want := range map[string]string{
		`"none"`: llm.ThinkNone, `"minimal"`: llm.ThinkLow, `"low"`: llm.ThinkLow, `"medium"`: llm.ThinkMedium,
		`"high"`: llm.ThinkHigh, `null`: "",
	} {
		r, e := DecodeChatRequest([]byte(`{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}],"reasoning_effort":`+in+`}`), testModel)
		if e != nil {
			t.Fatalf("%s: %v", in, e)
		}
		if r.Runtime.Options.Think != want {
			t.Errorf("%s: think %q, want %q", in, r.Runtime.Options.Think, want)
		}
	}
}
