package openai

import (
	"github.com/hearthd/hearth/llm"
)

// ChunkEncoder encodes the server-sent events of one streamed completion.
// Everything that is the same in every chunk is encoded once by
// NewChunkEncoder, so a content chunk costs one copy of that prefix plus the
// escaped text. A ChunkEncoder is immutable and safe for concurrent use.
//
// A stream is: AppendRole, then any AppendContent and AppendToolCalls,
// then AppendFinish, AppendUsage when usage was requested, and AppendDone.
// A failure mid-stream is reported with AppendError instead of the rest.
type ChunkEncoder struct {
	// choice is `data: {"id":…,"object":"chat.completion.chunk","created":…,
	// "model":…,"system_fingerprint":…,"choices":[{"index":0,"delta":`.
	choice string
	// head is the same as choice up to and including the fingerprint and
	// its trailing comma, for the usage chunk which has no choice.
	head string
	// end closes the choice, the choices array and the chunk, with
	// "usage":null in between when the client asked for usage.
	end string
}

// NewChunkEncoder prepares the encoder for completion id. An empty
// fingerprint is sent as null.
func NewChunkEncoder(id string, created int64, model, fingerprint string, includeUsage bool) *ChunkEncoder {
	// On the stack unless the names are long; one string holds both the
	// head and the choice's prefix, which begins with it.
	var buf [256]byte
	h := append(buf[:0], `data: {"id":`...)
	h = appendString(h, id)
	h = append(h, `,"object":"chat.completion.chunk","created":`...)
	h = appendInt(h, created)
	h = append(h, `,"model":`...)
	h = appendString(h, model)
	h = append(h, `,"system_fingerprint":`...)
	h = appendStringOrNull(h, fingerprint)
	h = append(h, ',')
	n := len(h)
	choice := string(append(h, `"choices":[{"index":0,"delta":`...))
	end := "}]}\n\n"
	if includeUsage {
		end = `}],"usage":null}` + "\n\n"
	}
	return &ChunkEncoder{
		choice: choice,
		head:   choice[:n],
		end:    end,
	}
}

// ForChoice returns the encoder of choice index i of a completion with
// several choices (n > 1): its chunks carry "index":i. The usage chunk and
// [DONE] are the completion's, the same from any of them. Build the n
// encoders once, before the stream starts, so no chunk costs more than
// with one choice.
func (c *ChunkEncoder) ForChoice(i int) *ChunkEncoder {
	if i == 0 {
		return c
	}
	h := make([]byte, 0, len(c.head)+40)
	h = append(h, c.head...)
	h = append(h, `"choices":[{"index":`...)
	h = appendInt(h, int64(i))
	h = append(h, `,"delta":`...)
	return &ChunkEncoder{choice: string(h), head: c.head, end: c.end}
}

const notFinished = `,"logprobs":null,"finish_reason":null`

// AppendRole appends the first chunk, whose delta announces the assistant
// role with empty content, as OpenAI's first chunk does.
func (c *ChunkEncoder) AppendRole(dst []byte) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `{"role":"assistant","content":""}`...)
	dst = append(dst, notFinished...)
	return append(dst, c.end...)
}

// AppendContent appends a chunk whose delta carries text only. It does not
// allocate when dst has room.
func (c *ChunkEncoder) AppendContent(dst []byte, text string) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `{"content":`...)
	dst = appendString(dst, text)
	dst = append(dst, '}')
	dst = append(dst, notFinished...)
	return append(dst, c.end...)
}

// AppendReasoning appends a chunk whose delta carries a piece of the
// model's thinking as reasoning_content, apart from content (as vLLM and
// DeepSeek stream it).
func (c *ChunkEncoder) AppendReasoning(dst []byte, text string) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `{"reasoning_content":`...)
	dst = appendString(dst, text)
	dst = append(dst, '}')
	dst = append(dst, notFinished...)
	return append(dst, c.end...)
}

// AppendToolCalls appends a chunk whose delta carries complete tool calls,
// numbered from startIndex (the number of calls already sent in this
// completion). A call without an ID gets a fresh one.
func (c *ChunkEncoder) AppendToolCalls(dst []byte, calls []llm.ToolCall, startIndex int) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `{"tool_calls":[`...)
	for i := range calls {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"index":`...)
		dst = appendInt(dst, int64(startIndex+i))
		dst = append(dst, ',')
		dst = appendToolCallBody(dst, &calls[i])
	}
	dst = append(dst, "]}"...)
	dst = append(dst, notFinished...)
	return append(dst, c.end...)
}

// AppendFinish appends the chunk with an empty delta and the finish reason.
func (c *ChunkEncoder) AppendFinish(dst []byte, reason string) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `{},"logprobs":null,"finish_reason":`...)
	dst = appendString(dst, reason)
	return append(dst, c.end...)
}

// AppendUsage appends the usage chunk, which has no choices. Send it only
// when the client asked for usage, after the finish chunk.
func (c *ChunkEncoder) AppendUsage(dst []byte, u Usage) []byte {
	dst = append(dst, c.head...)
	dst = append(dst, `"choices":[],"usage":`...)
	dst = appendUsage(dst, u)
	return append(dst, "}\n\n"...)
}

// AppendDone appends the terminating data: [DONE] event.
func (c *ChunkEncoder) AppendDone(dst []byte) []byte {
	return append(dst, "data: [DONE]\n\n"...)
}

// AppendError appends an error event, for failures after the stream has
// started and the HTTP status can no longer change. OpenAI's clients raise
// it as an API error.
func (c *ChunkEncoder) AppendError(dst []byte, e *Error) []byte {
	dst = append(dst, "data: "...)
	dst = AppendErrorJSON(dst, e)
	return append(dst, "\n\n"...)
}

// appendToolCallBody appends `"id":…,"type":"function","function":{…}}`,
// the part of a tool call shared by chunks and complete messages.
func appendToolCallBody(dst []byte, tc *llm.ToolCall) []byte {
	dst = append(dst, `"id":`...)
	if tc.ID != "" {
		dst = appendString(dst, tc.ID)
	} else {
		dst = appendString(dst, NewToolCallID())
	}
	dst = append(dst, `,"type":"function","function":{"name":`...)
	dst = appendString(dst, tc.Name)
	dst = append(dst, `,"arguments":`...)
	if len(tc.Arguments) == 0 {
		dst = append(dst, `"{}"`...)
	} else {
		// OpenAI carries the arguments object as a JSON-encoded string.
		dst = appendString(dst, tc.Arguments)
	}
	return append(dst, "}}"...)
}

func appendUsage(dst []byte, u Usage) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = appendInt(dst, int64(u.Prompt))
	dst = append(dst, `,"completion_tokens":`...)
	dst = appendInt(dst, int64(u.Completion))
	dst = append(dst, `,"total_tokens":`...)
	dst = appendInt(dst, int64(u.Prompt)+int64(u.Completion))
	if u.Reasoning > 0 {
		dst = append(dst, `,"completion_tokens_details":{"reasoning_tokens":`...)
		dst = appendInt(dst, int64(u.Reasoning))
		dst = append(dst, '}')
	}
	return append(dst, '}')
}
