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

// BenchmarkDecodeChatRequestTools decodes an agent-style request: tools,
// a tool round trip in the history, content parts and a JSON schema.
func BenchmarkDecodeChatRequestTools(b *testing.B) {
	body := []byte(`{"model":"llama3.2:1b","temperature":0.2,"stop":["\n\n"],"messages":[` +
		`{"role":"system","content":"You are a weather assistant."},` +
		`{"role":"user","content":[{"type":"text","text":"Weather in "},{"type":"text","text":"Oslo?"}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function",` +
		`"function":{"name":"get_weather","arguments":"{\"city\":\"Oslo\"}"}}]},` +
		`{"role":"tool","tool_call_id":"call_1","content":"-3C, snow"}],` +
		`"tools":[{"type":"function","function":{"name":"get_weather","description":"Current weather.",` +
		`"parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},` +
		`{"type":"function","function":{"name":"now","description":"Current time."}}],"tool_choice":"auto",` +
		`"response_format":{"type":"json_schema","json_schema":{"name":"answer","strict":true,` +
		`"schema":{"type":"object","properties":{"text":{"type":"string"}}}}}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, e := DecodeChatRequest(body, "llama3.2:1b"); e != nil {
			b.Fatal(e)
		}
	}
}
