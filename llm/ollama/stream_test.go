package ollama

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/llm"
)

// tokenLine is a token line as Ollama writes it, with raw as the JSON body
// of the content string (escapes as written, no quotes).
func tokenLine(raw string) []byte {
	return []byte(`{"model":"hearth-tiny","created_at":"2026-01-02T03:04:05.123456789Z","message":{"role":"assistant","content":"` + raw + `"},"done":false}` + "\n")
}

// responseLine is tokenLine as /api/generate writes it.
func responseLine(raw string) []byte {
	return []byte(`{"model":"hearth-tiny","created_at":"2026-01-02T03:04:05.123456789Z","response":"` + raw + `","done":false}` + "\n")
}

// checkFastLine fails t if the fast path accepts line but encoding/json
// reads it differently (or not at all).
func checkFastLine(t *testing.T, line []byte) (accepted bool) {
	t.Helper()
	var final chatLine
	if fastFinalLine(line, &final) {
		var ref chatLine
		if err := json.Unmarshal(line, &ref); err != nil {
			t.Fatalf("final fast path accepted %q, encoding/json rejects it: %v", line, err)
		}
		if !reflect.DeepEqual(final, ref) {
			t.Fatalf("line %q: final fast path %+v, encoding/json %+v", line, final, ref)
		}
		if _, ok := fastTokenLine(line); ok {
			t.Fatalf("both fast paths accepted %q", line)
		}
		return true
	}
	content, ok := fastTokenLine(line)
	if !ok {
		return false
	}
	var ref chatLine
	if err := json.Unmarshal(line, &ref); err != nil {
		t.Fatalf("fast path accepted %q, encoding/json rejects it: %v", line, err)
	}
	if ref.Message.Content+ref.Response != content || ref.Message.Content != "" && ref.Response != "" {
		t.Fatalf("line %q: fast path content %q, encoding/json %q and response %q", line, content, ref.Message.Content, ref.Response)
	}
	if ref.Done || ref.Error != "" || len(ref.Message.ToolCalls) > 0 || ref.Message.Thinking != "" || ref.DoneReason != "" || ref.EvalCount != 0 {
		t.Fatalf("fast path accepted %q, which encoding/json reads as %+v", line, ref)
	}
	return true
}

func TestFastTokenLine(t *testing.T) {
	// Contents the fast path must take, escaped as encoding/json (and so
	// Ollama) writes them, and as other writers may.
	for _, raw := range []string{
		"", "Hello", " world", "héllo wörld", "日本語", "😀 emoji",
		`line\nbreak`, `tab\there`, `quote \"x\"`, `back\\slash`, `sl\/ash`,
		`\b\f\r\t\n`, `\u003cb\u003e \u0026amp;`, `\u00e9\u00E9`, `\u0000nul`,
		`\ud83d\ude00 pair`, `\uD83D\uDE00 upper`,
		`lone high \ud83d end`, `lone low \ude00 end`, `high then BMP \ud83d\u0041`,
		`high high \ud83d\ud83d\ude00`, `high at end \ud83d`,
		"invalid utf8 \xff\xfe", "truncated rune \xe6\x97", "\xed\xa0\x80 encoded surrogate",
		`\\\"`, `\\`,
	} {
		for _, line := range [][]byte{tokenLine(raw), responseLine(raw)} {
			if !checkFastLine(t, line) {
				t.Errorf("fast path declined %q", line)
			}
			if !checkFastLine(t, bytes.TrimSuffix(line, []byte("\n"))) {
				t.Errorf("fast path declined %q without its newline", line)
			}
		}
	}
	// Lines the fast path must leave to encoding/json.
	for _, line := range []string{
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","eval_count":3}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f","arguments":{}}}]},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}`,
		`{"error":"boom"}`,
		`{"message":{"role":"assistant","content":"a"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"user","content":"a"},"done":false}`,
		`{"model": "m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false}` + "\r\n",
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false} `,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false}x`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false}` + "\n\n",
		`{"model":"m\"","created_at":"t","message":{"role":"assistant","content":"a"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a\x"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a\'"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"\u12"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"\u12g4"},"done":false}`,
		"{\"model\":\"m\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"a\tb\"},\"done\":false}",
		"{\"model\":\"m\x01\",\"created_at\":\"t\",\"message\":{\"role\":\"assistant\",\"content\":\"a\"},\"done\":false}",
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a\"},"done":false}`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a`,
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":"a"},"done":false`,
		`{"model":"m","created_at":"t","response":"","done":true,"done_reason":"length","eval_count":3}`,
		`{"model":"m","created_at":"t","response":"a","thinking":"b","done":false}`,
		`{"model":"m","created_at":"t","response":"a"},"done":false}`,
		`{"model":"m","created_at":"t","response":"a","done":false`,
		``, "\n",
	} {
		if _, ok := fastTokenLine([]byte(line)); ok {
			t.Errorf("fast path accepted %q", line)
		}
	}
}

// FuzzDecodeLine checks the fast path against encoding/json: on any line
// it accepts, both must read the same content, and a token line whose
// content encoding/json reads must take the fast path.
func FuzzDecodeLine(f *testing.F) {
	for _, s := range []string{
		string(tokenLine("Hello")), string(tokenLine(`\ud83d\ude00\u003c\n`)), "\xff\xfe",
		`{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true}`,
		finalLine, ollamaFinalLine, ollama017FinalLine,
		`a\"b`, `\ud83d\u0041`, `\ud800`, `\\u0041`, `\/\b\f`, "日本\xe6",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkFastLine(t, in)
		// The input as the content of a token line reaches the string
		// decoding far more often than arbitrary lines do.
		// And as the reason and a count of a final line.
		checkFastLine(t, []byte(`{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done_reason":"`+string(in)+`","done":true}`))
		checkFastLine(t, []byte(`{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"eval_count":`+string(in)+`}`))
		checkFastLine(t, []byte(`{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"`+string(in)+`","eval_count":1}`))
		for _, line := range [][]byte{tokenLine(string(in)), responseLine(string(in))} {
			accepted := checkFastLine(t, line)
			var want string
			if json.Unmarshal(append(append([]byte{'"'}, in...), '"'), &want) == nil && !accepted {
				t.Fatalf("fast path declined %q, a token line encoding/json reads as %q", line, want)
			}
		}
	})
}

// testStream is a stream over r, as Chat builds it after the headers.
func testStream(r io.ReadCloser) *stream {
	ctx, cancel := context.WithCancelCause(context.Background())
	return &stream{
		b:      &Backend{base: "http://test"},
		ctx:    ctx,
		cancel: cancel,
		lines:  newLines(r),
	}
}

type streamResult struct {
	text   string
	tokens []string
	final  llm.Event
	err    error
}

func drain(s llm.Stream) streamResult {
	var r streamResult
	for {
		ev, err := s.Recv()
		if err != nil {
			if err != io.EOF {
				r.err = err
			}
			break
		}
		if ev.Content != "" {
			r.tokens = append(r.tokens, ev.Content)
		}
		if ev.Done {
			r.final = ev
		}
	}
	r.text = strings.Join(r.tokens, "")
	return r
}

const finalLine = `{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"prompt_eval_count":4,"eval_count":3}` + "\n"

func TestStreamLines(t *testing.T) {
	long := strings.Repeat("x", 3*lineBufSize+17)
	for _, c := range []struct {
		name, in string
		tokens   []string
		err      error
	}{
		{"tokens and final", string(tokenLine("a")) + string(tokenLine(`\u003cb\u003e`)) + finalLine, []string{"a", "<b>"}, nil},
		{"blank lines between", "\n" + string(tokenLine("a")) + " \r\n\n" + string(tokenLine("b")) + "\n" + finalLine, []string{"a", "b"}, nil},
		{"line longer than the buffer", string(tokenLine(long)) + string(tokenLine("b")) + finalLine, []string{long, "b"}, nil},
		{"long unusual line", `{"message":{"content":"` + long + `","role":"assistant"},"done":false}` + "\n" + finalLine, []string{long}, nil},
		{"final line without newline", string(tokenLine("a")) + strings.TrimSuffix(finalLine, "\n"), []string{"a"}, nil},
		{"cut in a line", string(tokenLine("a")) + `{"model":"m","crea`, []string{"a"}, io.ErrUnexpectedEOF},
		{"cut after a line", string(tokenLine("a")), []string{"a"}, io.ErrUnexpectedEOF},
		{"malformed line", string(tokenLine("a")) + "<html>\n", []string{"a"}, llm.ErrUnavailable},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := drain(testStream(io.NopCloser(strings.NewReader(c.in))))
			if strings.Join(r.tokens, "|") != strings.Join(c.tokens, "|") {
				t.Fatalf("tokens %q, want %q", r.tokens, c.tokens)
			}
			if c.err == nil {
				if r.err != nil || r.final.FinishReason != llm.FinishStop || r.final.CompletionTokens != 3 || r.final.PromptTokens != 4 {
					t.Fatalf("err %v, final %+v", r.err, r.final)
				}
			} else if !errors.Is(r.err, c.err) {
				t.Fatalf("err = %v, want %v", r.err, c.err)
			}
		})
	}
}

// TestStreamBuffered drives a stream through a pipe, where each write is
// exactly what one read of the stream gets, and checks Buffered after each
// event: true only when the next Recv has an event without reading.
func TestStreamBuffered(t *testing.T) {
	pr, pw := io.Pipe()
	s := testStream(pr)
	defer s.Close()
	writes := make(chan string)
	go func() {
		for w := range writes {
			if _, err := io.WriteString(pw, w); err != nil {
				return
			}
		}
		pw.Close()
	}()
	var endOnce sync.Once
	end := func() { endOnce.Do(func() { close(writes) }) }
	defer end()

	// buffered calls Buffered, failing the test if it blocks.
	buffered := func() bool {
		t.Helper()
		got := make(chan bool, 1)
		go func() { got <- s.Buffered() }()
		select {
		case b := <-got:
			return b
		case <-time.After(10 * time.Second):
			t.Fatal("Buffered blocked")
			return false
		}
	}
	recv := func(want string) {
		t.Helper()
		ev, err := s.Recv()
		if err != nil || ev.Content != want {
			t.Fatalf("Recv = %+v, %v; want %q", ev, err, want)
		}
	}
	step := func(w string) {
		t.Helper()
		select {
		case writes <- w:
		case <-time.After(10 * time.Second):
			t.Fatal("writer stuck")
		}
	}

	if buffered() {
		t.Fatal("Buffered before anything arrived")
	}
	step(string(tokenLine("a")) + string(tokenLine("b")))
	recv("a")
	if !buffered() {
		t.Fatal("a whole token line is buffered, Buffered = false")
	}
	recv("b")
	if buffered() {
		t.Fatal("nothing is buffered, Buffered = true")
	}

	// A line without an event must not count: the next Recv would wait.
	step(string(tokenLine("c")) + string(tokenLine("")))
	recv("c")
	if buffered() {
		t.Fatal("only an empty-content line is buffered, Buffered = true")
	}

	// Half a line is not a line.
	line := tokenLine("d")
	step(string(tokenLine("c2")) + string(line[:20]))
	recv("c2")
	if buffered() {
		t.Fatal("only part of a line is buffered, Buffered = true")
	}
	step(string(line[20:]))
	recv("d")

	// A buffered final line is an event.
	step(string(tokenLine("e")) + finalLine)
	end() // the answer ends, as Ollama's does after the final line
	recv("e")
	if !buffered() {
		t.Fatal("the final line is buffered, Buffered = false")
	}
	if ev, err := s.Recv(); err != nil || !ev.Done || ev.FinishReason != llm.FinishStop {
		t.Fatalf("final Recv = %+v, %v", ev, err)
	}
	if _, err := s.Recv(); err != io.EOF {
		t.Fatalf("Recv after the final event = %v, want EOF", err)
	}
	if buffered() {
		t.Fatal("Buffered after the end")
	}
}

func TestStreamBufferedError(t *testing.T) {
	s := testStream(io.NopCloser(strings.NewReader(string(tokenLine("a")) + `{"error":"boom"}` + "\n")))
	if ev, err := s.Recv(); err != nil || ev.Content != "a" {
		t.Fatalf("Recv = %+v, %v", ev, err)
	}
	if s.Buffered() {
		t.Fatal("an error line is not an event")
	}
	if _, err := s.Recv(); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("Recv = %v, want the stream's error", err)
	}
}

// BenchmarkDecodeLine is the cost of turning one token line into its
// content: the fast path, and encoding/json's Decoder as the stream used
// before it.
func BenchmarkDecodeLine(b *testing.B) {
	for _, c := range []struct{ name, raw string }{
		{"plain", " word"},
		{"escaped", `\u003cdiv\u003e\n`},
	} {
		line := tokenLine(c.raw)
		b.Run(c.name+"/fast", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := fastTokenLine(line); !ok {
					b.Fatal("declined")
				}
			}
		})
		b.Run(c.name+"/encoding-json", func(b *testing.B) {
			r := bytes.NewReader(nil)
			body := bytes.Repeat(line, 1000)
			dec := json.NewDecoder(r)
			var l chatLine
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if i%1000 == 0 {
					r.Reset(body)
					dec = json.NewDecoder(r)
				}
				l = chatLine{}
				if err := dec.Decode(&l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A thinking model's lines carry message.thinking before the answer: each
// becomes an event with Reasoning, apart from Content.
func TestStreamThinking(t *testing.T) {
	in := `{"model":"m","created_at":"2025-07-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":"Let me"},"done":false}` + "\n" +
		`{"model":"m","created_at":"2025-07-01T00:00:00Z","message":{"role":"assistant","content":"","thinking":" think."},"done":false}` + "\n" +
		string(tokenLine("Hi")) + finalLine
	s := testStream(io.NopCloser(strings.NewReader(in)))
	var reasoning, content strings.Builder
	for {
		ev, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ev.Reasoning != "" && ev.Content != "" {
			t.Fatalf("one event with both: %+v", ev)
		}
		reasoning.WriteString(ev.Reasoning)
		content.WriteString(ev.Content)
		if ev.Done {
			break
		}
	}
	if reasoning.String() != "Let me think." || content.String() != "Hi" {
		t.Fatalf("reasoning %q content %q", reasoning.String(), content.String())
	}
}

// ollamaFinalLine is the last line of a chat answer as Ollama 0.9 writes
// it, and ollama017FinalLine as Ollama 0.17.4 wrote it (taken from its
// answer to hearth-tiny): "done" comes before "done_reason" there.
const (
	ollamaFinalLine    = `{"model":"hearth-tiny","created_at":"2026-11-29T04:40:26.339Z","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"total_duration":15234567,"load_duration":1000000,"prompt_eval_count":31,"prompt_eval_duration":2000000,"eval_count":16,"eval_duration":12000000}` + "\n"
	ollama017FinalLine = `{"model":"hearth-tiny","created_at":"2026-11-29T11:51:30.872301851Z","message":{"role":"assistant","content":""},"done":true,"done_reason":"length","total_duration":287477186,"load_duration":281850595,"prompt_eval_count":28,"prompt_eval_duration":1872988,"eval_count":6,"eval_duration":1362229}` + "\n"
)

func TestFastFinalLine(t *testing.T) {
	head := `{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done_reason":"length","done":true`
	head017 := `{"model":"m","created_at":"t","message":{"role":"assistant","content":""},"done":true,"done_reason":"length"`
	for _, c := range []struct {
		line   string
		want   chatLine // when taken
		taken  bool
		reason string
	}{
		{ollamaFinalLine, chatLine{Done: true, DoneReason: "stop", PromptEvalCount: 31, EvalCount: 16}, true, "Ollama's line"},
		{head + `}`, chatLine{Done: true, DoneReason: "length"}, true, "no metrics (all omitempty)"},
		{head + `,"eval_count":0,"eval_count":7}`, chatLine{Done: true, DoneReason: "length", EvalCount: 7}, true, "a repeated key: the last wins, as in encoding/json"},
		{head + `,"eval_count":123456789012345678}`, chatLine{Done: true, DoneReason: "length", EvalCount: 123456789012345678}, true, "18 digits"},
		{head + `,"eval_count":1234567890123456789}`, chatLine{}, false, "19 digits: left to encoding/json"},
		{head + `,"eval_count":1.5}`, chatLine{}, false, "a fraction"},
		{head + `,"eval_count":1e3}`, chatLine{}, false, "an exponent"},
		{head + `,"eval_count":-1}`, chatLine{}, false, "a sign"},
		{head + `,"eval_count":01}`, chatLine{}, false, "a leading zero"},
		{head + `,"eval_count":}`, chatLine{}, false, "no number"},
		{head + `,"eval_count": 3}`, chatLine{}, false, "a space"},
		{head + `,"context":[1,2]}`, chatLine{}, false, "another key"},
		{head + `,"eval_count":3`, chatLine{}, false, "unterminated"},
		{head + `,"eval_count":3}}`, chatLine{}, false, "trailing bytes"},
		{strings.Replace(head, `"content":""`, `"content":"x"`, 1) + `}`, chatLine{}, false, "content in the last line"},
		{strings.Replace(head, `"length"`, `"le\"n"`, 1) + `}`, chatLine{}, false, "an escape in the reason"},
		{strings.Replace(head, `"length"`, "\"\xff\"", 1) + `}`, chatLine{}, false, "invalid UTF-8 in the reason"},
		{strings.Replace(head, `"done":true`, `"done":false`, 1) + `}`, chatLine{}, false, "not done"},
		{ollama017FinalLine, chatLine{Done: true, DoneReason: "length", PromptEvalCount: 28, EvalCount: 6}, true, "Ollama 0.17's line"},
		{head017 + `}`, chatLine{Done: true, DoneReason: "length"}, true, "0.17's layout, no metrics"},
		{head017 + `,"eval_count":3}`, chatLine{Done: true, DoneReason: "length", EvalCount: 3}, true, "0.17's layout, a count"},
		{strings.Replace(head017, `"length"`, `"le\"n"`, 1) + `}`, chatLine{}, false, "0.17's layout, an escape in the reason"},
		{strings.Replace(head017, `"length"`, "\"\xff\"", 1) + `}`, chatLine{}, false, "0.17's layout, invalid UTF-8 in the reason"},
		{strings.Replace(head017, `"done":true`, `"done":false`, 1) + `}`, chatLine{}, false, "0.17's layout, not done"},
		{strings.TrimSuffix(head017, `length"`), chatLine{}, false, "0.17's layout, the reason cut"},
		{head017 + `,"done_reason":"stop"}`, chatLine{}, false, "0.17's layout, the reason twice"},
		{head + `,"done_reason":"stop"}`, chatLine{}, false, "the reason twice"},
	} {
		var got chatLine
		taken := fastFinalLine([]byte(c.line), &got)
		if taken != c.taken || taken && !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: taken %v %+v, want %v %+v", c.reason, taken, got, c.taken, c.want)
		}
		checkFastLine(t, []byte(c.line)) // agrees with encoding/json
	}
}
