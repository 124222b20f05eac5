package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/ids"
	"github.com/hearthd/hearth/llm"
)

// event checks that b is exactly one SSE data event and returns its
// decoded JSON payload.
func event(t *testing.T, b []byte) map[string]any {
	t.Helper()
	s := string(b)
	if !strings.HasPrefix(s, "data: ") || !strings.HasSuffix(s, "\n\n") {
		t.Fatalf("not a data event: %q", s)
	}
	payload := s[len("data: ") : len(s)-2]
	if strings.ContainsAny(payload, "\r\n") {
		t.Fatalf("payload has a line break, which would split the event: %q", payload)
	}
	return decodeObject(t, []byte(payload))
}

func decodeObject(t *testing.T, b []byte) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("invalid JSON %q: %v", b, err)
	}
	if d.More() {
		t.Fatalf("trailing data after JSON in %q", b)
	}
	return m
}

func keys(v any) []string {
	m, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	return slices.Sorted(maps.Keys(m))
}

func wantKeys(t *testing.T, what string, v any, want ...string) {
	t.Helper()
	slices.Sort(want)
	if got := keys(v); !slices.Equal(got, want) {
		t.Errorf("%s keys = %v, want %v", what, got, want)
	}
}

func wantEq(t *testing.T, what string, got, want any) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func TestChunkEncoderStream(t *testing.T) {
	for _, includeUsage := range []bool{false, true} {
		t.Run(fmt.Sprint("includeUsage=", includeUsage), func(t *testing.T) {
			enc := NewChunkEncoder("chatcmpl-abc", 1700000000, `m"odel`, "fp_1", includeUsage)
			text := "Hé \"q\" \\ \n\t\x00 \u2028 😀"
			calls := []llm.ToolCall{
				{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city": "Oslo"}`)},
				{Name: "now"},
			}
			var dst []byte
			chunks := [][]byte{
				enc.AppendRole(nil),
				enc.AppendContent(nil, text),
				enc.AppendToolCalls(nil, calls, 2),
				enc.AppendFinish(nil, llm.FinishToolCalls),
			}
			for _, c := range chunks {
				dst = append(dst, c...)
			}
			var finalChunks [][]byte
			if includeUsage {
				finalChunks = append(finalChunks, enc.AppendUsage(nil, Usage{Prompt: 11, Completion: 7}))
			}

			for i, c := range chunks {
				m := event(t, c)
				want := []string{"id", "object", "created", "model", "system_fingerprint", "choices"}
				if includeUsage {
					want = append(want, "usage")
					if m["usage"] != nil {
						t.Errorf("chunk %d usage = %v, want null", i, m["usage"])
					}
				}
				wantKeys(t, fmt.Sprint("chunk ", i), m, want...)
				wantEq(t, "id", m["id"], "chatcmpl-abc")
				wantEq(t, "object", m["object"], "chat.completion.chunk")
				wantEq(t, "created", m["created"], "1700000000")
				wantEq(t, "model", m["model"], `m"odel`)
				wantEq(t, "system_fingerprint", m["system_fingerprint"], "fp_1")
				choices, _ := m["choices"].([]any)
				if len(choices) != 1 {
					t.Fatalf("chunk %d has %d choices", i, len(choices))
				}
				wantKeys(t, "choice", choices[0], "index", "delta", "logprobs", "finish_reason")
				ch := choices[0].(map[string]any)
				wantEq(t, "index", ch["index"], "0")
				if ch["logprobs"] != nil {
					t.Errorf("logprobs = %v", ch["logprobs"])
				}
				delta := ch["delta"]
				switch i {
				case 0:
					wantKeys(t, "role delta", delta, "role", "content")
					wantEq(t, "role", delta.(map[string]any)["role"], "assistant")
					wantEq(t, "content", delta.(map[string]any)["content"], "")
				case 1:
					wantKeys(t, "content delta", delta, "content")
					if got := delta.(map[string]any)["content"]; got != text {
						t.Errorf("content = %q, want %q", got, text)
					}
				case 2:
					wantKeys(t, "tool delta", delta, "tool_calls")
					tcs := delta.(map[string]any)["tool_calls"].([]any)
					if len(tcs) != 2 {
						t.Fatalf("%d tool calls", len(tcs))
					}
					for j, tc := range tcs {
						wantKeys(t, "tool call", tc, "index", "id", "type", "function")
						m := tc.(map[string]any)
						wantEq(t, "index", m["index"], fmt.Sprint(2+j))
						wantEq(t, "type", m["type"], "function")
						wantKeys(t, "function", m["function"], "name", "arguments")
						fn := m["function"].(map[string]any)
						wantEq(t, "name", fn["name"], calls[j].Name)
						args, ok := fn["arguments"].(string)
						if !ok {
							t.Fatalf("arguments is %T, want a JSON string", fn["arguments"])
						}
						want := string(calls[j].Arguments)
						if want == "" {
							want = "{}"
						}
						if args != want {
							t.Errorf("arguments = %q, want %q", args, want)
						}
					}
					wantEq(t, "id", tcs[0].(map[string]any)["id"], "call_1")
					if id := tcs[1].(map[string]any)["id"].(string); !strings.HasPrefix(id, "call_") || len(id) != 29 {
						t.Errorf("generated tool call id %q", id)
					}
				case 3:
					wantKeys(t, "finish delta", delta)
				}
				wantFinish := any(nil)
				if i == 3 {
					wantFinish = "tool_calls"
				}
				if ch["finish_reason"] != wantFinish {
					t.Errorf("chunk %d finish_reason = %v, want %v", i, ch["finish_reason"], wantFinish)
				}
			}

			for _, c := range finalChunks {
				m := event(t, c)
				wantKeys(t, "usage chunk", m, "id", "object", "created", "model", "system_fingerprint", "choices", "usage")
				if ch, ok := m["choices"].([]any); !ok || len(ch) != 0 {
					t.Errorf("usage chunk choices = %v, want []", m["choices"])
				}
				wantKeys(t, "usage", m["usage"], "prompt_tokens", "completion_tokens", "total_tokens")
				u := m["usage"].(map[string]any)
				wantEq(t, "prompt_tokens", u["prompt_tokens"], "11")
				wantEq(t, "completion_tokens", u["completion_tokens"], "7")
				wantEq(t, "total_tokens", u["total_tokens"], "18")
			}

			if got := string(enc.AppendDone([]byte("x"))); got != "xdata: [DONE]\n\n" {
				t.Errorf("AppendDone = %q", got)
			}
			// Appending keeps what dst already holds.
			if got := enc.AppendContent([]byte("prefix"), "a"); !bytes.HasPrefix(got, []byte("prefixdata: ")) {
				t.Errorf("AppendContent dropped dst: %q", got)
			}
		})
	}
}

// One chunk byte for byte, so the field order matches OpenAI's.
func TestChunkEncoderExactBytes(t *testing.T) {
	enc := NewChunkEncoder("chatcmpl-1", 5, "m", "", false)
	want := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","system_fingerprint":null,` +
		`"choices":[{"index":0,"delta":{"content":"hi"},"logprobs":null,"finish_reason":null}]}` + "\n\n"
	if got := string(enc.AppendContent(nil, "hi")); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	enc = NewChunkEncoder("chatcmpl-1", 5, "m", "fp", true)
	want = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","system_fingerprint":"fp",` +
		`"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n"
	if got := string(enc.AppendFinish(nil, "stop")); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestChunkEncoderError(t *testing.T) {
	enc := NewChunkEncoder("chatcmpl-1", 5, "m", "fp", true)
	m := event(t, enc.AppendError(nil, Unavailable("gone\nnow")))
	wantKeys(t, "error event", m, "error")
	wantKeys(t, "error", m["error"], "message", "type", "param", "code")
	e := m["error"].(map[string]any)
	wantEq(t, "message", e["message"], "gone\nnow")
	wantEq(t, "type", e["type"], "server_error")
	if e["param"] != nil || e["code"] != nil {
		t.Errorf("param/code = %v/%v, want null", e["param"], e["code"])
	}
}

func TestAppendErrorJSON(t *testing.T) {
	got := string(AppendErrorJSON(nil, InvalidRequest("messages[0].role", `bad "role"`)))
	want := `{"error":{"message":"bad \"role\"","type":"invalid_request_error","param":"messages[0].role","code":null}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	got = string(AppendErrorJSON(nil, ModelNotFound("x")))
	want = "{\"error\":{\"message\":\"The model `x` does not exist or you do not have access to it.\"," +
		`"type":"invalid_request_error","param":null,"code":"model_not_found"}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestErrorConstructors(t *testing.T) {
	tests := []struct {
		e            *Error
		status       int
		typ, code    string
		msgSubstring string
	}{
		{InvalidRequest("p", "m"), 400, "invalid_request_error", "", "m"},
		{ModelNotFound("gpt-4o"), 404, "invalid_request_error", "model_not_found", "`gpt-4o`"},
		{InvalidAPIKey(), 401, "invalid_request_error", "invalid_api_key", "Incorrect API key provided"},
		{RequestTooLarge(1 << 20), 413, "invalid_request_error", "request_too_large", "1048576 bytes"},
		{RateLimited(""), 429, "requests", "rate_limit_exceeded", "Rate limit"},
		{RateLimited("busy"), 429, "requests", "rate_limit_exceeded", "busy"},
		{Unavailable(""), 503, "server_error", "", "not available"},
		{Timeout(), 504, "server_error", "timeout", "in time"},
		{InternalError(), 500, "server_error", "", "error"},
		{NotFound("POST", "/api/v1/foo"), 404, "invalid_request_error", "", "Invalid URL (POST /api/v1/foo)"},
		{MethodNotAllowed("GET", "/api/v1/chat/completions"), 405, "invalid_request_error", "", "GET"},
	}
	for _, tt := range tests {
		if tt.e.Status != tt.status || tt.e.Type != tt.typ || tt.e.Code != tt.code || !strings.Contains(tt.e.Message, tt.msgSubstring) {
			t.Errorf("%+v: want status %d type %q code %q message containing %q", tt.e, tt.status, tt.typ, tt.code, tt.msgSubstring)
		}
		if s := tt.e.Error(); !strings.Contains(s, fmt.Sprint(tt.status)) || !strings.Contains(s, tt.e.Message) {
			t.Errorf("Error() = %q", s)
		}
		m := decodeObject(t, AppendErrorJSON(nil, tt.e))
		wantKeys(t, "error body", m["error"], "message", "type", "param", "code")
	}
}

func TestRuntimeError(t *testing.T) {
	tests := []struct {
		err    error
		status int
		msg    string
	}{
		{&llm.InvalidRequestError{Msg: "bad schema"}, 400, "bad schema"},
		{fmt.Errorf("chat: %w", &llm.InvalidRequestError{Msg: "bad schema"}), 400, "bad schema"},
		{fmt.Errorf("chat: %w", llm.ErrTimeout), 504, ""},
		{context.DeadlineExceeded, 504, ""},
		{fmt.Errorf("dial: %w", llm.ErrUnavailable), 503, ""},
		{errors.New("secret internal detail"), 500, ""},
	}
	for _, tt := range tests {
		e := RuntimeError(tt.err)
		if e.Status != tt.status || !strings.Contains(e.Message, tt.msg) {
			t.Errorf("RuntimeError(%v) = %+v, want status %d", tt.err, e, tt.status)
		}
		if tt.status >= 500 && strings.Contains(e.Message, "secret") {
			t.Errorf("internal detail leaked: %q", e.Message)
		}
	}
}

func TestAppendCompletion(t *testing.T) {
	t.Run("content", func(t *testing.T) {
		b := AppendCompletion(nil, "chatcmpl-1", 9, "m", "fp", Reply{Content: "Hello \"world\"\n"}, "stop", Usage{Prompt: 3, Completion: 4})
		m := decodeObject(t, b)
		wantKeys(t, "completion", m, "id", "object", "created", "model", "system_fingerprint", "choices", "usage")
		wantEq(t, "object", m["object"], "chat.completion")
		wantEq(t, "created", m["created"], "9")
		ch := m["choices"].([]any)
		if len(ch) != 1 {
			t.Fatalf("%d choices", len(ch))
		}
		wantKeys(t, "choice", ch[0], "index", "message", "logprobs", "finish_reason")
		c := ch[0].(map[string]any)
		wantEq(t, "finish_reason", c["finish_reason"], "stop")
		wantKeys(t, "message", c["message"], "role", "content", "refusal")
		msg := c["message"].(map[string]any)
		wantEq(t, "role", msg["role"], "assistant")
		if msg["content"] != "Hello \"world\"\n" || msg["refusal"] != nil {
			t.Errorf("message = %v", msg)
		}
		u := m["usage"].(map[string]any)
		wantEq(t, "usage", []any{u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]}, []any{3, 4, 7})
	})
	t.Run("tool calls only", func(t *testing.T) {
		calls := []llm.ToolCall{{ID: "call_a", Name: "f", Arguments: json.RawMessage(`{"x":[1,2]}`)}, {ID: "call_b", Name: "g"}}
		b := AppendCompletion(nil, "chatcmpl-1", 9, "m", "", Reply{ToolCalls: calls}, "tool_calls", Usage{Prompt: 3, Completion: 4})
		m := decodeObject(t, b)
		if m["system_fingerprint"] != nil {
			t.Errorf("system_fingerprint = %v, want null", m["system_fingerprint"])
		}
		c := m["choices"].([]any)[0].(map[string]any)
		wantKeys(t, "message", c["message"], "role", "content", "tool_calls", "refusal")
		msg := c["message"].(map[string]any)
		if v, ok := msg["content"]; !ok || v != nil {
			t.Errorf("content = %v, want null", v)
		}
		tcs := msg["tool_calls"].([]any)
		if len(tcs) != 2 {
			t.Fatalf("%d tool calls", len(tcs))
		}
		for i, tc := range tcs {
			wantKeys(t, "tool call", tc, "id", "type", "function")
			fn := tc.(map[string]any)["function"].(map[string]any)
			wantEq(t, "name", fn["name"], calls[i].Name)
		}
		wantEq(t, "args", tcs[0].(map[string]any)["function"].(map[string]any)["arguments"], `{"x":[1,2]}`)
		wantEq(t, "args", tcs[1].(map[string]any)["function"].(map[string]any)["arguments"], `{}`)
	})
	t.Run("empty content without tool calls is a string", func(t *testing.T) {
		m := decodeObject(t, AppendCompletion(nil, "i", 1, "m", "", Reply{}, "length", Usage{}))
		msg := m["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)
		if msg["content"] != "" {
			t.Errorf("content = %#v, want \"\"", msg["content"])
		}
	})
}

func TestModels(t *testing.T) {
	want := `{"object":"list","data":[{"id":"llama3.2:1b","object":"model","created":42,"owned_by":"hearth"}]}`
	if got := string(AppendModelList(nil, "llama3.2:1b", 42, "hearth", ModelInfo{})); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	m := decodeObject(t, AppendModel(nil, `a"b`, 1, "o", ModelInfo{}))
	wantKeys(t, "model", m, "id", "object", "created", "owned_by")
	wantEq(t, "id", m["id"], `a"b`)
	// What the runtime says of the model rides along when known.
	m = decodeObject(t, AppendModel(nil, "m", 1, "o", ModelInfo{ContextLength: 4096, Capabilities: []string{"completion", "to\"ols"}}))
	wantKeys(t, "model", m, "id", "object", "created", "owned_by", "context_length", "capabilities")
	wantEq(t, "context_length", m["context_length"], float64(4096))
	if c := m["capabilities"].([]any); len(c) != 2 || c[1] != `to"ols` {
		t.Errorf("capabilities %#v", c)
	}
}

func TestNewCompletionID(t *testing.T) {
	seen := map[string]bool{}
	counts := map[rune]int{}
	for range 1000 {
		id := NewCompletionID()
		rest, ok := strings.CutPrefix(id, "chatcmpl-")
		if !ok || len(rest) != 29 {
			t.Fatalf("bad id %q", id)
		}
		for _, r := range rest {
			if !strings.ContainsRune(ids.Alphabet, r) {
				t.Fatalf("id %q has %q outside base62", id, r)
			}
			counts[r]++
		}
		if seen[id] {
			t.Fatalf("duplicate id %q", id)
		}
		seen[id] = true
	}
	// 29000 draws over 62 symbols: every symbol appears (expected ~468 each).
	if len(counts) != 62 {
		t.Errorf("only %d distinct characters used", len(counts))
	}
}

func TestAppendContentDoesNotAllocate(t *testing.T) {
	enc := NewChunkEncoder(NewCompletionID(), 1700000000, "llama3.2:1b", "fp_hearth", true)
	buf := make([]byte, 0, 4096)
	allocs := testing.AllocsPerRun(100, func() {
		buf = enc.AppendContent(buf[:0], " token\n\"é\"\u2028\xff")
	})
	if allocs != 0 {
		t.Errorf("AppendContent allocates %v times per call", allocs)
	}
}

// Logprobs come out in OpenAI's shape, in complete answers and in chunks;
// a token the model rules out gets the -9999 floor, never an invalid -Inf.
func TestLogprobsEncoding(t *testing.T) {
	lp := []llm.TokenLogprob{
		{Token: " hi", Logprob: -0.25, Bytes: []byte(" hi"), TopLogprobs: []llm.TopLogprob{{Token: " hi", Logprob: -0.25, Bytes: []byte(" hi")}, {Token: " yo", Logprob: math.Inf(-1), Bytes: []byte(" yo")}}},
		{Token: "é", Logprob: -1e-7, Bytes: []byte("é")},
	}
	want := `{"content":[{"token":" hi","logprob":-0.25,"bytes":[32,104,105],"top_logprobs":[{"token":" hi","logprob":-0.25,"bytes":[32,104,105]},{"token":" yo","logprob":-9999,"bytes":[32,121,111]}]},` +
		`{"token":"é","logprob":-1e-07,"bytes":[195,169],"top_logprobs":[]}],"refusal":null}`
	full := decodeObject(t, AppendCompletion(nil, "i", 1, "m", "", Reply{Content: " hié", Logprobs: &lp}, "stop", Usage{Prompt: 1, Completion: 2}))
	same := func(what string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		var got, w any
		_ = json.Unmarshal(b, &got)
		_ = json.Unmarshal([]byte(want), &w)
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%s logprobs\n got %s\nwant %s", what, b, want)
		}
	}
	same("completion", full["choices"].([]any)[0].(map[string]any)["logprobs"])
	enc := NewChunkEncoder("c", 1, "m", "", false)
	chunk := enc.AppendContentLogprobs(nil, " hié", lp)
	body := strings.TrimSuffix(strings.TrimPrefix(string(chunk), "data: "), "\n\n")
	var obj map[string]any
	if err := json.Unmarshal([]byte(body), &obj); err != nil {
		t.Fatalf("chunk %s: %v", chunk, err)
	}
	same("chunk", obj["choices"].([]any)[0].(map[string]any)["logprobs"])
	if none := decodeObject(t, AppendCompletion(nil, "i", 1, "m", "", Reply{Content: "x"}, "stop", Usage{Prompt: 1, Completion: 2})); none["choices"].([]any)[0].(map[string]any)["logprobs"] != nil {
		t.Fatal("logprobs not asked for, but sent")
	}
}

// A choice's encoder differs from choice 0's only in the index, byte for
// byte; usage and [DONE] are the completion's.
func TestChunkEncoderForChoice(t *testing.T) {
	enc := NewChunkEncoder("chatcmpl-1", 5, "m", "fp", true)
	if enc.ForChoice(0) != enc {
		t.Error("ForChoice(0) is not the encoder itself")
	}
	c3 := enc.ForChoice(3)
	for name, pair := range map[string][2][]byte{
		"role":    {enc.AppendRole(nil), c3.AppendRole(nil)},
		"content": {enc.AppendContent(nil, "hi"), c3.AppendContent(nil, "hi")},
		"finish":  {enc.AppendFinish(nil, "length"), c3.AppendFinish(nil, "length")},
		"tools": {enc.AppendToolCalls(nil, []llm.ToolCall{{ID: "call_1", Name: "f", Arguments: json.RawMessage(`{}`)}}, 0),
			c3.AppendToolCalls(nil, []llm.ToolCall{{ID: "call_1", Name: "f", Arguments: json.RawMessage(`{}`)}}, 0)},
	} {
		want := strings.Replace(string(pair[0]), `"choices":[{"index":0,`, `"choices":[{"index":3,`, 1)
		if string(pair[1]) != want {
			t.Errorf("%s: got  %s\nwant %s", name, pair[1], want)
		}
		ev := event(t, pair[1])
		wantEq(t, name+" index", ev["choices"].([]any)[0].(map[string]any)["index"], 3)
	}
	if !bytes.Equal(c3.AppendUsage(nil, Usage{Prompt: 1, Completion: 2}), enc.AppendUsage(nil, Usage{Prompt: 1, Completion: 2})) {
		t.Error("usage chunk differs between choices")
	}
	buf := make([]byte, 0, 4096)
	if allocs := testing.AllocsPerRun(100, func() { buf = c3.AppendContent(buf[:0], " token") }); allocs != 0 {
		t.Errorf("AppendContent of choice 3 allocates %v times per call", allocs)
	}
}

func TestAppendCompletionChoices(t *testing.T) {
	choices := []Choice{
		{Reply: Reply{Content: "a"}, Finish: "stop"},
		{Reply: Reply{ToolCalls: []llm.ToolCall{{ID: "call_1", Name: "f", Arguments: json.RawMessage(`{"x":1}`)}}}, Finish: "tool_calls"},
		{Reply: Reply{Content: "c"}, Finish: "length"},
	}
	m := decodeObject(t, AppendCompletionChoices(nil, "chatcmpl-1", 9, "m", "fp", choices, Usage{Prompt: 3, Completion: 12}))
	cs := m["choices"].([]any)
	if len(cs) != 3 {
		t.Fatalf("%d choices", len(cs))
	}
	for i, c := range cs {
		c := c.(map[string]any)
		wantEq(t, "index", c["index"], i)
		wantEq(t, "finish_reason", c["finish_reason"], choices[i].Finish)
	}
	wantEq(t, "content of the tool call", cs[1].(map[string]any)["message"].(map[string]any)["content"], nil)
	wantEq(t, "usage", m["usage"], map[string]any{"prompt_tokens": json.Number("3"), "completion_tokens": json.Number("12"), "total_tokens": json.Number("15")})
	// One choice is AppendCompletion, byte for byte.
	one := AppendCompletionChoices(nil, "i", 1, "m", "", choices[:1], Usage{Prompt: 1})
	if want := AppendCompletion(nil, "i", 1, "m", "", choices[0].Reply, "stop", Usage{Prompt: 1}); !bytes.Equal(one, want) {
		t.Errorf("got  %s\nwant %s", one, want)
	}
}
