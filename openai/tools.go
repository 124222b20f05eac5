package openai

import (
	"encoding/json"
	"strconv"

	"github.com/hearthd/hearth/llm"
)

// maxTools is OpenAI's limit on tools.
const maxTools = 128

// validName reports whether s matches ^[a-zA-Z0-9_-]{1,64}$, OpenAI's rule
// for function and schema names.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// decodeTools decodes the tools a model may call: at most maxTools
// functions with unique names. It returns nil for an empty array.
func decodeTools(raw json.RawMessage, param string) ([]llm.Tool, *Error) {
	return decodeToolList(raw, param, toolFields, func(t *llm.Tool) *llm.Tool { return t }, "function.name")
}

// decodeToolList decodes an array of at most maxTools tools with table fs,
// refusing a name used twice (naming nameAt in the tool). It returns nil
// for an empty array.
func decodeToolList[T any](raw json.RawMessage, param string, fs *fields[T], tool func(*T) *llm.Tool, nameAt string) ([]T, *Error) {
	items, e := asArray(raw, param)
	if e != nil || len(items) == 0 {
		return nil, e
	}
	if len(items) > maxTools {
		return nil, arrayTooLong(param, maxTools, len(items))
	}
	tools := make([]T, len(items))
	for i, it := range items {
		p := param + "[" + strconv.Itoa(i) + "]"
		t, e := asObject(it, p)
		if e != nil {
			return nil, e
		}
		if e := fs.decodeAt(&tools[i], t, p); e != nil {
			return nil, e
		}
		// A linear scan: there are at most maxTools, and a set would
		// cost an allocation on every request with tools.
		name := tool(&tools[i]).Name
		for j := range i {
			if tool(&tools[j]).Name == name {
				return nil, invalid(p+"."+nameAt, "invalid_value", "Duplicate tool name '"+name+"'.")
			}
		}
	}
	return tools, nil
}

var toolFields = newFields("",
	required("type", onlyFunctionType[llm.Tool]),
	required("function", func(t *llm.Tool, raw json.RawMessage, param string) *Error {
		fn, e := asObject(raw, param)
		if e != nil {
			return e
		}
		if e := functionFields.decodeAt(t, fn, param); e != nil {
			return e
		}
		defaultParameters(t)
		return nil
	}),
)

var functionFields = newFields("",
	required("name", toolName),
	optional("description", set(asString, func(t *llm.Tool) *string { return &t.Description })),
	// Accepted either way: the schema is given to the model, but its
	// arguments are not constrained to it (see the package comment).
	optional("strict", acceptedBool[llm.Tool]),
	optional("parameters", set(rawObject, func(t *llm.Tool) *json.RawMessage { return &t.Parameters })),
)

// toolName decodes a function's name.
func toolName(t *llm.Tool, raw json.RawMessage, param string) (e *Error) {
	if t.Name, e = asString(raw, param); e != nil {
		return e
	}
	if !validName(t.Name) {
		return invalid(param, "invalid_value", "Invalid '"+param+
			"': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.")
	}
	return nil
}

// defaultParameters gives a function without parameters an empty
// parameter list, as OpenAI does.
func defaultParameters(t *llm.Tool) {
	if t.Parameters == nil {
		t.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
	}
}

// onlyFunctionType accepts the type "function", the only kind of tool and
// tool call there is here.
func onlyFunctionType[T any](_ *T, raw json.RawMessage, param string) *Error {
	typ, e := asString(raw, param)
	if e != nil {
		return e
	}
	if typ != "function" {
		return invalidValue(param, typ, "function")
	}
	return nil
}

// decodeToolChoice reports whether tools are offered to the model at all.
// Ollama decides on its own whether to call a tool; it cannot be made to
// call one. So only the choices it can honour are taken: "auto" (the
// default) and "none" (tools are not offered).
func decodeToolChoice(raw json.RawMessage, param string) (offer bool, e *Error) {
	switch kindOf(raw) {
	case "string":
		switch v := mustString(raw); v {
		case "auto":
			return true, nil
		case "none":
			return false, nil
		case "required":
			return false, invalid(param, "unsupported_value",
				"tool_choice 'required' is not supported by this deployment: the model decides on its own whether to call a tool. Use 'auto'.")
		default:
			return false, invalidValue(param, v, "none", "auto", "required")
		}
	case "object":
		return false, invalid(param, "unsupported_value",
			"Forcing a specific tool is not supported by this deployment: the model decides on its own whether to call a tool. Use 'auto'.")
	default:
		return false, typeError(param, "a string or an object", raw)
	}
}

// parallelToolCalls accepts true only: the model may call several tools
// at once, and nothing can stop it.
func parallelToolCalls[T any](_ *T, raw json.RawMessage, param string) *Error {
	return refuseBool(raw, param, false, "unsupported_value",
		"parallel_tool_calls false is not supported by this deployment: the model may call several tools at once.")
}
