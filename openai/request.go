package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hearthd/hearth/runtime"
)

// ChatRequest is a validated POST /chat/completions request.
type ChatRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	Runtime      runtime.Request
}

// Limits from OpenAI's API reference.
const (
	maxStop  = 4
	maxTools = 128
)

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

// object is a decoded JSON object whose null members have been removed, so
// that an explicit null reads as absent everywhere.
type object map[string]json.RawMessage

// DecodeChatRequest decodes and validates a chat completion request body for
// a deployment serving modelID. The mapping is in the package comment. The
// result shares no memory with body, so body may be reused afterwards.
func DecodeChatRequest(body []byte, modelID string) (*ChatRequest, *Error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, bodyError(err)
	}
	if top == nil { // the body was the literal null
		return nil, InvalidRequest("", "The request body must be a JSON object, but got null.")
	}
	obj := dropNulls(top)
	if k, ok := firstUnknown(obj, isTopLevelField); ok {
		return nil, unknownField(k)
	}

	model, e := requiredString(obj, "model", "model")
	if e != nil {
		return nil, e
	}
	if model != modelID {
		return nil, ModelNotFound(model)
	}
	r := &ChatRequest{Model: model}

	raw, ok := obj["messages"]
	if !ok {
		return nil, missing("messages")
	}
	if r.Runtime.Messages, e = decodeMessages(raw); e != nil {
		return nil, e
	}

	if e := decodeOptions(obj, &r.Runtime.Options); e != nil {
		return nil, e
	}
	if e := decodeResponseFormat(obj, &r.Runtime); e != nil {
		return nil, e
	}
	if e := decodeTools(obj, &r.Runtime); e != nil {
		return nil, e
	}
	if e := decodeStream(obj, r); e != nil {
		return nil, e
	}
	if e := checkUnsupported(obj); e != nil {
		return nil, e
	}
	return r, nil
}

func isTopLevelField(k string) bool {
	switch k {
	case "model", "messages", "temperature", "top_p", "max_tokens", "max_completion_tokens",
		"stop", "seed", "presence_penalty", "frequency_penalty", "response_format", "tools",
		"tool_choice", "stream", "stream_options", "user", "safety_identifier",
		"prompt_cache_key", "parallel_tool_calls", "n", "logit_bias", "logprobs",
		"top_logprobs", "store", "metadata", "service_tier", "modalities", "audio",
		"prediction", "reasoning_effort", "web_search_options", "functions", "function_call":
		return true
	}
	return false
}

func bodyError(err error) *Error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return InvalidRequest("", fmt.Sprintf(
			"We could not parse the JSON body of your request: %s (at byte offset %d).", syn.Error(), syn.Offset))
	case errors.As(err, &typ):
		return InvalidRequest("", "The request body must be a JSON object, but got "+article(typ.Value)+".")
	default:
		return InvalidRequest("", "We could not parse the JSON body of your request: "+err.Error()+".")
	}
}

func decodeOptions(obj object, o *runtime.Options) *Error {
	var e *Error
	if o.Temperature, e = optFloat(obj, "temperature", 0, 2); e != nil {
		return e
	}
	if o.TopP, e = optFloat(obj, "top_p", 0, 1); e != nil {
		return e
	}
	if o.PresencePenalty, e = optFloat(obj, "presence_penalty", -2, 2); e != nil {
		return e
	}
	if o.FrequencyPenalty, e = optFloat(obj, "frequency_penalty", -2, 2); e != nil {
		return e
	}
	if raw, ok := obj["seed"]; ok {
		n, e := asInt(raw, "seed", math.MinInt64, math.MaxInt64)
		if e != nil {
			return e
		}
		o.Seed = &n
	}

	// max_tokens is the older name of max_completion_tokens. Both may be
	// sent only if they agree: silently preferring one would hide a client
	// bug that changes the output length.
	maxTokens, e := optInt(obj, "max_tokens", 1, math.MaxInt32)
	if e != nil {
		return e
	}
	maxCompletion, e := optInt(obj, "max_completion_tokens", 1, math.MaxInt32)
	if e != nil {
		return e
	}
	switch {
	case maxTokens != nil && maxCompletion != nil && *maxTokens != *maxCompletion:
		return invalid("max_tokens", "invalid_value", fmt.Sprintf(
			"max_tokens (%d) and max_completion_tokens (%d) disagree; send only max_completion_tokens.",
			*maxTokens, *maxCompletion))
	case maxCompletion != nil:
		n := int(*maxCompletion)
		o.MaxTokens = &n
	case maxTokens != nil:
		n := int(*maxTokens)
		o.MaxTokens = &n
	}

	if raw, ok := obj["stop"]; ok {
		var stops []string
		switch kindOf(raw) {
		case "string":
			stops = []string{mustString(raw)}
		case "array":
			items := mustArray(raw)
			if len(items) > maxStop {
				return invalid("stop", "array_above_max_length", fmt.Sprintf(
					"Invalid 'stop': array too long. Expected an array with maximum length %d, but got an array with length %d instead.",
					maxStop, len(items)))
			}
			for i, it := range items {
				s, e := asString(it, "stop["+strconv.Itoa(i)+"]")
				if e != nil {
					return e
				}
				stops = append(stops, s)
			}
		default:
			return typeError("stop", "a string or an array of strings", raw)
		}
		// An empty stop sequence would end every generation at once;
		// OpenAI treats it as no stop sequence, and so do we.
		stops = slices.DeleteFunc(stops, func(s string) bool { return s == "" })
		if len(stops) > 0 {
			o.Stop = stops
		}
	}
	return nil
}

func decodeResponseFormat(obj object, req *runtime.Request) *Error {
	raw, ok := obj["response_format"]
	if !ok {
		return nil
	}
	rf, e := asObject(raw, "response_format")
	if e != nil {
		return e
	}
	typ, e := requiredString(rf, "type", "response_format.type")
	if e != nil {
		return e
	}
	switch typ {
	case "text":
		if k, ok := firstUnknown(rf, oneOf("type")); ok {
			return unknownField("response_format." + k)
		}
	case "json_object":
		if k, ok := firstUnknown(rf, oneOf("type")); ok {
			return unknownField("response_format." + k)
		}
		req.Format = json.RawMessage(`"json"`)
	case "json_schema":
		if k, ok := firstUnknown(rf, oneOf("type", "json_schema")); ok {
			return unknownField("response_format." + k)
		}
		jsRaw, ok := rf["json_schema"]
		if !ok {
			return missing("response_format.json_schema")
		}
		js, e := asObject(jsRaw, "response_format.json_schema")
		if e != nil {
			return e
		}
		if k, ok := firstUnknown(js, oneOf("name", "description", "schema", "strict")); ok {
			return unknownField("response_format.json_schema." + k)
		}
		if raw, ok := js["name"]; ok {
			name, e := asString(raw, "response_format.json_schema.name")
			if e != nil {
				return e
			}
			if !validName(name) {
				return invalid("response_format.json_schema.name", "invalid_value",
					"Invalid 'response_format.json_schema.name': must match ^[a-zA-Z0-9_-]{1,64}$.")
			}
		}
		if raw, ok := js["description"]; ok {
			if _, e := asString(raw, "response_format.json_schema.description"); e != nil {
				return e
			}
		}
		if raw, ok := js["strict"]; ok {
			// The schema is always enforced by constrained decoding, so
			// either value is honoured.
			if _, e := asBool(raw, "response_format.json_schema.strict"); e != nil {
				return e
			}
		}
		schema, ok := js["schema"]
		if !ok {
			return missing("response_format.json_schema.schema")
		}
		if _, e := asObject(schema, "response_format.json_schema.schema"); e != nil {
			return e
		}
		req.Format = schema
	default:
		return invalidValue("response_format.type", typ, "text", "json_object", "json_schema")
	}
	return nil
}

func decodeTools(obj object, req *runtime.Request) *Error {
	if _, ok := obj["functions"]; ok {
		return invalid("functions", "unsupported_parameter",
			"The deprecated 'functions' parameter is not supported; use 'tools'.")
	}
	if _, ok := obj["function_call"]; ok {
		return invalid("function_call", "unsupported_parameter",
			"The deprecated 'function_call' parameter is not supported; use 'tool_choice'.")
	}
	if raw, ok := obj["tools"]; ok {
		items, e := asArray(raw, "tools")
		if e != nil {
			return e
		}
		if len(items) > maxTools {
			return invalid("tools", "array_above_max_length", fmt.Sprintf(
				"Invalid 'tools': array too long. Expected an array with maximum length %d, but got an array with length %d instead.",
				maxTools, len(items)))
		}
		seen := make(map[string]bool, len(items))
		for i, it := range items {
			t, e := decodeTool(it, "tools["+strconv.Itoa(i)+"]")
			if e != nil {
				return e
			}
			if seen[t.Name] {
				return invalid("tools["+strconv.Itoa(i)+"].function.name", "invalid_value",
					"Duplicate tool name '"+t.Name+"'.")
			}
			seen[t.Name] = true
			req.Tools = append(req.Tools, t)
		}
	}
	if raw, ok := obj["tool_choice"]; ok {
		// Ollama decides on its own whether to call a tool; it cannot be
		// made to call one. So only the choices it can honour are taken:
		// "auto" (the default) and "none" (tools are not offered at all).
		switch kindOf(raw) {
		case "string":
			switch v := mustString(raw); v {
			case "auto":
			case "none":
				req.Tools = nil
			case "required":
				return invalid("tool_choice", "unsupported_value",
					"tool_choice 'required' is not supported by this deployment: the model decides on its own whether to call a tool. Use 'auto'.")
			default:
				return invalidValue("tool_choice", v, "none", "auto", "required")
			}
		case "object":
			return invalid("tool_choice", "unsupported_value",
				"Forcing a specific tool is not supported by this deployment: the model decides on its own whether to call a tool. Use 'auto'.")
		default:
			return typeError("tool_choice", "a string or an object", raw)
		}
	}
	if raw, ok := obj["parallel_tool_calls"]; ok {
		v, e := asBool(raw, "parallel_tool_calls")
		if e != nil {
			return e
		}
		if !v {
			return invalid("parallel_tool_calls", "unsupported_value",
				"parallel_tool_calls false is not supported by this deployment: the model may call several tools at once.")
		}
	}
	return nil
}

func decodeTool(raw json.RawMessage, param string) (runtime.Tool, *Error) {
	t, e := asObject(raw, param)
	if e != nil {
		return runtime.Tool{}, e
	}
	if k, ok := firstUnknown(t, oneOf("type", "function")); ok {
		return runtime.Tool{}, unknownField(param + "." + k)
	}
	typ, e := requiredString(t, "type", param+".type")
	if e != nil {
		return runtime.Tool{}, e
	}
	if typ != "function" {
		return runtime.Tool{}, invalidValue(param+".type", typ, "function")
	}
	fnRaw, ok := t["function"]
	if !ok {
		return runtime.Tool{}, missing(param + ".function")
	}
	param += ".function"
	fn, e := asObject(fnRaw, param)
	if e != nil {
		return runtime.Tool{}, e
	}
	if k, ok := firstUnknown(fn, oneOf("name", "description", "parameters", "strict")); ok {
		return runtime.Tool{}, unknownField(param + "." + k)
	}
	var tool runtime.Tool
	if tool.Name, e = requiredString(fn, "name", param+".name"); e != nil {
		return runtime.Tool{}, e
	}
	if !validName(tool.Name) {
		return runtime.Tool{}, invalid(param+".name", "invalid_value",
			"Invalid '"+param+".name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.")
	}
	if raw, ok := fn["description"]; ok {
		if tool.Description, e = asString(raw, param+".description"); e != nil {
			return runtime.Tool{}, e
		}
	}
	if raw, ok := fn["strict"]; ok {
		// Accepted either way: the schema is given to the model, but its
		// arguments are not constrained to it (see the package comment).
		if _, e := asBool(raw, param+".strict"); e != nil {
			return runtime.Tool{}, e
		}
	}
	if raw, ok := fn["parameters"]; ok {
		if _, e := asObject(raw, param+".parameters"); e != nil {
			return runtime.Tool{}, e
		}
		tool.Parameters = raw
	} else {
		// OpenAI: omitting parameters defines a function with an empty
		// parameter list.
		tool.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	return tool, nil
}

func decodeStream(obj object, r *ChatRequest) *Error {
	if raw, ok := obj["stream"]; ok {
		v, e := asBool(raw, "stream")
		if e != nil {
			return e
		}
		r.Stream = v
	}
	raw, ok := obj["stream_options"]
	if !ok {
		return nil
	}
	if !r.Stream {
		return invalid("stream_options", "invalid_value",
			"The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	so, e := asObject(raw, "stream_options")
	if e != nil {
		return e
	}
	if k, ok := firstUnknown(so, oneOf("include_usage", "include_obfuscation")); ok {
		return unknownField("stream_options." + k)
	}
	if raw, ok := so["include_usage"]; ok {
		if r.IncludeUsage, e = asBool(raw, "stream_options.include_usage"); e != nil {
			return e
		}
	}
	if raw, ok := so["include_obfuscation"]; ok {
		v, e := asBool(raw, "stream_options.include_obfuscation")
		if e != nil {
			return e
		}
		if v {
			return invalid("stream_options.include_obfuscation", "unsupported_value",
				"Stream obfuscation is not supported by this deployment; send include_obfuscation false or omit it.")
		}
	}
	return nil
}

// checkUnsupported validates the parameters that are accepted only with
// values that change nothing here.
func checkUnsupported(obj object) *Error {
	for _, k := range []string{"user", "safety_identifier", "prompt_cache_key"} {
		if raw, ok := obj[k]; ok {
			if _, e := asString(raw, k); e != nil {
				return e
			}
		}
	}
	if raw, ok := obj["n"]; ok {
		n, e := asInt(raw, "n", 1, math.MaxInt64)
		if e != nil {
			return e
		}
		if n != 1 {
			return invalid("n", "unsupported_value", "Only n=1 is supported by this deployment.")
		}
	}
	if raw, ok := obj["logit_bias"]; ok {
		m, e := asObject(raw, "logit_bias")
		if e != nil {
			return e
		}
		if len(m) > 0 {
			return invalid("logit_bias", "unsupported_parameter", "logit_bias is not supported by this deployment.")
		}
	}
	if raw, ok := obj["logprobs"]; ok {
		v, e := asBool(raw, "logprobs")
		if e != nil {
			return e
		}
		if v {
			return invalid("logprobs", "unsupported_parameter", "logprobs are not supported by this deployment.")
		}
	}
	if raw, ok := obj["top_logprobs"]; ok {
		n, e := asInt(raw, "top_logprobs", 0, 20)
		if e != nil {
			return e
		}
		if n != 0 {
			return invalid("top_logprobs", "unsupported_parameter", "logprobs are not supported by this deployment.")
		}
	}
	if raw, ok := obj["store"]; ok {
		v, e := asBool(raw, "store")
		if e != nil {
			return e
		}
		if v {
			return invalid("store", "unsupported_value", "Storing completions is not supported by this deployment; send store false or omit it.")
		}
	}
	if raw, ok := obj["metadata"]; ok {
		m, e := asObject(raw, "metadata")
		if e != nil {
			return e
		}
		if len(m) > 0 {
			return invalid("metadata", "unsupported_parameter", "metadata is only kept with stored completions, which this deployment does not support.")
		}
	}
	if raw, ok := obj["service_tier"]; ok {
		v, e := asString(raw, "service_tier")
		if e != nil {
			return e
		}
		if v != "auto" && v != "default" {
			return invalid("service_tier", "unsupported_value",
				"service_tier '"+v+"' is not supported by this deployment; use 'auto' or 'default'.")
		}
	}
	if raw, ok := obj["modalities"]; ok {
		items, e := asArray(raw, "modalities")
		if e != nil {
			return e
		}
		for i, it := range items {
			p := "modalities[" + strconv.Itoa(i) + "]"
			v, e := asString(it, p)
			if e != nil {
				return e
			}
			if v != "text" {
				return invalid(p, "unsupported_value", "Only the 'text' output modality is supported by this deployment.")
			}
		}
	}
	for _, k := range []string{"audio", "prediction", "reasoning_effort", "web_search_options"} {
		if _, ok := obj[k]; ok {
			return invalid(k, "unsupported_parameter", "'"+k+"' is not supported by this deployment's model.")
		}
	}
	return nil
}

// decodeMessages maps the messages array.
func decodeMessages(raw json.RawMessage) ([]runtime.Message, *Error) {
	items, e := asArray(raw, "messages")
	if e != nil {
		return nil, e
	}
	if len(items) == 0 {
		return nil, invalid("messages", "empty_array",
			"Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.")
	}
	msgs := make([]runtime.Message, 0, len(items))
	// toolNames maps the IDs of earlier assistant tool calls to their
	// function names, to name the tool a role tool message answers.
	toolNames := map[string]string{}
	for i, it := range items {
		m, e := decodeMessage(it, "messages["+strconv.Itoa(i)+"]", toolNames)
		if e != nil {
			return nil, e
		}
		msgs = append(msgs, m)
	}
	return msgs, nil
}

func decodeMessage(raw json.RawMessage, param string, toolNames map[string]string) (runtime.Message, *Error) {
	var m runtime.Message
	obj, e := asObject(raw, param)
	if e != nil {
		return m, e
	}
	role, e := requiredString(obj, "role", param+".role")
	if e != nil {
		return m, e
	}
	var allowed func(string) bool
	switch role {
	case "system", "developer", "user":
		allowed = oneOf("role", "content", "name")
		m.Role = role
		if role == "developer" {
			m.Role = "system"
		}
	case "assistant":
		allowed = oneOf("role", "content", "name", "tool_calls", "refusal", "audio", "function_call")
		m.Role = role
	case "tool":
		allowed = oneOf("role", "content", "tool_call_id")
		m.Role = role
	default:
		return m, invalidValue(param+".role", role, "system", "developer", "user", "assistant", "tool")
	}
	if k, ok := firstUnknown(obj, allowed); ok {
		return m, unknownField(param + "." + k)
	}
	if raw, ok := obj["name"]; ok {
		// The runtime has no participant names; the field is accepted
		// and dropped.
		if _, e := asString(raw, param+".name"); e != nil {
			return m, e
		}
	}

	if raw, ok := obj["content"]; ok {
		if m.Content, e = decodeContent(raw, param+".content", role); e != nil {
			return m, e
		}
	} else if role != "assistant" {
		return m, missing(param + ".content")
	}

	switch role {
	case "assistant":
		if _, ok := obj["audio"]; ok {
			return m, invalid(param+".audio", "unsupported_parameter", "Audio is not supported by this deployment's model.")
		}
		if _, ok := obj["function_call"]; ok {
			return m, invalid(param+".function_call", "unsupported_parameter",
				"The deprecated 'function_call' is not supported; use 'tool_calls'.")
		}
		if raw, ok := obj["refusal"]; ok {
			r, e := asString(raw, param+".refusal")
			if e != nil {
				return m, e
			}
			// An earlier refusal is what the assistant said.
			if m.Content == "" {
				m.Content = r
			}
		}
		if raw, ok := obj["tool_calls"]; ok {
			if m.ToolCalls, e = decodeToolCalls(raw, param+".tool_calls", toolNames); e != nil {
				return m, e
			}
		}
	case "tool":
		id, e := requiredString(obj, "tool_call_id", param+".tool_call_id")
		if e != nil {
			return m, e
		}
		// Clients may trim history, so an unknown ID is not an error; the
		// message is then sent without a tool name.
		m.ToolName = toolNames[id]
	}
	return m, nil
}

func decodeToolCalls(raw json.RawMessage, param string, toolNames map[string]string) ([]runtime.ToolCall, *Error) {
	items, e := asArray(raw, param)
	if e != nil {
		return nil, e
	}
	var calls []runtime.ToolCall
	for i, it := range items {
		p := param + "[" + strconv.Itoa(i) + "]"
		obj, e := asObject(it, p)
		if e != nil {
			return nil, e
		}
		if k, ok := firstUnknown(obj, oneOf("id", "type", "function")); ok {
			return nil, unknownField(p + "." + k)
		}
		var tc runtime.ToolCall
		if tc.ID, e = requiredString(obj, "id", p+".id"); e != nil {
			return nil, e
		}
		typ, e := requiredString(obj, "type", p+".type")
		if e != nil {
			return nil, e
		}
		if typ != "function" {
			return nil, invalidValue(p+".type", typ, "function")
		}
		fnRaw, ok := obj["function"]
		if !ok {
			return nil, missing(p + ".function")
		}
		p += ".function"
		fn, e := asObject(fnRaw, p)
		if e != nil {
			return nil, e
		}
		if k, ok := firstUnknown(fn, oneOf("name", "arguments")); ok {
			return nil, unknownField(p + "." + k)
		}
		if tc.Name, e = requiredString(fn, "name", p+".name"); e != nil {
			return nil, e
		}
		args, e := requiredString(fn, "arguments", p+".arguments")
		if e != nil {
			return nil, e
		}
		args = strings.TrimSpace(args)
		if args == "" {
			// Some clients send "" for a call without arguments.
			args = "{}"
		}
		if !json.Valid([]byte(args)) || args[0] != '{' {
			return nil, invalid(p+".arguments", "invalid_value",
				"Invalid '"+p+".arguments': expected a JSON object encoded as a string.")
		}
		tc.Arguments = json.RawMessage(args)
		toolNames[tc.ID] = tc.Name
		calls = append(calls, tc)
	}
	return calls, nil
}

// decodeContent maps message content: a string, or an array of parts whose
// text is concatenated.
func decodeContent(raw json.RawMessage, param, role string) (string, *Error) {
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
		field := typ
		switch typ {
		case "text":
		case "refusal":
			if role != "assistant" {
				return "", invalidValue(p+".type", typ, "text")
			}
		case "image_url", "input_audio", "file":
			return "", invalid(p+".type", "unsupported_content_type", fmt.Sprintf(
				"Content parts of type '%s' are not supported: this deployment's model accepts text only.", typ))
		default:
			return "", invalidValue(p+".type", typ, "text")
		}
		if k, ok := firstUnknown(part, oneOf("type", field)); ok {
			return "", unknownField(p + "." + k)
		}
		s, e := requiredString(part, field, p+"."+field)
		if e != nil {
			return "", e
		}
		sb.WriteString(s)
	}
	return sb.String(), nil
}

// JSON helpers. Every raw value reaching them comes from a body that
// encoding/json has already validated, so kindOf can look at the first
// byte and the must* helpers cannot fail.

func dropNulls(m map[string]json.RawMessage) object {
	for k, v := range m {
		if string(v) == "null" {
			delete(m, k)
		}
	}
	return object(m)
}

func kindOf(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return "null"
	}
	switch raw[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	if bytes.ContainsAny(raw, ".eE") {
		return "decimal"
	}
	return "integer"
}

func article(kind string) string {
	switch kind {
	case "integer", "array", "object":
		return "an " + kind
	case "decimal":
		return "a decimal number"
	case "null":
		return "null"
	case "bool":
		return "a boolean"
	case "number":
		return "a number"
	}
	return "a " + kind
}

func typeError(param, want string, raw []byte) *Error {
	return invalid(param, "invalid_type", fmt.Sprintf(
		"Invalid type for '%s': expected %s, but got %s instead.", param, want, article(kindOf(raw))))
}

func missing(param string) *Error {
	return invalid(param, "missing_required_parameter", "Missing required parameter: '"+param+"'.")
}

func unknownField(param string) *Error {
	return invalid(param, "unknown_parameter", "Unrecognized request argument supplied: "+param)
}

func invalidValue(param, got string, supported ...string) *Error {
	return invalid(param, "invalid_value", fmt.Sprintf("Invalid value: '%s'. Supported values are: '%s'.",
		got, strings.Join(supported, "', '")))
}

func oneOf(keys ...string) func(string) bool {
	return func(k string) bool { return slices.Contains(keys, k) }
}

// firstUnknown returns the alphabetically first key not allowed, so the
// error is the same on every run.
func firstUnknown(obj object, allowed func(string) bool) (string, bool) {
	var bad []string
	for k := range obj {
		if !allowed(k) {
			bad = append(bad, k)
		}
	}
	if len(bad) == 0 {
		return "", false
	}
	return slices.Min(bad), true
}

func mustString(raw []byte) string {
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

func mustArray(raw []byte) []json.RawMessage {
	var a []json.RawMessage
	_ = json.Unmarshal(raw, &a)
	return a
}

func asString(raw []byte, param string) (string, *Error) {
	if kindOf(raw) != "string" {
		return "", typeError(param, "a string", raw)
	}
	return mustString(raw), nil
}

func requiredString(obj object, key, param string) (string, *Error) {
	raw, ok := obj[key]
	if !ok {
		return "", missing(param)
	}
	return asString(raw, param)
}

func asBool(raw []byte, param string) (bool, *Error) {
	if kindOf(raw) != "boolean" {
		return false, typeError(param, "a boolean", raw)
	}
	return bytes.Equal(bytes.TrimSpace(raw), []byte("true")), nil
}

func asArray(raw []byte, param string) ([]json.RawMessage, *Error) {
	if kindOf(raw) != "array" {
		return nil, typeError(param, "an array", raw)
	}
	return mustArray(raw), nil
}

func asObject(raw []byte, param string) (object, *Error) {
	if kindOf(raw) != "object" {
		return nil, typeError(param, "an object", raw)
	}
	var m map[string]json.RawMessage
	_ = json.Unmarshal(raw, &m)
	return dropNulls(m), nil
}

func formatNumber(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func optFloat(obj object, key string, lo, hi float64) (*float64, *Error) {
	raw, ok := obj[key]
	if !ok {
		return nil, nil
	}
	if k := kindOf(raw); k != "integer" && k != "decimal" {
		return nil, typeError(key, "a decimal", raw)
	}
	// The syntax is valid, so the only possible error is a range error,
	// where f is ±Inf and the bounds below catch it.
	f, _ := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
	switch {
	case f > hi:
		return nil, invalid(key, "decimal_above_max_value", fmt.Sprintf(
			"Invalid '%s': decimal above maximum value. Expected a value <= %s, but got %s instead.",
			key, formatNumber(hi), bytes.TrimSpace(raw)))
	case f < lo:
		return nil, invalid(key, "decimal_below_min_value", fmt.Sprintf(
			"Invalid '%s': decimal below minimum value. Expected a value >= %s, but got %s instead.",
			key, formatNumber(lo), bytes.TrimSpace(raw)))
	}
	return &f, nil
}

func optInt(obj object, key string, lo, hi int64) (*int64, *Error) {
	raw, ok := obj[key]
	if !ok {
		return nil, nil
	}
	n, e := asInt(raw, key, lo, hi)
	if e != nil {
		return nil, e
	}
	return &n, nil
}

func asInt(raw []byte, param string, lo, hi int64) (int64, *Error) {
	if kindOf(raw) != "integer" {
		return 0, typeError(param, "an integer", raw)
	}
	s := string(bytes.TrimSpace(raw))
	n, err := strconv.ParseInt(s, 10, 64)
	switch {
	case (err != nil && s[0] != '-') || n > hi:
		return 0, invalid(param, "integer_above_max_value", fmt.Sprintf(
			"Invalid '%s': integer above maximum value. Expected a value <= %d, but got %s instead.", param, hi, s))
	case err != nil || n < lo:
		return 0, invalid(param, "integer_below_min_value", fmt.Sprintf(
			"Invalid '%s': integer below minimum value. Expected a value >= %d, but got %s instead.", param, lo, s))
	}
	return n, nil
}
