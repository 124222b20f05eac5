package openai

import (
	"crypto/rand"

	"github.com/hearthd/hearth/runtime"
)

// AppendCompletion appends a complete (non-streamed) chat.completion object.
// The message content is null when the model only called tools; an empty
// fingerprint is sent as null.
func AppendCompletion(dst []byte, id string, created int64, model, fingerprint, content string,
	toolCalls []runtime.ToolCall, finish string, prompt, completion int) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"object":"chat.completion","created":`...)
	dst = appendInt(dst, created)
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, model)
	dst = append(dst, `,"system_fingerprint":`...)
	dst = appendStringOrNull(dst, fingerprint)
	dst = append(dst, `,"choices":[{"index":0,"message":{"role":"assistant","content":`...)
	if content == "" && len(toolCalls) > 0 {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, content)
	}
	if len(toolCalls) > 0 {
		dst = append(dst, `,"tool_calls":[`...)
		for i := range toolCalls {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '{')
			dst = appendToolCallBody(dst, &toolCalls[i])
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"refusal":null},"logprobs":null,"finish_reason":`...)
	dst = appendString(dst, finish)
	dst = append(dst, `}],"usage":`...)
	dst = appendUsage(dst, prompt, completion)
	return append(dst, '}')
}

// AppendModelList appends the GET /models answer for a deployment serving
// exactly one model.
func AppendModelList(dst []byte, id string, created int64, ownedBy string) []byte {
	dst = append(dst, `{"object":"list","data":[`...)
	dst = AppendModel(dst, id, created, ownedBy)
	return append(dst, "]}"...)
}

// AppendModel appends one model object, the GET /models/{id} answer.
func AppendModel(dst []byte, id string, created int64, ownedBy string) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"object":"model","created":`...)
	dst = appendInt(dst, created)
	dst = append(dst, `,"owned_by":`...)
	dst = appendString(dst, ownedBy)
	return append(dst, '}')
}

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// NewCompletionID returns "chatcmpl-" followed by 29 random base62
// characters, the shape of OpenAI's completion IDs.
func NewCompletionID() string { return randomID("chatcmpl-", 29) }

// NewToolCallID returns "call_" followed by 24 random base62 characters,
// for tool calls the runtime did not name.
func NewToolCallID() string { return randomID("call_", 24) }

// randomID appends n uniformly random base62 characters from crypto/rand to
// prefix. Bytes ≥ 248 are rejected so that each character is uniform
// (248 = 4·62).
func randomID(prefix string, n int) string {
	out := make([]byte, len(prefix), len(prefix)+n)
	copy(out, prefix)
	var buf [64]byte
	for len(out) < cap(out) {
		rand.Read(buf[:]) // never fails: crypto/rand aborts the program instead.
		for _, b := range buf {
			if b >= 248 {
				continue
			}
			out = append(out, base62[b%62])
			if len(out) == cap(out) {
				break
			}
		}
	}
	return string(out)
}
