package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/decode_golden.jsonl from the current decoder")

const goldenFile = "testdata/decode_golden.jsonl"

// goldenCase is one line of goldenFile: a request body and what
// DecodeChatRequest made of it.
type goldenCase struct {
	Body string `json:"body"`
	Want string `json:"want"`
}

// TestDecodeChatRequestGolden pins the decoder's outcome, accepted value or
// exact error, for every body of goldenCorpus, so that a change in which
// error wins or in a decoded value shows up as a diff. The file was first
// written by the decoder that predates the field table.
func TestDecodeChatRequestGolden(t *testing.T) {
	corpus := goldenCorpus()
	if *updateGolden {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		for _, b := range corpus {
			if err := enc.Encode(goldenCase{b, outcome(DecodeChatRequest([]byte(b), testModel))}); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(goldenFile, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(goldenFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []goldenCase
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var c goldenCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("%s:%d: %v", goldenFile, len(cases)+1, err)
		}
		cases = append(cases, c)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	bodies := make([]string, len(cases))
	for i, c := range cases {
		bodies[i] = c.Body
	}
	if !slices.Equal(bodies, corpus) {
		t.Fatalf("%s holds %d bodies, the corpus %d or others: run go test -run Golden -update and review the diff",
			goldenFile, len(bodies), len(corpus))
	}
	for i, c := range cases {
		if got := outcome(DecodeChatRequest([]byte(c.Body), testModel)); got != c.Want {
			t.Errorf("%s:%d: body %s\n got  %s\n want %s", goldenFile, i+1, c.Body, got, c.Want)
		}
	}
}

// outcome renders a decoder result exactly: every field of the request
// (nil and empty slices differ, pointers are followed, raw JSON is kept
// byte for byte), or every field of the error.
func outcome(r *ChatRequest, e *Error) string {
	var sb strings.Builder
	if e != nil {
		fmt.Fprintf(&sb, "%d %s param=%q code=%q %q", e.Status, e.Type, e.Param, e.Code, e.Message)
	} else {
		dump(&sb, reflect.ValueOf(r))
	}
	if (r == nil) == (e == nil) {
		sb.WriteString(" (request and error both set or both nil)")
	}
	return sb.String()
}

func dump(sb *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			sb.WriteString("nil")
			return
		}
		sb.WriteByte('&')
		dump(sb, v.Elem())
	case reflect.Struct:
		// Zero fields are left out: nil, "", false and 0 print nothing,
		// while an empty but non-nil slice prints [].
		sb.WriteByte('{')
		sep := ""
		for i := range v.NumField() {
			if v.Field(i).IsZero() {
				continue
			}
			sb.WriteString(sep + v.Type().Field(i).Name + ":")
			dump(sb, v.Field(i))
			sep = " "
		}
		sb.WriteByte('}')
	case reflect.Slice:
		switch {
		case v.IsNil():
			sb.WriteString("nil")
		case v.Type().Elem().Kind() == reflect.Uint8:
			sb.WriteString(strconv.Quote(string(v.Bytes())))
		default:
			sb.WriteByte('[')
			for i := range v.Len() {
				if i > 0 {
					sb.WriteByte(' ')
				}
				dump(sb, v.Index(i))
			}
			sb.WriteByte(']')
		}
	case reflect.String:
		sb.WriteString(strconv.Quote(v.String()))
	case reflect.Float64:
		sb.WriteString(strconv.FormatFloat(v.Float(), 'g', -1, 64))
	case reflect.Int, reflect.Int64:
		sb.WriteString(strconv.FormatInt(v.Int(), 10))
	case reflect.Bool:
		sb.WriteString(strconv.FormatBool(v.Bool()))
	default:
		panic("outcome: unexpected kind " + v.Kind().String())
	}
}

// goldenTopLevel lists the top-level fields of a chat request. It is test
// data, independent of the decoder's own table on purpose.
var goldenTopLevel = []string{
	"model", "messages", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed",
	"presence_penalty", "frequency_penalty", "response_format", "tools", "tool_choice", "stream",
	"stream_options", "user", "safety_identifier", "prompt_cache_key", "parallel_tool_calls", "n",
	"logit_bias", "logprobs", "top_logprobs", "store", "metadata", "service_tier", "modalities", "audio",
	"prediction", "reasoning_effort", "web_search_options", "functions", "function_call",
	"chat_template_kwargs", "verbosity", "moderation", "prompt_cache_retention", "prompt_cache_options",
}

// goldenValues are JSON values tried for every top-level field: of every
// type, at and beyond the bounds, and the values some fields give meaning.
var goldenValues = []string{
	`null`, `true`, `false`, `0`, `1`, `-1`, `2`, `7`, `20`, `21`, `0.5`, `1.5`, `2.5`, `-2.5`, `-0`, `1e2`,
	`1E400`, `-1e400`, `2147483647`, `2147483648`, `99999999999999999999`, `-99999999999999999999`, ` 3 `,
	`""`, `"x"`, `"auto"`, `"none"`, `"required"`, `"default"`, `"flex"`, `"text"`, `"json"`, `"\u00e9\ud800"`,
	`[]`, `[""]`, `["text"]`, `["audio"]`, `["text","audio"]`, `["","x",""]`, `["a","b","c","d"]`,
	`["a","b","c","d","e"]`, `[1]`, `[null]`, `[{}]`, `{}`, `{"a":1}`, `{"a":null}`, `{"type":"text"}`,
	`{"type":"function","function":{"name":"f"}}`, `{"include_usage":true}`, `{"include_obfuscation":true}`,
}

// goldenBad gives each top-level field a value that is refused, to pin
// which error wins when two fields are wrong.
var goldenBad = map[string]string{
	"model": `"other"`, "messages": `[]`, "temperature": `3`, "top_p": `-1`, "max_tokens": `0`,
	"max_completion_tokens": `1.5`, "stop": `[1]`, "seed": `"1"`, "presence_penalty": `9`,
	"frequency_penalty": `"x"`, "response_format": `{"type":"xml"}`, "tools": `[{}]`, "tool_choice": `"required"`,
	"stream": `1`, "stream_options": `{"include_usage":true}`, "user": `1`, "safety_identifier": `{}`,
	"prompt_cache_key": `[]`, "parallel_tool_calls": `0`, "n": `9`, "logit_bias": `{"1":1}`,
	"logprobs": `true`, "top_logprobs": `3`, "store": `true`, "metadata": `{"a":"b"}`, "service_tier": `"flex"`,
	"modalities": `["audio"]`, "audio": `{}`, "prediction": `{}`, "reasoning_effort": `"extreme"`,
	"web_search_options": `{}`, "functions": `[]`, "function_call": `"auto"`,
	"chat_template_kwargs": `{"enable_thinking":"yes"}`, "verbosity": `"loud"`, "moderation": `{"model":"m"}`,
	"prompt_cache_retention": `1`, "prompt_cache_options": `[]`,
}

// goldenMessages are single messages, tried alone and after a valid one.
var goldenMessages = []string{
	`{}`, `1`, `"hi"`, `[]`, `{"role":null,"content":"x"}`, `{"role":1,"content":"x"}`, `{"role":"bot","content":"x"}`,
	`{"role":"function","content":"x","name":"f"}`, `{"role":"User","content":"x"}`,
	`{"content":"x","foo":1}`, `{"role":"bot","foo":1}`, `{"role":"assistant","content":"","refusal":"r"}`,
	`{"role":"assistant","content":"a","refusal":"r"}`, `{"role":"assistant","content":null,"refusal":1}`,
	`{"role":"assistant","content":[{"type":"refusal","refusal":""}],"refusal":"r"}`,
	`{"role":"tool","tool_call_id":"c","content":"c","foo":1,"name":"n"}`, `{"role":"user","content":1,"foo":1}`,
}

// goldenContent are values tried for the content of every role.
var goldenContent = []string{
	`null`, `"x"`, `""`, `1`, `{}`, `[]`, `["a"]`, `[{}]`,
	`[{"type":"text","text":"a"},{"type":"text","text":"b"}]`, `[{"type":"text","text":1}]`, `[{"type":"text"}]`,
	`[{"type":"text","text":"a","x":1}]`, `[{"type":"refusal","refusal":"r"}]`, `[{"type":"refusal","text":"r"}]`,
	`[{"type":"image_url","image_url":{"url":"u"}}]`, `[{"type":"input_audio"}]`, `[{"type":"file"}]`,
	`[{"type":"video"}]`, `[{"type":1}]`, `[{"type":"text","text":"a"},{"type":"bad","text":"b"}]`,
	`[{"text":"a"}]`, `[{"type":"text","text":null}]`,
	`[{"type":"text","text":"a","prompt_cache_breakpoint":{}}]`, `[{"type":"text","text":"a","prompt_cache_breakpoint":1}]`,
	`[{"type":"text","text":"a","annotations":[]}]`,
}

// goldenToolCalls are values tried for tool_calls of every role.
var goldenToolCalls = []string{
	`null`, `{}`, `[]`, `[1]`, `{"id":"a"}`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":" "}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":"[]"}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":"{\"a\":"}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":" {\"a\":1} "}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":"{} {}"}}]`,
	`[{"id":"c","type":"function","function":{"name":"f"}}]`, `[{"id":"c","type":"function","function":{"arguments":"{}"}}]`,
	`[{"id":"c","type":"function"}]`, `[{"id":"c","type":"custom","function":{}}]`, `[{"type":"function","function":{}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}","x":1}}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":"{}"},"x":1}]`,
	`[{"id":1,"type":2,"function":3}]`, `[{"id":"c","type":"function","function":[]}]`,
	`[{"id":"c","type":"function","function":{"name":"f","arguments":{}}}]`,
}

// goldenScalars are values tried for the other message keys.
var goldenScalars = []string{`null`, `"x"`, `""`, `1`, `true`, `{}`, `[]`}

var goldenRoles = []string{"system", "developer", "user", "assistant", "tool"}

// goldenMessage is a message of role with key set to v and the other
// fields the role requires.
func goldenMessage(role, key, v string) string {
	m := `{"role":"` + role + `"`
	if key != "content" && role != "assistant" {
		m += `,"content":"c"`
	}
	if key != "tool_call_id" && role == "tool" {
		m += `,"tool_call_id":"c"`
	}
	return m + "," + strconv.Quote(key) + ":" + v + "}"
}

// goldenObjects are values for the top-level fields that hold objects or
// arrays of them, each key mapped to values tried one at a time.
var goldenObjects = map[string][]string{
	"response_format": {
		`{"type":"text","x":1}`, `{"type":"json_object"}`, `{"type":"json_object","json_schema":{}}`, `{"type":1}`,
		`{"type":"json_schema"}`, `{"type":"json_schema","json_schema":null}`, `{"type":"json_schema","json_schema":1}`,
		`{"type":"json_schema","json_schema":{}}`, `{"type":"json_schema","json_schema":{"schema":{}}}`,
		`{"type":"json_schema","json_schema":{"schema":{"type":"object"},"name":"a-b_1"}}`,
		`{"type":"json_schema","json_schema":{"schema":{},"name":""}}`,
		`{"type":"json_schema","json_schema":{"schema":{},"name":1}}`,
		`{"type":"json_schema","json_schema":{"schema":{},"description":1}}`,
		`{"type":"json_schema","json_schema":{"schema":{},"strict":"yes"}}`,
		`{"type":"json_schema","json_schema":{"schema":{},"strict":false,"description":"d"}}`,
		`{"type":"json_schema","json_schema":{"schema":[],"name":"a b"}}`,
		`{"type":"json_schema","json_schema":{"schema":{},"x":1,"name":"a b"}}`,
		`{"type":"json_schema","json_schema":{"name":"a b","strict":1}}`,
		`{"type":"json_schema","json_schema":{"schema": { "a" : [1, 2] } }}`,
		`{"type":"json_schema","json_schema":{"schema": { "type" : "array", "items" : { "type" : "string" } } }}`,
		`{"type":"json_schema","json_schema":{"schema":{"type":"string","maxLength":2001}}}`,
		`{"type":"json_schema","json_schema":{"schema":{}},"x":1}`, `{"x":1,"type":"xml"}`,
	},
	"tools": {
		`[{"type":"function","function":{"name":"f","description":"d","parameters":{"type":"object"},"strict":false}}]`,
		`[{"type":"function","function":{"name":"f","parameters":{ "type" : "object" }}}]`,
		`[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"g"}}]`,
		`[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]`,
		`[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f","x":1}}]`,
		`[{"type":"function"}]`, `[{"function":{"name":"f"}}]`, `[{"type":1}]`, `[{"type":"code"}]`,
		`[{"type":"function","function":1}]`, `[{"type":"function","function":{}}]`,
		`[{"type":"function","function":{"name":1}}]`, `[{"type":"function","function":{"name":"a.b"}}]`,
		`[{"type":"function","function":{"name":"f","description":1}}]`,
		`[{"type":"function","function":{"name":"f","strict":1}}]`,
		`[{"type":"function","function":{"name":"f","parameters":"{}"}}]`,
		`[{"type":"function","function":{"name":"f","parameters":null}}]`,
		`[{"type":"function","function":{"name":"a b","x":1,"description":1}}]`,
		`[{"type":"function","function":{"name":"f"},"x":1}]`, `[{"x":1,"type":"code"}]`, `["f"]`,
	},
	"stream_options": {
		`{"include_usage":false}`, `{"include_usage":"yes"}`, `{"include_obfuscation":false}`,
		`{"include_obfuscation":1}`, `{"include_usage":1,"include_obfuscation":true}`, `{"x":1,"include_usage":1}`,
		`{"include_usage":null}`, `[]`, `1`,
	},
	"tool_choice": {
		`"auto"`, `"none"`, `"required"`, `"bogus"`, `{"type":"function","function":{"name":"f"}}`, `{}`, `1`, `[]`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"t"}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"required","tools":[{"type":"function","function":{"name":"t"}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"f"}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"sometimes","tools":[{"type":"function","function":{"name":"t"}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"custom","custom":{"name":"t"}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto","tools":[{"type":"function","function":{"name":"t","x":1}}]}}`,
		`{"type":"allowed_tools","allowed_tools":{"mode":"auto"}}`, `{"type":"allowed_tools"}`,
		`{"type":"custom","custom":{"name":"t"}}`,
	},
	"chat_template_kwargs": {
		`{}`, `{"enable_thinking":false}`, `{"enable_thinking":true}`, `{"thinking":true}`, `{"reasoning_effort":"low"}`,
		`{"reasoning_effort":"lots"}`, `{"enable_thinking":1}`, `{"any":[1,{"x":null}]}`, `[]`,
	},
}

// goldenCorpus builds the bodies TestDecodeChatRequestGolden pins, in a
// fixed order, without duplicates.
func goldenCorpus() []string {
	c := goldenBodies()
	seen := make(map[string]bool, len(c))
	return slices.DeleteFunc(c, func(b string) bool {
		dup := seen[b]
		seen[b] = true
		return dup
	})
}

func goldenBodies() []string {
	var c []string
	for _, tt := range mappingTests {
		c = append(c, tt.body)
	}
	for _, tt := range errorTests {
		c = append(c, tt.body)
	}
	c = append(c, decodeSeeds...)
	for _, f := range goldenTopLevel {
		for _, v := range goldenValues {
			c = append(c, body(strconv.Quote(f)+":"+v))
		}
	}
	// Two refused fields, in both orders in the body.
	for i, f := range goldenTopLevel {
		for _, g := range goldenTopLevel[i+1:] {
			c = append(c, body(fmt.Sprintf("%q:%s,%q:%s", f, goldenBad[f], g, goldenBad[g])))
			c = append(c, body(fmt.Sprintf("%q:[1],%q:[1]", g, f)))
		}
	}
	// A refused field with an unknown one, a missing model or messages.
	for _, f := range goldenTopLevel {
		field := fmt.Sprintf("%q:%s", f, goldenBad[f])
		c = append(c, body(field+`,"zz":1`), `{"messages":[{"role":"user","content":"hi"}],`+field+`}`,
			`{"model":"`+testModel+`",`+field+`}`, `{"model":"other",`+field+`}`)
	}
	for _, m := range goldenMessages {
		c = append(c, messagesBody(m), messagesBody(`{"role":"user","content":"a"},`+m))
	}
	for _, role := range goldenRoles {
		for _, v := range goldenContent {
			c = append(c, messagesBody(goldenMessage(role, "content", v)))
		}
		for _, v := range goldenToolCalls {
			c = append(c, messagesBody(goldenMessage(role, "tool_calls", v)))
		}
		for _, k := range []string{"name", "refusal", "audio", "function_call", "tool_call_id"} {
			for _, v := range goldenScalars {
				c = append(c, messagesBody(goldenMessage(role, k, v)))
			}
		}
		c = append(c, messagesBody(goldenMessage(role, "foo", "1")))
	}
	for _, f := range []string{"response_format", "tools", "stream_options", "tool_choice", "chat_template_kwargs"} {
		for _, v := range goldenObjects[f] {
			field := strconv.Quote(f) + ":" + v
			c = append(c, body(field), body(`"stream":true,`+field),
				body(`"tools":[{"type":"function","function":{"name":"t"}}],`+field))
		}
	}
	c = append(c,
		`{"model":"other","model":"`+testModel+`","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"`+testModel+`","messages":[],"messages":[{"role":"user","content":"hi"}]}`,
		body(`"temperature":5,"temperature":null`), body(`"max_tokens":5,"max_completion_tokens":5.0`),
		body(`"max_tokens":3,"max_completion_tokens":4,"stop":[1]`), body(`"max_tokens":3,"max_completion_tokens":4,"temperature":9`),
		body(`"stream" : true , "stream_options" : { "include_usage" : true } , "stop" : [ "a" , "" ]`),
		body(`"stream":false,"stream_options":{"x":1}`), body(`"stream":"x","stream_options":{}`),
		body(`"reasoning_effort":"none","chat_template_kwargs":{"enable_thinking":true}`),
		body(`"verbosity":"low"`), body(`"verbosity":"high"`), body(`"verbosity":"medium"`),
		`{"model":"`+testModel+`","messages":[{"role":"system","content":"s"},{"role":"user","content":"hi"}],"verbosity":"low"}`,
		body(`"tools":[{"type":"custom","custom":{"name":"t"}}]`),
		messagesBody(`{"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},`+
			`{"id":"a","type":"function","function":{"name":"g","arguments":"{}"}}]},{"role":"tool","tool_call_id":"a","content":"x"}`),
		messagesBody(`{"role":"tool","tool_call_id":"a","content":"x"},{"role":"assistant","tool_calls":[`+
			`{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"a","content":"y"}`),
		messagesBody(`{"role":"user","content":"a\u0000\"\\ \ud83d\ude00 \udc00"}`),
		"\t"+body(`"user":"u"`)+"\r\n",
		`{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}]} x`, `{"a":1`, `1`, `"x"`, `true`, ` `,
	)
	return c
}

func messagesBody(messages string) string {
	return `{"model":"` + testModel + `","messages":[` + messages + `]}`
}
