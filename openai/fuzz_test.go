package openai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

var escapeCases = []string{
	"", "plain ascii", `"quoted" \back\slash/`, "\x00\x01\x1f\x7f", "\b\f\n\r\t",
	"é ü 日本 😀", "\u2028\u2029", "bad \xff\xfe utf8", "\xed\xa0\x80 surrogate",
	"truncated \xe6\x97", "<script>&amp;</script>", "\ufffd literal", "\xc0\xaf overlong",
}

// checkAppendString checks appendString against encoding/json: the output
// is valid JSON, contains no raw control characters or line separators,
// and decodes to what encoding/json's own encoding of s decodes to.
func checkAppendString(t *testing.T, s string) {
	t.Helper()
	out := appendString([]byte("x"), s)
	if out[0] != 'x' {
		t.Fatalf("dst prefix lost")
	}
	out = out[1:]
	if !bytes.Equal(out, appendString(nil, []byte(s))) {
		t.Fatalf("string and []byte encodings differ for %q", s)
	}
	if !json.Valid(out) || !utf8.Valid(out) {
		t.Fatalf("invalid JSON for %q: %q", s, out)
	}
	for _, r := range string(out) {
		if r < 0x20 || r == '\u2028' || r == '\u2029' {
			t.Fatalf("raw %U in encoding of %q: %q", r, s, out)
		}
	}
	var got, want string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	std, _ := json.Marshal(s)
	if err := json.Unmarshal(std, &want); err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("appendString(%q) decodes to %q, encoding/json gives %q", s, got, want)
	}
}

func TestAppendString(t *testing.T) {
	for _, s := range escapeCases {
		checkAppendString(t, s)
	}
	// Spot-check the exact escapes.
	for in, want := range map[string]string{
		"a\"b\\c":   `"a\"b\\c"`,
		"\n\t\x01":  `"\n\t\u0001"`,
		"\u2028x":   `"\u2028x"`,
		"\xffok":    `"\ufffdok"`,
		"é":         `"é"`,
		"\x7f<&>":   "\"\x7f<&>\"",
		"\b\f\r":    `"\b\f\r"`,
		"\xe2\x80":  `"\ufffd\ufffd"`,
		"\u2029end": `"\u2029end"`,
	} {
		if got := string(appendString(nil, in)); got != want {
			t.Errorf("appendString(%q) = %s, want %s", in, got, want)
		}
	}
}

func FuzzAppendString(f *testing.F) {
	for _, s := range escapeCases {
		f.Add(s)
	}
	f.Fuzz(checkAppendString)
}

var decodeSeeds = []string{
	body(""),
	body(`"temperature":0.5,"top_p":1,"max_tokens":10,"stop":["x"],"seed":1,"stream":true,"stream_options":{"include_usage":true}`),
	body(`"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object"}}}`),
	body(`"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"tool_choice":"auto"`),
	`{"model":"` + testModel + `","messages":[{"role":"assistant","tool_calls":[{"id":"c","type":"function",` +
		`"function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c","content":"r"}]}`,
	`{"model":"` + testModel + `","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
	`{"model":"x","messages":[]}`, `[]`, `null`, `{"model":`, `{}`, body(`"foo":1`),
	body(`"verbosity":"low","chat_template_kwargs":{"enable_thinking":false,"x":[1]},"prompt_cache_retention":"24h","prompt_cache_options":{}`),
	body(`"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"allowed_tools","allowed_tools":` +
		`{"mode":"required","tools":[{"type":"function","function":{"name":"f"}}]}}`),
	`{"model":"` + testModel + `","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a",` +
		`"prompt_cache_breakpoint":{}}]}],"verbosity":"high","reasoning_effort":"xhigh"}`,
	body(`"moderation":{"model":"m"}`), body(`"tools":[{"type":"custom","custom":{"name":"c"}}]`),
}

func FuzzDecodeChatRequest(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, e := DecodeChatRequest(b, testModel)
		if (r == nil) == (e == nil) {
			t.Fatalf("got request %v and error %v", r, e)
		}
		if e != nil {
			if e.Status < 400 || e.Status > 499 || e.Message == "" || e.Type == "" {
				t.Fatalf("bad error %+v", e)
			}
			if !json.Valid(AppendErrorJSON(nil, e)) {
				t.Fatalf("error encodes to invalid JSON: %+v", e)
			}
			return
		}
		if r.Model != testModel || len(r.Runtime.Messages) == 0 {
			t.Fatalf("bad request %+v", r)
		}
		if r.IncludeUsage && !r.Stream {
			t.Fatalf("include_usage without stream")
		}
		for _, m := range r.Runtime.Messages {
			if !strings.Contains(" system user assistant tool ", " "+m.Role+" ") {
				t.Fatalf("role %q", m.Role)
			}
			for _, tc := range m.ToolCalls {
				if !json.Valid(tc.Arguments) || tc.Arguments[0] != '{' {
					t.Fatalf("tool call arguments %q", tc.Arguments)
				}
			}
		}
		if r.Runtime.Format != nil && !json.Valid(r.Runtime.Format) {
			t.Fatalf("format %q", r.Runtime.Format)
		}
		for _, tl := range r.Runtime.Tools {
			if !validName(tl.Name) || !json.Valid(tl.Parameters) {
				t.Fatalf("tool %+v", tl)
			}
		}
		if o := r.Runtime.Options; o.MaxTokens != nil && *o.MaxTokens < 1 || len(o.Stop) > maxStop {
			t.Fatalf("options %+v", o)
		}
	})
}

// FuzzMustString checks mustString against encoding/json on every valid
// JSON string literal, with and without surrounding whitespace.
func FuzzMustString(f *testing.F) {
	for _, s := range escapeCases {
		f.Add([]byte(s))
		b, _ := json.Marshal(s)
		f.Add(b[1 : len(b)-1])
	}
	f.Add([]byte(`\u00e9\ud800 \/ \"`))
	f.Fuzz(func(t *testing.T, b []byte) {
		lit := append(append([]byte{'"'}, b...), '"')
		if !json.Valid(lit) {
			return
		}
		var want string
		if err := json.Unmarshal(lit, &want); err != nil {
			t.Fatal(err)
		}
		for _, raw := range [][]byte{lit, append(append([]byte(" \n"), lit...), '\t')} {
			if got := mustString(raw); got != want {
				t.Fatalf("mustString(%q) = %q, encoding/json gives %q", raw, got, want)
			}
		}
	})
}

// FuzzSplitJSON checks splitObject and splitArray against encoding/json's
// decoding into map[string]json.RawMessage and []json.RawMessage on every
// valid JSON document, and that a value they return cannot be appended to
// over its neighbour's bytes.
func FuzzSplitJSON(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, ` { } `, "\t[ ]\n", `{"a":1}`, `[1,"x",null,true,false,{},[]]`,
		`{"a" : {"b":[1,2,{"c":"}"}]} , "d":"\"]}" ,"a":2}`,
		`{"k\u00e9y":"v","\ud800":1,"\"q\"":[]}`, "{\"bad \xff key\":0}",
		`[ -1.5e+3 , 0 , "a\\" , [ [ ] ] ]`, `{"messages":[{"role":"user","content":"hi"}],"n":null}`,
		`"not a container"`, `12`, `null`, `{"a":1,"\u0061":2,"b":null,"a":3}`,
		// Past splitObject's dedupScan: duplicates found through its map.
		`{"a":0,"b":1,"c":2,"d":3,"e":4,"f":5,"g":6,"h":7,"i":8,"j":9,"k":10,"l":11,"m":12,"n":13,"o":14,"p":15,"a":16,"q":17,"p":18,"r":19,"a":20}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if !json.Valid(b) {
			return
		}
		switch kindOf(b) {
		case "object":
			var want map[string]json.RawMessage
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			members := splitObject(b)
			got := make(map[string]json.RawMessage, len(members))
			for _, m := range members {
				if _, dup := got[string(m.key)]; dup {
					t.Fatalf("splitObject(%q) holds %q twice", b, m.key)
				}
				got[string(m.key)] = m.raw
			}
			if members == nil || len(got) != len(want) {
				t.Fatalf("splitObject(%q) = %q, encoding/json gives %q", b, got, want)
			}
			for k, v := range want {
				if g, ok := got[k]; !ok || !bytes.Equal(g, v) || cap(g) != len(g) {
					t.Fatalf("splitObject(%q)[%q] = %q (cap %d), encoding/json gives %q", b, k, g, cap(g), v)
				}
			}
		case "array":
			var want []json.RawMessage
			if err := json.Unmarshal(b, &want); err != nil {
				t.Fatal(err)
			}
			got := splitArray(b)
			if got == nil || len(got) != len(want) {
				t.Fatalf("splitArray(%q) = %q, encoding/json gives %q", b, got, want)
			}
			for i := range want {
				if !bytes.Equal(got[i], want[i]) || cap(got[i]) != len(got[i]) {
					t.Fatalf("splitArray(%q)[%d] = %q (cap %d), encoding/json gives %q", b, i, got[i], cap(got[i]), want[i])
				}
			}
		}
	})
}
