package bench

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func readAll(t *testing.T, r io.Reader) []string {
	t.Helper()
	s := NewSSEReader(r)
	var out []string
	for {
		d, err := s.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		out = append(out, string(d))
	}
}

func TestSSEReader(t *testing.T) {
	long := strings.Repeat("x", 10000)
	for _, tc := range []struct {
		name, in string
		want     []string
	}{
		{"simple", "data: a\n\ndata: b\n\n", []string{"a", "b"}},
		{"crlf", "data: a\r\n\r\ndata: b\r\n\r\n", []string{"a", "b"}},
		{"no space", "data:a\n\n", []string{"a"}},
		{"multi-line data", "data: a\ndata: b\n\n", []string{"a\nb"}},
		{"comments and fields", ": ping\nevent: message\nid: 1\nretry: 10\ndata: x\n\n", []string{"x"}},
		{"blank events skipped", "\n\n: keepalive\n\ndata: y\n\n", []string{"y"}},
		{"unterminated event dropped", "data: a\n\ndata: b\n", []string{"a"}},
		{"longer than buffer", "data: " + long + "\n\ndata: z\n\n", []string{long, "z"}},
		{"empty data", "data:\n\n", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := readAll(t, strings.NewReader(tc.in))
			// Byte-at-a-time reads exercise events split across reads.
			got1 := readAll(t, iotest.OneByteReader(strings.NewReader(tc.in)))
			if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
			if strings.Join(got1, "|") != strings.Join(got, "|") {
				t.Fatalf("one-byte reads got %q, want %q", got1, got)
			}
		})
	}
}

func TestSSEReaderError(t *testing.T) {
	boom := errors.New("boom")
	s := NewSSEReader(io.MultiReader(strings.NewReader("data: a\n"), iotest.ErrReader(boom)))
	if _, err := s.Next(); !errors.Is(err, boom) {
		t.Fatalf("Next error = %v, want boom", err)
	}
}

func TestClassifyChunk(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Chunk
	}{
		{`[DONE]`, Chunk{Done: true}},
		{`{"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":" fox"},"finish_reason":null}]}`, Chunk{ContentLen: 4}},
		{`{"choices":[{"delta":{"role":"assistant","content":""},"finish_reason":"stop"}]}`, Chunk{Finished: true}},
		{`{"choices":[{"delta":{"content": "a\"b"}, "finish_reason": "length"}]}`, Chunk{ContentLen: 4, Finished: true}},
		{`{"choices":[{"delta":{"role":"assistant"}}]}`, Chunk{}},
		{`{"choices":[{"delta":{"content":null}}]}`, Chunk{}},
		{`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`, Chunk{}},
		{`{"error":{"message":"overloaded","type":"api_error"}}`, Chunk{Error: true}},
		// A key name inside content is escaped, so it must not be taken
		// for the key.
		{`{"choices":[{"delta":{"content":"say \"finish_reason\": \"x\""},"finish_reason":null}]}`, Chunk{ContentLen: 28}},
		{`{"choices":[{"delta":{"content":"unterminated`, Chunk{}},
	} {
		if got := ClassifyChunk([]byte(tc.in)); got != tc.want {
			t.Errorf("ClassifyChunk(%s) = %+v, want %+v", tc.in, got, tc.want)
		}
	}
}

func BenchmarkClassifyChunk(b *testing.B) {
	data := []byte(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,"model":"bench","system_fingerprint":"fp_ollama","choices":[{"index":0,"delta":{"role":"assistant","content":" quick"},"finish_reason":null}]}`)
	for b.Loop() {
		_ = ClassifyChunk(data)
	}
}
