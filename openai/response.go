package openai

import (
	"github.com/hearthd/hearth/internal/ids"
	"github.com/hearthd/hearth/llm"
)

// Reply is the assistant message of a complete chat.completion.
type Reply struct {
	Content string
	// Reasoning is a reasoning model's thinking, sent as reasoning_content
	// beside the content (as vLLM and DeepSeek do) when not empty.
	Reasoning string
	ToolCalls []llm.ToolCall
	// Logprobs, if not nil (the request asked for them), are the
	// content's tokens.
	Logprobs *[]llm.TokenLogprob
}

// Usage is a completion's token counts; Reasoning is the part of
// Completion the model spent thinking.
type Usage struct {
	Prompt, Completion, Reasoning int
}

// Choice is one choice of a complete chat.completion: the assistant's
// reply and why its generation ended.
type Choice struct {
	Reply
	Finish string
}

// AppendCompletion appends a complete (non-streamed) chat.completion object
// with one choice. The message content is null when the model only called
// tools; an empty fingerprint is sent as null.
func AppendCompletion(dst []byte, id string, created int64, model, fingerprint string, r Reply, finish string, u Usage) []byte {
	dst = appendCompletionHead(dst, id, created, model, fingerprint)
	dst = appendChoice(dst, 0, r, finish)
	return appendCompletionTail(dst, u)
}

// AppendCompletionChoices is AppendCompletion for n choices, indexed in
// order from 0.
func AppendCompletionChoices(dst []byte, id string, created int64, model, fingerprint string, choices []Choice, u Usage) []byte {
	dst = appendCompletionHead(dst, id, created, model, fingerprint)
	for i := range choices {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendChoice(dst, i, choices[i].Reply, choices[i].Finish)
	}
	return appendCompletionTail(dst, u)
}

// appendCompletionHead appends the chat.completion object up to its
// choices array, opened.
func appendCompletionHead(dst []byte, id string, created int64, model, fingerprint string) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"object":"chat.completion","created":`...)
	dst = appendInt(dst, created)
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, model)
	dst = append(dst, `,"system_fingerprint":`...)
	dst = appendStringOrNull(dst, fingerprint)
	return append(dst, `,"choices":[`...)
}

func appendCompletionTail(dst []byte, u Usage) []byte {
	dst = append(dst, `],"usage":`...)
	dst = appendUsage(dst, u)
	return append(dst, '}')
}

// appendChoice appends one choice object.
func appendChoice(dst []byte, index int, r Reply, finish string) []byte {
	content, toolCalls, logprobs := r.Content, r.ToolCalls, r.Logprobs
	dst = append(dst, `{"index":`...)
	dst = appendInt(dst, int64(index))
	dst = append(dst, `,"message":{"role":"assistant","content":`...)
	if content == "" && len(toolCalls) > 0 {
		dst = append(dst, "null"...)
	} else {
		dst = appendString(dst, content)
	}
	if r.Reasoning != "" {
		dst = append(dst, `,"reasoning_content":`...)
		dst = appendString(dst, r.Reasoning)
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
	dst = append(dst, `,"refusal":null},"logprobs":`...)
	if logprobs != nil {
		dst = appendLogprobs(dst, *logprobs)
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"finish_reason":`...)
	dst = appendString(dst, finish)
	return append(dst, '}')
}

// AppendModelList appends the GET /models answer for a deployment serving
// exactly one model.
func AppendModelList(dst []byte, id string, created int64, ownedBy string, info ModelInfo) []byte {
	dst = append(dst, `{"object":"list","data":[`...)
	dst = AppendModel(dst, id, created, ownedBy, info)
	return append(dst, "]}"...)
}

// ModelInfo is what a deployment knows of its model beyond OpenAI's
// fields: both are left out when unknown (0, nil).
type ModelInfo struct {
	// ContextLength is the tokens of one context (as vLLM's max_model_len).
	ContextLength int
	// Capabilities are what the model can do, as the runtime names them.
	Capabilities []string
}

// AppendModel appends one model object, the GET /models/{id} answer.
func AppendModel(dst []byte, id string, created int64, ownedBy string, info ModelInfo) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"object":"model","created":`...)
	dst = appendInt(dst, created)
	dst = append(dst, `,"owned_by":`...)
	dst = appendString(dst, ownedBy)
	if info.ContextLength > 0 {
		dst = append(dst, `,"context_length":`...)
		dst = appendInt(dst, int64(info.ContextLength))
	}
	if info.Capabilities != nil {
		dst = append(dst, `,"capabilities":[`...)
		for i, c := range info.Capabilities {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, c)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

// NewCompletionID returns "chatcmpl-" followed by 29 random base62
// characters, the shape of OpenAI's completion IDs.
func NewCompletionID() string { return ids.New("chatcmpl-", 29) }

// NewToolCallID returns "call_" followed by 24 random base62 characters,
// for tool calls the runtime did not name.
func NewToolCallID() string { return ids.New("call_", 24) }
