package deployapi

import "github.com/hearthd/hearth/llm"

// fitContext is the Responses API's truncation "auto": it drops the oldest
// messages of r until its prompt, estimated (estimateTokens), leaves room
// in the model's context for the output it asks for (max_output_tokens,
// when sent). It never drops a system message (the instructions) or the
// last message, and drops an assistant's tool calls together with the
// results that answer them, so that no result is left without its call.
// With the context length unknown it drops nothing.
func fitContext(l llm.Limits, r *llm.Request) {
	if l.ContextLength <= 0 {
		return
	}
	budget := l.ContextLength
	if m := r.Options.MaxTokens; m != nil {
		budget -= *m
	}
	msgs := r.Messages
	over := promptBytes(r) - budget*estBytesPerToken // in bytes
	for i := 0; over > 0 && i < len(msgs)-1; {
		if msgs[i].Role == "system" {
			i++
			continue
		}
		// The message, and the tool results that follow it.
		end := i + 1
		for end < len(msgs)-1 && msgs[end].Role == "tool" {
			end++
		}
		for _, m := range msgs[i:end] {
			over -= messageBytes(m)
		}
		msgs = append(msgs[:i], msgs[end:]...)
	}
	r.Messages = msgs
}

// messageBytes is the text of one message the model reads: its content,
// its thinking given back, its tool calls.
func messageBytes(m llm.Message) int {
	n := len(m.Content) + len(m.Thinking)
	for _, tc := range m.ToolCalls {
		n += len(tc.Name) + len(tc.Arguments)
	}
	return n
}
