package openai

import (
	"encoding/json"
	"slices"
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
	return decodeToolList(raw, param, toolFields, func(t *llm.Tool) *llm.Tool { return t }, "function.name", notFunctionTool)
}

// notFunctionTool refuses a chat tool of another type than function
// (custom tools, which take free text rather than JSON arguments).
func notFunctionTool(typ string) string {
	return "Tools of type '" + clip(typ) + "' are not supported by this deployment; use tools of type 'function'."
}

// refuseType refuses the object obj at param when its type is set to
// anything but want, with the message other makes of it. It runs before
// the object's keys are checked: another type has other keys, and the
// answer should name its type, not the first key it does not share.
func refuseType(obj object, param, want string, other func(typ string) string) *Error {
	raw, ok := obj.get("type")
	if !ok || kindOf(raw) != "string" {
		return nil // the table reports it
	}
	if typ := mustString(raw); typ != want {
		return invalid(param+".type", "unsupported_value", other(typ))
	}
	return nil
}

// decodeToolList decodes an array of at most maxTools tools with table fs,
// refusing a tool of another type than function (with the message other
// makes of its type) and a name used twice (naming nameAt in the tool).
// It returns nil for an empty array.
func decodeToolList[T any](raw json.RawMessage, param string, fs *fields[T], tool func(*T) *llm.Tool, nameAt string,
	other func(typ string) string) ([]T, *Error) {
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
		if e := refuseType(t, p, "function", other); e != nil {
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

// decodeToolChoice maps tool_choice onto req, whose Tools are decoded
// already: "auto" (the default) leaves the model free, "none" offers no
// tools, "required" sets ForceTool to llm.ToolAny and a named function sets
// ForceTool to its name, which must be one of tools. The deployment API
// forces the call by constraining the output to a JSON schema
// (deployapi/generate.go), so a forced call always comes back.
func decodeToolChoice(raw json.RawMessage, param string, req *llm.Request) *Error {
	switch kindOf(raw) {
	case "string":
		switch v := mustString(raw); v {
		case "auto":
			return nil
		case "none":
			req.Tools = nil
			return nil
		case "required":
			if len(req.Tools) == 0 {
				return invalid(param, "invalid_value", "tool_choice 'required' needs at least one tool in 'tools'.")
			}
			req.ForceTool = llm.ToolAny
			return nil
		default:
			return invalidValue(param, v, "none", "auto", "required")
		}
	case "object":
		obj, _ := asObject(raw, param)
		if typ, _ := obj.get("type"); kindOf(typ) == "string" && mustString(typ) == "allowed_tools" {
			return allowedToolsChoiceFields.decode(req, obj)
		}
		if e := refuseType(obj, param, "function", notFunctionChoice); e != nil {
			return e
		}
		return toolChoiceFields.decode(req, obj)
	default:
		return typeError(param, "a string or an object", raw)
	}
}

func notFunctionChoice(typ string) string {
	return "tool_choice of type '" + clip(typ) + "' is not supported by this deployment; use 'auto', 'none', 'required', " +
		"a function or allowed_tools."
}

// allowedToolsChoiceFields decodes {"type":"allowed_tools","allowed_tools":
// {"mode":…,"tools":[{"type":"function","function":{"name":…}}]}}.
var allowedToolsChoiceFields = newFields("tool_choice",
	known[llm.Request]("type"),
	required("allowed_tools", func(req *llm.Request, raw json.RawMessage, param string) *Error {
		obj, e := asObject(raw, param)
		if e != nil {
			return e
		}
		var a allowedTools
		if e := allowedToolsFields.decode(&a, obj); e != nil {
			return e
		}
		return a.apply(req, param)
	}),
)

var allowedToolsFields = newFields("tool_choice.allowed_tools",
	required("mode", set(asString, func(a *allowedTools) *string { return &a.mode })),
	required("tools", func(a *allowedTools, raw json.RawMessage, param string) *Error {
		return a.decodeTools(raw, param, func(t object, p string) (string, *Error) {
			if e := refuseType(t, p, "function", notFunctionTool); e != nil {
				return "", e
			}
			if k, ok := firstUnknownOf(t, "type", "function"); ok {
				return "", unknownField(p + "." + k)
			}
			fn, ok := t.get("function")
			if !ok {
				return "", missing(p + ".function")
			}
			obj, e := asObject(fn, p+".function")
			if e != nil {
				return "", e
			}
			if k, ok := firstUnknownOf(obj, "name"); ok {
				return "", unknownField(p + ".function." + k)
			}
			return requiredString(obj, "name", p+".function.name")
		})
	}),
)

// allowedTools is an allowed_tools tool choice: the tools the model may
// call this time, out of those the request defines (which stay the same
// from request to request, for the runtime's prompt cache), and whether
// it must call one.
type allowedTools struct {
	mode  string
	names []string
}

// decodeTools decodes the tools array, each entry's name read by name.
func (a *allowedTools) decodeTools(raw json.RawMessage, param string, name func(t object, p string) (string, *Error)) *Error {
	items, e := asArray(raw, param)
	if e != nil {
		return e
	}
	if len(items) == 0 {
		return invalid(param, "empty_array", "Invalid '"+param+"': the allowed tools must name at least one tool.")
	}
	for i, it := range items {
		p := param + "[" + strconv.Itoa(i) + "]"
		t, e := asObject(it, p)
		if e != nil {
			return e
		}
		n, e := name(t, p)
		if e != nil {
			return e
		}
		a.names = append(a.names, n)
	}
	return nil
}

// apply keeps only the allowed tools of req (each must be one of them),
// and forces a call to one of them when the mode is required.
func (a *allowedTools) apply(req *llm.Request, param string) *Error {
	switch a.mode {
	case "auto", "required":
	default:
		return invalidValue(param+".mode", a.mode, "auto", "required")
	}
	kept := make([]llm.Tool, 0, len(a.names))
	for _, n := range a.names {
		i := slices.IndexFunc(req.Tools, func(t llm.Tool) bool { return t.Name == n })
		if i < 0 {
			return invalid(param+".tools", "invalid_value", "Invalid '"+param+".tools': function '"+clip(n)+"' is not among 'tools'.")
		}
		if !slices.ContainsFunc(kept, func(t llm.Tool) bool { return t.Name == n }) {
			kept = append(kept, req.Tools[i])
		}
	}
	req.Tools = kept
	if a.mode == "required" {
		req.ForceTool = llm.ToolAny
	}
	return nil
}

// toolChoiceFields decodes {"type":"function","function":{"name":…}}.
var toolChoiceFields = newFields("tool_choice",
	required("type", onlyFunctionType[llm.Request]),
	required("function", func(req *llm.Request, raw json.RawMessage, param string) *Error {
		fn, e := asObject(raw, param)
		if e != nil {
			return e
		}
		return toolChoiceFunctionFields.decode(req, fn)
	}),
)

var toolChoiceFunctionFields = newFields("tool_choice.function",
	required("name", func(req *llm.Request, raw json.RawMessage, param string) *Error {
		name, e := asString(raw, param)
		if e != nil {
			return e
		}
		for i := range req.Tools {
			if req.Tools[i].Name == name {
				req.ForceTool = name
				return nil
			}
		}
		// Named on tool_choice, the parameter a client sets: the function
		// is missing from tools, or tools is empty.
		return invalid("tool_choice", "invalid_value", "Invalid 'tool_choice': function '"+clip(name)+
			"' is not among 'tools'.")
	}),
)

// parallelToolCalls decodes parallel_tool_calls: false asks for at most
// one tool call, which the deployment API enforces by dropping any later
// call.
func parallelToolCalls(req *llm.Request, raw json.RawMessage, param string) *Error {
	v, e := asBool(raw, param)
	if !v {
		req.MaxToolCalls = 1
	}
	return e
}
