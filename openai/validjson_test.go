package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

// chatBody is a small chat request as clients send it.
const chatBody = `{"model":"m","messages":[{"role":"user","content":"hi \u00e9\n"}],"stream":true,"max_tokens":16,"temperature":0.7}`

// chatBody2K is a chat request of about 2 KB: a system prompt, a few turns
// with escapes and non-ASCII text, a tool and sampling options.
var chatBody2K = func() string {
	var sb strings.Builder
	sb.WriteString(`{"model":"llama-3.1-8b-instruct","messages":[`)
	sb.WriteString(`{"role":"system","content":"You are a helpful assistant. Answer briefly and cite sources where you can.\nDo not make things up; say \"I don't know\" instead."},`)
	for i := range 4 {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"role":"user","content":"Could you explain how a hash map handles collisions? I've read about chaining and open addressing — which one does Go use, and why? Café ünïcödé 日本語 \ud83d\ude00."},`)
		sb.WriteString(`{"role":"assistant","content":"Go's map uses buckets of 8 slots with overflow chaining.\n\n* Lookup hashes the key,\n* picks a bucket,\n* and compares the top hash byte first.\t(\\o/)"}`)
	}
	sb.WriteString(`],"tools":[{"type":"function","function":{"name":"search","description":"Search the web","parameters":{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer","minimum":1,"maximum":10}},"required":["q"]}}}],`)
	sb.WriteString(`"stream":true,"max_tokens":512,"temperature":0.7,"top_p":0.95,"seed":-12345,"presence_penalty":0,"frequency_penalty":1e-2,"stop":["\n\n",null],"logprobs":false}`)
	return sb.String()
}()

func nest(open, close string, n int) string {
	return strings.Repeat(open, n) + strings.Repeat(close, n)
}

// nestObjects returns n objects nested as {"a":{"a":...{}}}.
func nestObjects(n int) string {
	return strings.Repeat(`{"a":`, n-1) + "{}" + strings.Repeat("}", n-1)
}

var validJSONCases = []struct {
	in   string
	want bool
}{
	// Empty and whitespace.
	{"", false},
	{" ", false},
	{" \t\r\n", false},
	{" \t\r\n1 \t\r\n", true},
	{"\v1", false},
	{"1\v", false},
	{"\f1", false},
	{"\u00a01", false},
	{"1\u00a0", false},
	{"\x001", false},
	{"1\x00", false},
	{"\ufeff{}", false}, // a byte order mark is no whitespace either

	// Literals.
	{"true", true},
	{"false", true},
	{"null", true},
	{"tru", false},
	{"t", false},
	{"nul", false},
	{"fals", false},
	{"True", false},
	{"NULL", false},
	{"truex", false},
	{"true1", false},
	{"nulll", false},
	{"[true,false,null]", true},
	{"[truefalse]", false},
	{"NaN", false},
	{"Infinity", false},
	{"undefined", false},

	// Numbers.
	{"0", true},
	{"-0", true},
	{"1", true},
	{"-1", true},
	{"123456789012345678901234567890", true},
	{"0e5", true},
	{"0E5", true},
	{"0.0", true},
	{"-0.0e-0", true},
	{"1E+2", true},
	{"1e-2", true},
	{"1.5e10", true},
	{"1.25", true},
	{"01", false},
	{"-01", false},
	{"00", false},
	{"-", false},
	{"--1", false},
	{"+1", false},
	{"1.", false},
	{"1.e3", false},
	{".1", false},
	{"-.1", false},
	{"1e", false},
	{"1e+", false},
	{"1e-", false},
	{"1E", false},
	{"1e+-2", false},
	{"1e2.5", false},
	{"1.2.3", false},
	{"0x10", false},
	{"1_000", false},
	{"- 1", false},
	{"[-]", false},
	{"[1.]", false},
	{"[01]", false},
	{"[1e]", false},
	{"[1,-0,2e3]", true},
	{`{"a":-}`, false},

	// Strings.
	{`""`, true},
	{`"abc"`, true},
	{`"`, false},
	{`"abc`, false},
	{`"abc\"`, false},
	{`"\\"`, true},
	{`"\"\\\/\b\f\n\r\t"`, true},
	{`"\u0000\u00e9\u00E9\uFFFF\uabcd\uDEAD"`, true},
	{`"\ud83d\ude00"`, true},
	{`"\ud800"`, true}, // a lone surrogate escape is still valid syntax
	{`"\u"`, false},
	{`"\u12"`, false},
	{`"\u123"`, false},
	{`"\u123g"`, false},
	{`"\uG000"`, false},
	{`"\U0041"`, false},
	{`"\a"`, false},
	{`"\v"`, false},
	{`"\x41"`, false},
	{`"\0"`, false},
	{`"\'"`, false},
	{`"\ "`, false},
	{`"\`, false},
	{`"\u00`, false},
	{"\"a\x00b\"", false},
	{"\"a\x1fb\"", false},
	{"\"a\nb\"", false},
	{"\"a\tb\"", false},
	{"\"a\x7fb\"", true},
	{"\"é 日本 😀\"", true},
	{"\"\xff\"", true},           // invalid UTF-8 is accepted
	{"\"\xc0\xaf\"", true},       // an overlong encoding too
	{"\"\xed\xa0\x80\"", true},   // an encoded surrogate too
	{"\"trunc \xe6\x97\"", true}, // a truncated sequence too
	{"\"01234567\xff89abcdef\"", true},
	{"\xff", false},                // but not outside a string
	{"\"0123456789abcdef\"", true}, // strings crossing 8-byte blocks
	{"\"0123456\"789abcdef\"", false},
	{"\"0123456\\\"789abcdef\"", true},
	{"\"012345678\x1f9abcdef\"", false},
	{"\"0123456789abcde\\", false},
	{"\"0123456789abcdef", false},
	{`'a'`, false},

	// Arrays.
	{"[]", true},
	{" [ ] ", true},
	{"[1]", true},
	{"[1,2]", true},
	{"[ 1 , 2 ]", true},
	{"[[],[[]],{}]", true},
	{"[", false},
	{"]", false},
	{"[1", false},
	{"[1,", false},
	{"[1,]", false},
	{"[,1]", false},
	{"[,]", false},
	{"[1 2]", false},
	{"[1;2]", false},
	{"[}", false},
	{"[1}", false},
	{"[[]", false},
	{"[]]", false},

	// Objects.
	{"{}", true},
	{" { } ", true},
	{`{"a":1}`, true},
	{`{ "a" : 1 , "b" : [ ] }`, true},
	{`{"a":1,"a":2}`, true}, // duplicate keys are valid syntax
	{`{"":""}`, true},
	{`{"a\u0000":{"b":null}}`, true},
	{`{`, false},
	{`}`, false},
	{`{"a"`, false},
	{`{"a":`, false},
	{`{"a":1`, false},
	{`{"a":1,`, false},
	{`{"a":1,}`, false},
	{`{,"a":1}`, false},
	{`{"a" 1}`, false},
	{`{"a"=1}`, false},
	{`{"a"::1}`, false},
	{`{"a":1 "b":2}`, false},
	{`{"a":1;"b":2}`, false},
	{`{a:1}`, false},
	{`{1:1}`, false},
	{`{null:1}`, false},
	{`{true:1}`, false},
	{`{[]:1}`, false},
	{`{{}:1}`, false},
	{`{'a':1}`, false},
	{`{"a":1]`, false},
	{`{"a"}`, false},
	{`{"a",1}`, false},
	{`{"a":}`, false},

	// Trailing garbage and more than one value.
	{"1 2", false},
	{"{}{}", false},
	{"[][]", false},
	{`{} {}`, false},
	{`"a""b"`, false},
	{"true false", false},
	{"{}x", false},
	{"{},", false},
	{"[]]", false},
	{"{}}", false},
	{"1,", false},
	{"{} \n", true},
	{"//c\n{}", false},
	{"{}/*c*/", false},

	// Nesting: encoding/json allows 10000 levels, arrays and objects
	// counted alike, an empty container included.
	{nest("[", "]", 64), true},
	{nest("[", "]", 65), true},
	{nest("[", "]", 10000), true},
	{nest("[", "]", 10001), false},
	{nest("[", "", 10001), false},
	{nest("[", "]", 10000) + "]", false},
	{"[" + nest("[", "]", 9999) + ",1]", true},
	{nestObjects(10000), true},
	{nestObjects(10001), false},
	{strings.Repeat(`[{"a":`, 5000) + "0" + strings.Repeat("}]", 5000), true},
	{strings.Repeat(`[{"a":`, 5000) + "[]" + strings.Repeat("}]", 5000), false},
	{strings.Repeat(`{"a":[`, 5000) + "1" + strings.Repeat("]}", 5000), true},
	{strings.Repeat(`{"a":[`, 5000) + "{}" + strings.Repeat("]}", 5000), false},
	// The limit is on depth, not on the number of containers.
	{"[" + strings.Repeat("[],", 20000) + "[]]", true},

	// Requests.
	{chatBody, true},
	{chatBody[:len(chatBody)-1], false},
}

func TestValidJSON(t *testing.T) {
	for _, c := range validJSONCases {
		got, std := validJSON([]byte(c.in)), json.Valid([]byte(c.in))
		if got != c.want || std != c.want {
			in := c.in
			if len(in) > 64 {
				in = in[:32] + "…" + in[len(in)-32:]
			}
			t.Errorf("%q (%d bytes): validJSON %v, json.Valid %v, want %v", in, len(c.in), got, std, c.want)
		}
	}
	if !validJSON([]byte(chatBody2K)) || !json.Valid([]byte(chatBody2K)) {
		t.Errorf("chatBody2K invalid")
	}
}

// TestValidJSONPrefixes checks every prefix of a request: all but the
// whole body are invalid, and validJSON says so wherever it is cut.
func TestValidJSONPrefixes(t *testing.T) {
	for _, body := range []string{chatBody, chatBody2K} {
		for n := range len(body) + 1 {
			if got, want := validJSON([]byte(body[:n])), json.Valid([]byte(body[:n])); got != want {
				t.Errorf("%q: validJSON %v, json.Valid %v", body[:n], got, want)
			}
		}
	}
}

// TestValidJSONStringBytes puts every byte, and pairs of bytes near the
// ones scanString's 8-byte masks look for, at every offset of a string's
// first blocks, where a borrow from one byte could hide or fake another.
func TestValidJSONStringBytes(t *testing.T) {
	check := func(b []byte) {
		t.Helper()
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("%q: validJSON %v, json.Valid %v", b, got, want)
		}
	}
	near := []byte{0x00, 0x01, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x5b, 0x5c, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff}
	for p := range 17 {
		b := []byte(`"` + strings.Repeat("a", 20) + `"`)
		for c := range 256 {
			b[1+p] = byte(c)
			check(b)
		}
		for _, c := range near {
			for _, d := range near {
				b[1+p], b[2+p] = c, d
				check(b)
			}
		}
	}
}

func TestValidJSONAllocs(t *testing.T) {
	for _, body := range []string{chatBody, chatBody2K, nest("[", "]", 64)} {
		b := []byte(body)
		if n := testing.AllocsPerRun(100, func() { validJSON(b) }); n != 0 {
			t.Errorf("%d allocations for %d bytes", int(n), len(b))
		}
	}
}

func FuzzValidJSON(f *testing.F) {
	for _, c := range validJSONCases {
		// The deeply nested cases, tens of KB, stay in TestValidJSON:
		// as seeds they slow every execution, and minimizing a new
		// input grown from one can stall the fuzzer for a minute.
		if len(c.in) <= 4<<10 {
			f.Add([]byte(c.in))
		}
	}
	f.Add([]byte(chatBody))
	f.Add([]byte(chatBody2K))
	f.Fuzz(func(t *testing.T, b []byte) {
		if got, want := validJSON(b), json.Valid(b); got != want {
			t.Fatalf("%q: validJSON %v, json.Valid %v", b, got, want)
		}
	})
}

func BenchmarkValidJSON(b *testing.B) {
	for _, body := range []struct{ name, body string }{
		{"chat", chatBody},
		{"chat2K", chatBody2K},
	} {
		data := []byte(body.body)
		b.Run(body.name+"/std", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if !json.Valid(data) {
					b.Fatal("invalid")
				}
			}
		})
		b.Run(body.name+"/hand", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if !validJSON(data) {
					b.Fatal("invalid")
				}
			}
		})
	}
}
