package openai

import (
	"testing"
)

func BenchmarkAppendContent(b *testing.B) {
	enc := NewChunkEncoder(NewCompletionID(), 1700000000, "llama3.2:1b", "fp_hearth", true)
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = enc.AppendContent(buf[:0], " token")
	}
	b.SetBytes(int64(len(buf)))
}

func BenchmarkAppendContentEscaped(b *testing.B) {
	enc := NewChunkEncoder(NewCompletionID(), 1700000000, "llama3.2:1b", "fp_hearth", true)
	buf := make([]byte, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		buf = enc.AppendContent(buf[:0], "\"é\"\n日本")
	}
}

func BenchmarkDecodeChatRequest(b *testing.B) {
	body := []byte(`{"model":"llama3.2:1b","stream":true,"stream_options":{"include_usage":true},"temperature":0.7,` +
		`"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"Write a haiku about servers."}]}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, e := DecodeChatRequest(body, "llama3.2:1b"); e != nil {
			b.Fatal(e)
		}
	}
}
