package openai

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/hearthd/hearth/llm"
)

// decodeMessages decodes the conversation: a non-empty array of messages.
func decodeMessages(raw json.RawMessage, param string) ([]llm.Message, *Error) {
	items, e := asArray(raw, param)
	if e != nil {
		return nil, e
	}
	if len(items) == 0 {
		return nil, invalid(param, "empty_array", "Invalid '"+param+
			"': empty array. Expected an array with minimum length 1, but got an empty array instead.")
	}
	msgs := make([]llm.Message, len(items))
	d := &messageDecoder{}
	for i, it := range items {
		d.Message = &msgs[i]
		if e := d.decode(it, param+"["+strconv.Itoa(i)+"]"); e != nil {
			return nil, e
		}
	}
	return msgs, nil
}

// messageDecoder decodes the messages of one conversation in order.
type messageDecoder struct {
	*llm.Message // the message being decoded
	// toolNames maps the IDs of earlier assistant tool calls to their
	// function names, to name the tool a role tool message answers.
	toolNames map[string]string
}

// decode decodes one message, whose role selects its table.
func (d *messageDecoder) decode(raw json.RawMessage, param string) *Error {
	obj, e := asObject(raw, param)
	if e != nil {
		return e
	}
	raw, ok := obj.get("role")
	if !ok {
		return missing(param + ".role")
	}
	if kindOf(raw) != "string" { // checked here so the path is built only for the error
		return typeError(param+".role", "a string", raw)
	}
	role := mustString(raw)
	var fs *fields[messageDecoder]
	switch role {
	case "system", "user":
		fs = plainMessageFields
	case "developer":
		fs, role = plainMessageFields, "system"
	case "assistant":
		fs = assistantMessageFields
	case "tool":
		fs = toolMessageFields
	default:
		return invalidValue(param+".role", role, "system", "developer", "user", "assistant", "tool")
	}
	d.Role = role
	return fs.decodeAt(d, obj, param)
}

// Each role has its own fields; role itself is read first, by decode.
var (
	plainMessageFields = newFields("",
		known[messageDecoder]("role"),
		optional("name", messageName),
		required("content", messageContent),
	)
	assistantMessageFields = newFields("",
		known[messageDecoder]("role"),
		optional("name", messageName),
		optional("content", messageContent),
		optional("audio", func(_ *messageDecoder, _ json.RawMessage, param string) *Error {
			return invalid(param, "unsupported_parameter", "Audio is not supported by this deployment's model.")
		}),
		optional("function_call", func(_ *messageDecoder, _ json.RawMessage, param string) *Error {
			return invalid(param, "unsupported_parameter", "The deprecated 'function_call' is not supported; use 'tool_calls'.")
		}),
		optional("refusal", func(d *messageDecoder, raw json.RawMessage, param string) *Error {
			r, e := asString(raw, param)
			if e != nil {
				return e
			}
			// An earlier refusal is what the assistant said.
			if d.Content == "" {
				d.Content = r
			}
			return nil
		}),
		optional("tool_calls", (*messageDecoder).toolCalls),
	)
	toolMessageFields = newFields("",
		known[messageDecoder]("role"),
		required("content", messageContent),
		required("tool_call_id", func(d *messageDecoder, raw json.RawMessage, param string) *Error {
			id, e := asString(raw, param)
			if e != nil {
				return e
			}
			// Clients may trim history, so an unknown ID is not an error;
			// the message is then sent without a tool name.
			d.ToolName = d.toolNames[id]
			return nil
		}),
	)
)

// messageName accepts a participant name and drops it: the runtime has no
// participant names.
func messageName(d *messageDecoder, raw json.RawMessage, param string) *Error {
	return ignoredString(d, raw, param)
}

func messageContent(d *messageDecoder, raw json.RawMessage, param string) (e *Error) {
	d.Content, e = decodeContent(raw, param, d.Role == "assistant")
	return e
}

// decodeContent decodes message content: a string, or an array of parts
// whose text is concatenated. Refusal parts count as text when
// refusalParts is set (for the assistant's own messages).
func decodeContent(raw json.RawMessage, param string, refusalParts bool) (string, *Error) {
	return decodeTextParts(raw, param, func(typ, p string) (string, []string, *Error) {
		switch typ {
		case "text":
			// A caching hint: the runtime caches the prompt's prefix itself.
			return typ, []string{"prompt_cache_breakpoint"}, nil
		case "refusal":
			if !refusalParts {
				return "", nil, invalidValue(p, typ, "text")
			}
		case "image_url", "input_audio", "file":
			return "", nil, invalid(p, "unsupported_content_type", fmt.Sprintf(
				"Content parts of type '%s' are not supported: this deployment's model accepts text only.", clip(typ)))
		default:
			return "", nil, invalidValue(p, typ, "text")
		}
		// A part holds its text in the member named by its type.
		return typ, nil, nil
	})
}

// partExtras are the members a text part may have besides its type and
// text (partKind), each of a JSON kind: an earlier output's annotations
// and logprobs, sent back with it, and a prompt caching hint. They change
// nothing in what the model is given.
var partExtras = map[string]string{
	"annotations":             "array",
	"logprobs":                "array",
	"prompt_cache_breakpoint": "object",
}

// A partKind tells for a content part's type, found at param, the member
// holding its text and the other members it may have besides type (of
// partExtras), or the error for a type that is not taken.
type partKind func(typ, param string) (textKey string, extra []string, e *Error)

// decodeTextParts decodes content: a string, or an array of parts whose
// text is concatenated without separator.
func decodeTextParts(raw json.RawMessage, param string, kind partKind) (string, *Error) {
	switch kindOf(raw) {
	case "string":
		return mustString(raw), nil
	case "array":
	default:
		return "", typeError(param, "one of a string or array of objects", raw)
	}
	var sb strings.Builder
	for j, it := range mustArray(raw) {
		p := param + "[" + strconv.Itoa(j) + "]"
		part, e := asObject(it, p)
		if e != nil {
			return "", e
		}
		typ, e := requiredString(part, "type", p+".type")
		if e != nil {
			return "", e
		}
		key, extra, e := kind(typ, p+".type")
		if e != nil {
			return "", e
		}
		for _, m := range part {
			if k := string(m.key); k != "type" && k != key && !slices.Contains(extra, k) {
				// Report the alphabetically first, as everywhere.
				k, _ := firstUnknownOf(part, append([]string{"type", key}, extra...)...)
				return "", unknownField(p + "." + k)
			}
		}
		for _, k := range extra {
			if v, ok := part.get(k); ok && kindOf(v) != partExtras[k] {
				return "", typeError(p+"."+k, article(partExtras[k]), v)
			}
		}
		s, e := requiredString(part, key, p+"."+key)
		if e != nil {
			return "", e
		}
		sb.WriteString(s)
	}
	return sb.String(), nil
}

// toolCalls decodes the tool calls of an assistant message and records
// their names for the tool messages that answer them.
func (d *messageDecoder) toolCalls(raw json.RawMessage, param string) *Error {
	items, e := asArray(raw, param)
	if e != nil || len(items) == 0 {
		return e
	}
	calls := make([]llm.ToolCall, len(items))
	for i, it := range items {
		p := param + "[" + strconv.Itoa(i) + "]"
		obj, e := asObject(it, p)
		if e != nil {
			return e
		}
		if e := refuseType(obj, p, "function", func(typ string) string {
			return "Tool calls of type '" + clip(typ) + "' are not supported by this deployment; only function calls are."
		}); e != nil {
			return e
		}
		if e := toolCallFields.decodeAt(&calls[i], obj, p); e != nil {
			return e
		}
		if d.toolNames == nil {
			d.toolNames = make(map[string]string)
		}
		d.toolNames[calls[i].ID] = calls[i].Name
	}
	d.ToolCalls = calls
	return nil
}

var toolCallFields = newFields("",
	required("id", set(asString, func(tc *llm.ToolCall) *string { return &tc.ID })),
	required("type", onlyFunctionType[llm.ToolCall]),
	required("function", func(tc *llm.ToolCall, raw json.RawMessage, param string) *Error {
		fn, e := asObject(raw, param)
		if e != nil {
			return e
		}
		return toolCallFunctionFields.decodeAt(tc, fn, param)
	}),
)

var toolCallFunctionFields = newFields("",
	required("name", set(asString, func(tc *llm.ToolCall) *string { return &tc.Name })),
	required("arguments", set(decodeArguments, func(tc *llm.ToolCall) *json.RawMessage { return &tc.Arguments })),
)

// decodeArguments decodes a tool call's arguments: a JSON object encoded
// as a string ("" counts as {}).
func decodeArguments(raw []byte, param string) (json.RawMessage, *Error) {
	args, e := asString(raw, param)
	if e != nil {
		return nil, e
	}
	args = strings.TrimSpace(args)
	if args == "" {
		// Some clients send "" for a call without arguments.
		args = "{}"
	}
	if !validJSON([]byte(args)) || args[0] != '{' {
		return nil, invalid(param, "invalid_value", "Invalid '"+param+"': expected a JSON object encoded as a string.")
	}
	return json.RawMessage(args), nil
}
