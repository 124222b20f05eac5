package openai

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/hearthd/hearth/llm"
)

func TestDocTablesMatchEmbeddingAndCompletionFields(t *testing.T) {
	for _, tc := range []struct {
		header string
		code   []string
	}{
		{"embeddings field", embeddingsFields.names()},
		{"completions field", completionFields.names()},
	} {
		doc, _ := docTableOf(t, tc.header)
		if !reflect.DeepEqual(sorted(doc), sorted(tc.code)) {
			t.Errorf("%s: the doc table lists\n%v\nthe decoder knows\n%v", tc.header, sorted(doc), sorted(tc.code))
		}
	}
}

func sorted(s []string) []string {
	return slices.Sorted(slices.Values(s))
}

func embBody(extra string) string {
	b := `{"model":"` + testModel + `"`
	if extra != "" {
		b += "," + extra
	}
	return b + "}"
}

func TestDecodeEmbeddingsRequest(t *testing.T) {
	many := `"input":[` + strings.Repeat(`"a",`, MaxEmbeddingInputs) + `"a"]`
	cases := []struct {
		name  string
		body  string
		want  *EmbeddingsRequest
		param string // the 400's param, when an error is expected
		code  string
	}{
		{"string", embBody(`"input":"hello"`), &EmbeddingsRequest{Model: testModel, Runtime: llm.EmbedRequest{Input: []string{"hello"}}}, "", ""},
		{"array", embBody(`"input":["a","b"],"encoding_format":"base64","dimensions":8,"user":"u"`),
			&EmbeddingsRequest{Model: testModel, Base64: true, Runtime: llm.EmbedRequest{Input: []string{"a", "b"}, Dimensions: 8}}, "", ""},
		{"float explicit", embBody(`"input":"x","encoding_format":"float"`), &EmbeddingsRequest{Model: testModel, Runtime: llm.EmbedRequest{Input: []string{"x"}}}, "", ""},
		{"null dimensions is absent", embBody(`"input":"x","dimensions":null`), &EmbeddingsRequest{Model: testModel, Runtime: llm.EmbedRequest{Input: []string{"x"}}}, "", ""},
		{"missing input", embBody(``), nil, "input", "missing_required_parameter"},
		{"missing model", `{"input":"x"}`, nil, "model", "missing_required_parameter"},
		{"empty string", embBody(`"input":""`), nil, "input", "invalid_value"},
		{"empty array", embBody(`"input":[]`), nil, "input", "invalid_value"},
		{"empty item", embBody(`"input":["a",""]`), nil, "input[1]", "invalid_value"},
		{"token array", embBody(`"input":[1,2,3]`), nil, "input", "unsupported_value"},
		{"token arrays", embBody(`"input":[[1,2],[3]]`), nil, "input", "unsupported_value"},
		{"object item", embBody(`"input":["a",{}]`), nil, "input[1]", "invalid_type"},
		{"number", embBody(`"input":3`), nil, "input", "invalid_type"},
		{"too many", embBody(many), nil, "input", "array_above_max_length"},
		{"encoding", embBody(`"input":"x","encoding_format":"int8"`), nil, "encoding_format", "invalid_value"},
		{"dimensions zero", embBody(`"input":"x","dimensions":0`), nil, "dimensions", ""},
		{"dimensions type", embBody(`"input":"x","dimensions":"8"`), nil, "dimensions", "invalid_type"},
		{"unknown", embBody(`"input":"x","truncate":true`), nil, "truncate", "unknown_parameter"},
		{"user type", embBody(`"input":"x","user":1`), nil, "user", "invalid_type"},
	}
	// The token arrays' answer names the fix for the client that sends
	// them by default.
	for _, b := range []string{embBody(`"input":[1,2,3]`), embBody(`"input":[[1,2],[3]]`)} {
		if _, e := DecodeEmbeddingsRequest([]byte(b), testModel); e == nil || !strings.Contains(e.Message, "check_embedding_ctx_length=False") {
			t.Errorf("%s: %v, want the message to name check_embedding_ctx_length=False", b, e)
		}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, e := DecodeEmbeddingsRequest([]byte(tc.body), testModel)
			if tc.want != nil {
				if e != nil {
					t.Fatalf("error %v", e)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("got %+v, want %+v", got, tc.want)
				}
				return
			}
			if e == nil || e.Status != 400 || e.Param != tc.param || (tc.code != "" && e.Code != tc.code) {
				t.Fatalf("got %+v, %+v; want a 400 on %s (%s)", got, e, tc.param, tc.code)
			}
		})
	}
	if _, e := DecodeEmbeddingsRequest([]byte(`{"model":"other","input":"x"}`), testModel); e == nil || e.Status != 404 || e.Code != "model_not_found" {
		t.Errorf("another model: %+v", e)
	}
	if r, e := DecodeEmbeddingsRequest([]byte(embBody(`"input":[`+strings.Repeat(`"a",`, MaxEmbeddingInputs-1)+`"a"]`)), testModel); e != nil || len(r.Runtime.Input) != MaxEmbeddingInputs {
		t.Errorf("%d inputs: %v", MaxEmbeddingInputs, e)
	}
}

func cmplBody(extra string) string {
	return embBody(`"prompt":"Once upon"` + map[bool]string{true: "", false: "," + extra}[extra == ""])
}

func TestDecodeCompletionRequest(t *testing.T) {
	o := func(mod func(*llm.Options)) llm.Options {
		var opt llm.Options
		mod(&opt)
		return opt
	}
	def := func(*llm.Options) {}
	cases := []struct {
		name  string
		body  string
		want  *CompletionRequest
		param string
		code  string
	}{
		{"defaults", cmplBody(""), &CompletionRequest{Model: testModel, Prompts: []string{"Once upon"}, N: 1, Runtime: llm.CompletionRequest{Prompt: "Once upon", Options: o(def)}}, "", ""},
		{"one prompt in an array", embBody(`"prompt":["Once"]`), &CompletionRequest{Model: testModel, Prompts: []string{"Once"}, N: 1, Runtime: llm.CompletionRequest{Prompt: "Once", Options: o(def)}}, "", ""},
		{"several prompts, n each", embBody(`"prompt":["a","b"],"n":3`), &CompletionRequest{Model: testModel, Prompts: []string{"a", "b"}, N: 3, Runtime: llm.CompletionRequest{Prompt: "a", Options: o(def)}}, "", ""},
		{"everything", cmplBody(`"suffix":"the end","max_tokens":5,"temperature":0.5,"top_p":0.9,"stop":["x",""],"seed":7,` +
			`"presence_penalty":1,"frequency_penalty":-1,"top_k":40,"min_p":0.1,"repetition_penalty":1.1,` +
			`"stream":true,"stream_options":{"include_usage":true},"user":"u","n":1,"best_of":1,"echo":false,"logit_bias":{}`),
			&CompletionRequest{Model: testModel, Stream: true, IncludeUsage: true, Prompts: []string{"Once upon"}, N: 1, Runtime: llm.CompletionRequest{Prompt: "Once upon", Suffix: "the end",
				Options: o(func(p *llm.Options) {
					p.MaxTokens, p.Temperature, p.TopP, p.Stop, p.Seed = intp(5), f64(0.5), f64(0.9), []string{"x"}, i64(7)
					p.PresencePenalty, p.FrequencyPenalty, p.TopK, p.MinP, p.RepetitionPenalty = f64(1), f64(-1), i64(40), f64(0.1), f64(1.1)
				})}}, "", ""},
		{"missing prompt", embBody(``), nil, "prompt", "missing_required_parameter"},
		{"empty prompt", embBody(`"prompt":""`), nil, "prompt", "invalid_value"},
		{"empty prompt array", embBody(`"prompt":[]`), nil, "prompt", "invalid_value"},
		{"more prompts than choices", embBody(`"prompt":["a","b","c","d","e","f","g","h","i"]`), nil, "prompt", "array_above_max_length"},
		{"prompts times n over the cap", embBody(`"prompt":["a","b","c"],"n":3`), nil, "n", "integer_above_max_value"},
		{"an empty prompt of several", embBody(`"prompt":["a",""]`), nil, "prompt[1]", "invalid_value"},
		{"token prompt", embBody(`"prompt":[1,2]`), nil, "prompt", "unsupported_value"},
		{"token prompts", embBody(`"prompt":[[1,2]]`), nil, "prompt", "unsupported_value"},
		{"prompt type", embBody(`"prompt":{}`), nil, "prompt", "invalid_type"},
		{"prompt item type", embBody(`"prompt":[true]`), nil, "prompt[0]", "invalid_type"},
		{"suffix type", cmplBody(`"suffix":1`), nil, "suffix", "invalid_type"},
		{"max_tokens 0", cmplBody(`"max_tokens":0`), nil, "max_tokens", ""},
		{"temperature", cmplBody(`"temperature":3`), nil, "temperature", ""},
		{"n", cmplBody(`"n":9`), nil, "n", "integer_above_max_value"},
		{"best_of", cmplBody(`"best_of":3`), nil, "best_of", "unsupported_value"},
		{"echo", cmplBody(`"echo":true`), nil, "echo", "unsupported_value"},
		{"logprobs", cmplBody(`"logprobs":0`), nil, "logprobs", "unsupported_parameter"},
		{"logprobs type", cmplBody(`"logprobs":true`), nil, "logprobs", "invalid_type"},
		{"logit_bias", cmplBody(`"logit_bias":{"50256":-100}`), nil, "logit_bias", "unsupported_parameter"},
		{"stream_options without stream", cmplBody(`"stream_options":{"include_usage":true}`), nil, "stream_options", "invalid_value"},
		{"stream_options unknown", cmplBody(`"stream":true,"stream_options":{"x":1}`), nil, "stream_options.x", "unknown_parameter"},
		{"messages", cmplBody(`"messages":[]`), nil, "messages", "unknown_parameter"},
		{"unknown", cmplBody(`"suffixx":""`), nil, "suffixx", "unknown_parameter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, e := DecodeCompletionRequest([]byte(tc.body), testModel)
			if tc.want != nil {
				if e != nil {
					t.Fatalf("error %v", e)
				}
				if !reflect.DeepEqual(got, tc.want) {
					t.Fatalf("got %+v\nwant %+v", got, tc.want)
				}
				return
			}
			if e == nil || e.Status != 400 || e.Param != tc.param || (tc.code != "" && e.Code != tc.code) {
				t.Fatalf("got %+v; want a 400 on %s (%s)", e, tc.param, tc.code)
			}
		})
	}
	if _, e := DecodeCompletionRequest([]byte(`{"model":"other","prompt":"x"}`), testModel); e == nil || e.Status != 404 {
		t.Errorf("another model: %+v", e)
	}
}

// Every known field reaches its decoder: a value no field accepts gets a
// 400 naming that field, never the unknown-field error.
func TestEveryEmbeddingAndCompletionFieldIsDecoded(t *testing.T) {
	check := func(kind string, names []string, decode func(string) *Error) {
		for _, name := range names {
			key, _ := json.Marshal(name)
			e := decode(string(key) + `:{"x":[1]}`)
			if e == nil || e.Status != 400 || !strings.HasPrefix(e.Param, name) || e.Code == "unknown_parameter" {
				t.Errorf("%s %s: got %+v", kind, name, e)
			}
		}
	}
	check("embeddings", embeddingsFields.names(), func(f string) *Error {
		var m map[string]json.RawMessage
		_ = json.Unmarshal([]byte(embBody(`"input":"x"`)), &m)
		b, _ := json.Marshal(m)
		_, e := DecodeEmbeddingsRequest([]byte(strings.TrimSuffix(string(b), "}")+","+f+"}"), testModel)
		return e
	})
	check("completions", completionFields.names(), func(f string) *Error {
		_, e := DecodeCompletionRequest([]byte(strings.TrimSuffix(cmplBody(""), "}")+","+f+"}"), testModel)
		return e
	})
}

func TestAppendEmbeddingsGolden(t *testing.T) {
	vecs := [][]float32{{0.5, -1, 1e-7}, {3.4028235e38, 0}}
	got := string(AppendEmbeddings(nil, "m", vecs, false, 7))
	want := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5,-1,1e-07]},` +
		`{"object":"embedding","index":1,"embedding":[3.4028235e+38,0]}],"model":"m","usage":{"prompt_tokens":7,"total_tokens":7}}`
	if got != want {
		t.Errorf("float:\n got %s\nwant %s", got, want)
	}
	var parsed struct {
		Data []struct {
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(got), &parsed); err != nil || !reflect.DeepEqual(parsed.Data[0].Embedding, vecs[0]) {
		t.Errorf("float does not read back: %v %+v", err, parsed)
	}

	got = string(AppendEmbeddings(nil, "m", [][]float32{{1, -2.5}}, true, 1))
	// 1.0 = 0x3f800000, -2.5 = 0xc0200000, little-endian.
	want = `{"object":"list","data":[{"object":"embedding","index":0,"embedding":"AACAPwAAIMA="}],"model":"m","usage":{"prompt_tokens":1,"total_tokens":1}}`
	if got != want {
		t.Errorf("base64:\n got %s\nwant %s", got, want)
	}
	raw, _ := base64.StdEncoding.DecodeString("AACAPwAAIMA=")
	if f := math.Float32frombits(binary.LittleEndian.Uint32(raw[4:])); f != -2.5 {
		t.Errorf("base64 second value %v", f)
	}
	if got := string(appendFloat32(nil, float32(math.NaN()))); got != "0" {
		t.Errorf("NaN as %s", got)
	}
}

func TestTextCompletionGolden(t *testing.T) {
	got := string(AppendTextCompletion(nil, "cmpl-1", 42, "m", "fp_x", "a \"b\"", "length", Usage{Prompt: 3, Completion: 2}))
	want := `{"id":"cmpl-1","object":"text_completion","created":42,"model":"m","system_fingerprint":"fp_x",` +
		`"choices":[{"text":"a \"b\"","index":0,"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
	if got != want {
		t.Errorf("completion:\n got %s\nwant %s", got, want)
	}

	enc := NewTextChunkEncoder("cmpl-1", 42, "m", "", true)
	var b []byte
	b = enc.AppendText(b, "hi")
	b = enc.AppendFinish(b, "stop")
	b = enc.AppendUsage(b, Usage{Prompt: 1, Completion: 1})
	b = enc.AppendDone(b)
	head := `data: {"id":"cmpl-1","object":"text_completion","created":42,"model":"m","system_fingerprint":null,`
	want = head + `"choices":[{"text":"hi","index":0,"logprobs":null,"finish_reason":null}],"usage":null}` + "\n\n" +
		head + `"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"stop"}],"usage":null}` + "\n\n" +
		head + `"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}` + "\n\n" +
		"data: [DONE]\n\n"
	if string(b) != want {
		t.Errorf("stream:\n got %s\nwant %s", b, want)
	}
	for _, ev := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		if p := strings.TrimPrefix(ev, "data: "); p != "[DONE]" && !json.Valid([]byte(p)) {
			t.Errorf("invalid JSON event %s", p)
		}
	}
	plain := NewTextChunkEncoder("cmpl-1", 42, "m", "", false)
	if got := string(plain.AppendText(nil, "x")); !strings.HasSuffix(got, `"finish_reason":null}]}`+"\n\n") {
		t.Errorf("without usage: %s", got)
	}
	if got := string(plain.AppendError(nil, InvalidRequest("p", "m"))); got != `data: {"error":{"message":"m","type":"invalid_request_error","param":"p","code":null}}`+"\n\n" {
		t.Errorf("error event: %s", got)
	}
	if id := NewTextCompletionID(); !strings.HasPrefix(id, "cmpl-") || len(id) != 34 {
		t.Errorf("id %q", id)
	}
}

// The per-token path does not allocate.
func TestTextChunkAllocs(t *testing.T) {
	enc := NewTextChunkEncoder("cmpl-1", 42, "m", "fp", true)
	buf := make([]byte, 0, 1024)
	if n := testing.AllocsPerRun(100, func() { buf = enc.AppendText(buf[:0], " token") }); n != 0 {
		t.Errorf("AppendText allocates %v times", n)
	}
}

func checkDecodeError(t *testing.T, e *Error) {
	t.Helper()
	if e.Status < 400 || e.Status > 499 || e.Message == "" || e.Type == "" || !json.Valid(AppendErrorJSON(nil, e)) {
		t.Fatalf("bad error %+v", e)
	}
}

func FuzzDecodeEmbeddingsRequest(f *testing.F) {
	for _, s := range []string{embBody(`"input":"x"`), embBody(`"input":["a","b"],"encoding_format":"base64","dimensions":3`),
		embBody(`"input":[1,2]`), embBody(`"input":[]`), `{}`, `[]`, `null`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, e := DecodeEmbeddingsRequest(b, testModel)
		if (r == nil) == (e == nil) {
			t.Fatalf("got request %v and error %v", r, e)
		}
		if e != nil {
			checkDecodeError(t, e)
			return
		}
		if r.Model != testModel || len(r.Runtime.Input) == 0 || len(r.Runtime.Input) > MaxEmbeddingInputs || r.Runtime.Dimensions < 0 ||
			slices.Contains(r.Runtime.Input, "") {
			t.Fatalf("bad request %+v", r)
		}
	})
}

func FuzzDecodeCompletionRequest(f *testing.F) {
	for _, s := range []string{cmplBody(""), cmplBody(`"suffix":"s","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}`),
		embBody(`"prompt":["a"]`), embBody(`"prompt":[1]`), cmplBody(`"echo":true`), `{}`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, e := DecodeCompletionRequest(b, testModel)
		if (r == nil) == (e == nil) {
			t.Fatalf("got request %v and error %v", r, e)
		}
		if e != nil {
			checkDecodeError(t, e)
			return
		}
		o := r.Runtime.Options
		if r.Model != testModel || r.Runtime.Prompt == "" || r.IncludeUsage && !r.Stream ||
			o.MaxTokens != nil && *o.MaxTokens < 1 || len(o.Stop) > maxStop {
			t.Fatalf("bad request %+v", r)
		}
	})
}
