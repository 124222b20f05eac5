package openai

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/hearthd/hearth/llm"
)

// ResponsesRequest is a validated POST /responses request.
type ResponsesRequest struct {
	Model   string
	Stream  bool
	Runtime llm.Request
	// Truncate is truncation "auto": the oldest input items are dropped
	// to fit the context (the caller knows it: TruncateInput).
	Truncate bool
	// sealer seals each reasoning item's thinking into its
	// encrypted_content (include reasoning.encrypted_content); nil when
	// not asked for.
	sealer Sealer
	// logprobs: include message.output_text.logprobs.
	logprobs bool
	// echo is the request's settings as every response object repeats
	// them: JSON members, each followed by a comma. Encoded once here so
	// that the events that carry the whole response do not re-encode them.
	echo string
}

// DecodeResponsesRequest decodes and validates a Responses API request body
// for a deployment serving modelID. The mapping is in the package comment.
// The result shares no memory with body.
func DecodeResponsesRequest(body []byte, modelID string, sealer Sealer) (*ResponsesRequest, *Error) {
	obj, e := decodeBody(body)
	if e != nil {
		return nil, e
	}
	d := &responsesDecoder{modelID: modelID, sealer: sealer, parallel: true}
	if e := responsesFields.decode(d, obj); e != nil {
		return nil, e
	}
	if d.context != "all_turns" {
		currentTurnThinking(d.input)
	}
	// The instructions come first, whatever the order of the members.
	if d.instructions != nil {
		d.Runtime.Messages = append([]llm.Message{{Role: "system", Content: *d.instructions}}, d.input...)
	} else {
		d.Runtime.Messages = d.input
	}
	d.Runtime.Messages = withVerbosity(d.Runtime.Messages, d.verbosity)
	if d.maxToolCalls != nil {
		if e := d.limitToolCalls(*d.maxToolCalls); e != nil {
			return nil, e
		}
	}
	d.echo = string(d.appendEcho(nil))
	return &d.ResponsesRequest, nil
}

// currentTurnThinking drops the thinking of the assistant's messages
// before the last user message (reasoning.context current_turn): a model
// sees only the reasoning of the turn it is in, as reasoning models are
// trained to.
func currentTurnThinking(msgs []llm.Message) {
	last := -1
	for i, m := range msgs {
		if m.Role == "user" {
			last = i
		}
	}
	for i := range last {
		msgs[i].Thinking = ""
	}
}

// limitToolCalls applies max_tool_calls: at most n tool calls come back
// (later ones are dropped, as parallel_tool_calls false drops all but
// the first); none offers the model no tools.
func (d *responsesDecoder) limitToolCalls(n int) *Error {
	if n > 0 {
		d.Runtime.MaxToolCalls = fewerToolCalls(d.Runtime.MaxToolCalls, n)
		return nil
	}
	if d.Runtime.ForceTool != "" {
		return invalid("max_tool_calls", "invalid_value",
			"max_tool_calls 0 allows no tool call, but tool_choice requires one.")
	}
	d.Runtime.Tools = nil
	return nil
}

// responsesDecoder is the state of one DecodeResponsesRequest call: the
// request, and what the response echoes of it.
type responsesDecoder struct {
	ResponsesRequest
	modelID string
	sealer  Sealer

	input        []llm.Message
	instructions *string
	tools        []responsesTool // as sent, also when tool_choice none drops them
	toolChoice   string          // "auto", "none", "required", or a function's name
	namedChoice  bool            // toolChoice names a function
	parallel     bool
	format       textFormat
	metadata     [][2]string // sorted by key
	effort       string
	// Echoed back, else ignored.
	user, safetyID, cacheKey *string
	summary                  string // reasoning.summary
	verbosity                string // text.verbosity
	truncation               string
	topLogprobs              int
	maxToolCalls             *int
	allowed                  json.RawMessage // tool_choice of type allowed_tools, as sent
	// context is reasoning.context: which reasoning items of the input
	// the model is shown.
	context string
}

// textFormat is text.format as the response echoes it.
type textFormat struct {
	typ, name, description string
	schema                 json.RawMessage
	strict                 *bool
}

// responsesTool is a function tool in the Responses API's flat shape.
type responsesTool struct {
	llm.Tool
	strict *bool
}

// responsesFields is the one list of the top-level fields of a Responses
// request, in decoding order: tool_choice follows tools, stream_options
// follows stream. The package comment documents the same fields.
var responsesFields = newFields("",
	required("model", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Model, e = decodeModel(raw, param, d.modelID)
		return e
	}),
	required("input", (*responsesDecoder).decodeInput),
	optional("instructions", setPtr(asString, func(d *responsesDecoder) **string { return &d.instructions })),

	optional("temperature", setPtr(floatIn(0, 2), func(d *responsesDecoder) **float64 { return &d.Runtime.Options.Temperature })),
	optional("top_p", setPtr(floatIn(0, 1), func(d *responsesDecoder) **float64 { return &d.Runtime.Options.TopP })),
	optional("max_output_tokens", setPtr(maxTokens, func(d *responsesDecoder) **int { return &d.Runtime.Options.MaxTokens })),
	optional("text", func(d *responsesDecoder, raw json.RawMessage, param string) *Error {
		return nested(d, raw, param, textFields)
	}),
	optional("reasoning", func(d *responsesDecoder, raw json.RawMessage, param string) *Error {
		return nested(d, raw, param, reasoningFields)
	}),
	optional("include", (*responsesDecoder).decodeInclude),
	optional("top_logprobs", func(d *responsesDecoder, raw json.RawMessage, param string) *Error {
		n, e := asInt(raw, param, 0, 20)
		d.topLogprobs = int(n)
		if d.logprobs {
			d.Runtime.Options.TopLogprobs = d.topLogprobs
		}
		return e
	}),

	optional("tools", (*responsesDecoder).decodeTools),
	optional("tool_choice", (*responsesDecoder).decodeToolChoice),
	optional("parallel_tool_calls", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.parallel, e = asBool(raw, param)
		if !d.parallel {
			d.Runtime.MaxToolCalls = fewerToolCalls(d.Runtime.MaxToolCalls, 1)
		}
		return e
	}),
	optional("max_tool_calls", func(d *responsesDecoder, raw json.RawMessage, param string) *Error {
		n, e := asInt(raw, param, 0, math.MaxInt32)
		if e == nil {
			m := int(n)
			d.maxToolCalls = &m
		}
		return e
	}),

	optional("stream", set(asBool, func(d *responsesDecoder) *bool { return &d.Stream })),
	optional("stream_options", func(d *responsesDecoder, raw json.RawMessage, param string) *Error {
		if !d.Stream {
			return invalid(param, "invalid_value",
				"The 'stream_options' parameter is only allowed when 'stream' is enabled.")
		}
		return nested(d, raw, param, responsesStreamOptionsFields)
	}),

	optional("metadata", (*responsesDecoder).decodeMetadata),
	optional("user", setPtr(asString, func(d *responsesDecoder) **string { return &d.user })),
	optional("safety_identifier", setPtr(asString, func(d *responsesDecoder) **string { return &d.safetyID })),
	optional("prompt_cache_key", setPtr(asString, func(d *responsesDecoder) **string { return &d.cacheKey })),
	optional("service_tier", defaultServiceTier[responsesDecoder]),
	optional("truncation", func(d *responsesDecoder, raw json.RawMessage, param string) *Error {
		v, e := asString(raw, param)
		if e != nil {
			return e
		}
		switch v {
		case "auto":
			d.Truncate = true
		case "disabled":
		default:
			return invalidValue(param, v, "auto", "disabled")
		}
		d.truncation = v
		return nil
	}),
	optional("context_management", decodeContextManagement),
	optional("moderation", noModeration[responsesDecoder]),
	optional("prompt_cache_retention", ignoredString[responsesDecoder]),
	optional("prompt_cache_options", ignoredObject[responsesDecoder]),
	optional("access_programs", ignoredObject[responsesDecoder]),
	optional("background_options", ignoredObject[responsesDecoder]),
	optional("image", ignoredObject[responsesDecoder]),

	// State kept between requests: this deployment keeps none.
	optional("store", func(_ *responsesDecoder, raw json.RawMessage, param string) *Error {
		return refuseBool(raw, param, true, "unsupported_value",
			"Storing responses is not supported by this deployment; send store false or omit it.")
	}),
	optional("previous_response_id", notStored[responsesDecoder]),
	optional("conversation", notStored[responsesDecoder]),
	optional("prompt", notStored[responsesDecoder]),
	optional("background", func(_ *responsesDecoder, raw json.RawMessage, param string) *Error {
		return refuseBool(raw, param, true, "unsupported_value",
			"Background responses are not supported by this deployment: they are stored. Send background false or omit it.")
	}),
)

// notStored refuses any value of a parameter that refers to a stored
// object: this deployment stores no responses, conversations or prompts.
func notStored[T any](_ *T, _ json.RawMessage, param string) *Error {
	return invalid(param, "unsupported_parameter", "'"+param+
		"' is not supported by this deployment: it stores no responses, conversations or prompts. Send the whole conversation in 'input'.")
}

var responsesStreamOptionsFields = newFields("stream_options",
	optional("include_obfuscation", func(_ *responsesDecoder, raw json.RawMessage, param string) *Error {
		return refuseBool(raw, param, true, "unsupported_value",
			"Stream obfuscation is not supported by this deployment; send include_obfuscation false or omit it.")
	}),
)

var reasoningFields = newFields("reasoning",
	optional("effort", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.effort, d.Runtime.Options.Think, e = decodeEffort(raw, param)
		return e
	}),
	// No summary is made: the thinking itself comes back, as reasoning
	// text. The setting is echoed.
	optional("summary", reasoningSummary),
	optional("generate_summary", reasoningSummary),
	optional("context", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.context, e = asString(raw, param)
		switch d.context {
		case "auto", "current_turn", "all_turns":
		default:
			if e == nil {
				e = invalidValue(param, d.context, "auto", "current_turn", "all_turns")
			}
		}
		return e
	}),
	optional("mode", onlyValue[responsesDecoder]("standard")),
)

func reasoningSummary(d *responsesDecoder, raw json.RawMessage, param string) *Error {
	v, e := asString(raw, param)
	if e != nil {
		return e
	}
	switch v {
	case "auto", "concise", "detailed":
	default:
		return invalidValue(param, v, "auto", "concise", "detailed")
	}
	d.summary = v
	return nil
}

// includable are the values of include: the reasoning sealed and the
// logprobs are given; the others are outputs of built-in tools or image
// inputs, which this deployment never has, so there is nothing to add.
var includable = []string{
	"reasoning.encrypted_content", "message.output_text.logprobs",
	"web_search_call.action.sources", "web_search_call.results", "code_interpreter_call.outputs",
	"computer_call_output.output.image_url", "file_search_call.results", "message.input_image.image_url",
}

// decodeInclude decodes include: reasoning.encrypted_content seals each
// reasoning item's thinking into its encrypted_content, which a later
// request may send back in its input (OpenAI's stateless reasoning);
// message.output_text.logprobs gives each output token's log probability,
// with top_logprobs alternatives.
func (d *responsesDecoder) decodeInclude(raw json.RawMessage, param string) *Error {
	return eachString(raw, param, func(v, p string) *Error {
		switch v {
		case "reasoning.encrypted_content":
			if d.sealer == nil {
				return invalid(p, "unsupported_value", "Encrypted reasoning is not available on this deployment.")
			}
			d.ResponsesRequest.sealer = d.sealer
		case "message.output_text.logprobs":
			d.logprobs = true
			d.Runtime.Options.Logprobs = true
			d.Runtime.Options.TopLogprobs = d.topLogprobs
		default:
			if !slices.Contains(includable, v) {
				return invalidValue(p, v, includable...)
			}
		}
		return nil
	})
}

// decodeContextManagement accepts context_management entries (server-side
// compaction) and does nothing with them: a request carries its whole
// conversation, which truncation "auto" fits to the context.
func decodeContextManagement(_ *responsesDecoder, raw json.RawMessage, param string) *Error {
	return eachElement(raw, param, func(it json.RawMessage, p string) *Error {
		obj, e := asObject(it, p)
		if e != nil {
			return e
		}
		return contextManagementFields.decodeAt(&struct{}{}, obj, p)
	})
}

var contextManagementFields = newFields("",
	required("type", set(asString, func(*struct{}) *string { return new(string) })),
	optional("compact_threshold", func(_ *struct{}, raw json.RawMessage, param string) *Error {
		_, e := asInt(raw, param, 0, math.MaxInt64)
		return e
	}),
)

// decodeInput decodes input: a string (one user message) or a non-empty
// array of items.
func (d *responsesDecoder) decodeInput(raw json.RawMessage, param string) *Error {
	if kindOf(raw) == "string" {
		d.input = []llm.Message{{Role: "user", Content: mustString(raw)}}
		return nil
	}
	items, e := asArray(raw, param)
	if e != nil {
		return typeError(param, "a string or an array of input items", raw)
	}
	if len(items) == 0 {
		return invalid(param, "empty_array", "Invalid '"+param+
			"': empty array. Expected an array with minimum length 1, but got an empty array instead.")
	}
	in := &inputDecoder{msgs: make([]llm.Message, 0, len(items)), sealer: d.sealer}
	for i, it := range items {
		if e := in.item(it, param+"["+strconv.Itoa(i)+"]"); e != nil {
			return e
		}
	}
	d.input = in.msgs
	return nil
}

// inputDecoder turns input items into messages, in order.
type inputDecoder struct {
	msgs []llm.Message
	cur  inputItem
	// toolNames maps the call IDs of earlier function calls to their
	// names, to name the tool a function_call_output answers.
	toolNames map[string]string
	sealer    Sealer
	// thinking is the reasoning of the assistant output that follows:
	// reasoning items come before the message or calls they led to.
	thinking strings.Builder
}

// assistant returns the assistant message the next output item joins:
// the last message if it is the assistant's and no reasoning came since,
// else a new one, which takes the reasoning.
func (in *inputDecoder) assistant() *llm.Message {
	if n := len(in.msgs); n > 0 && in.msgs[n-1].Role == "assistant" && in.thinking.Len() == 0 {
		return &in.msgs[n-1]
	}
	in.msgs = append(in.msgs, llm.Message{Role: "assistant", Thinking: in.thinking.String()})
	in.thinking.Reset()
	return &in.msgs[len(in.msgs)-1]
}

// inputItem is the item being decoded.
type inputItem struct {
	msg    llm.Message
	call   llm.ToolCall
	callID string
	sealed bool // a reasoning item's thinking came sealed
}

// Input item types that are another API's built-in tools or need stored
// state; the error says so rather than only listing the supported ones.
var builtinItemTypes = []string{
	"item_reference", "file_search_call", "computer_call", "computer_call_output", "web_search_call",
	"image_generation_call", "code_interpreter_call", "local_shell_call", "local_shell_call_output",
	"shell_call", "shell_call_output", "apply_patch_call", "apply_patch_call_output", "mcp_list_tools",
	"mcp_approval_request", "mcp_approval_response", "mcp_call", "custom_tool_call", "custom_tool_call_output",
	"compaction",
}

func (in *inputDecoder) item(raw json.RawMessage, param string) *Error {
	obj, e := asObject(raw, param)
	if e != nil {
		return e
	}
	typ := "message" // an easy input message has no type
	if raw, ok := obj.get("type"); ok {
		if typ, e = asString(raw, param+".type"); e != nil {
			return e
		}
	}
	in.cur = inputItem{}
	switch typ {
	case "message":
		if e := in.messageRole(obj, param); e != nil {
			return e
		}
		if e := messageItemFields.decodeAt(in, obj, param); e != nil {
			return e
		}
		if in.cur.msg.Role == "assistant" {
			m := in.cur.msg
			if in.thinking.Len() > 0 {
				m.Thinking = in.thinking.String()
				in.thinking.Reset()
			}
			in.msgs = append(in.msgs, m)
		} else {
			in.msgs = append(in.msgs, in.cur.msg)
		}
	case "function_call":
		if e := functionCallItemFields.decodeAt(in, obj, param); e != nil {
			return e
		}
		c := in.cur.call
		if in.toolNames == nil {
			in.toolNames = make(map[string]string)
		}
		in.toolNames[c.ID] = c.Name
		// Calls that follow an assistant turn belong to it, as the
		// tool_calls of one chat message.
		m := in.assistant()
		m.ToolCalls = append(m.ToolCalls, c)
	case "function_call_output":
		if e := functionCallOutputItemFields.decodeAt(in, obj, param); e != nil {
			return e
		}
		// An output answers a call made earlier in the input, as OpenAI
		// requires: a model shown a result of no call of its own is
		// shown a conversation that never happened.
		name, ok := in.toolNames[in.cur.callID]
		if !ok {
			return invalid("input", "", "No tool call found for function call output with call_id "+clip(in.cur.callID)+".")
		}
		in.cur.msg.Role = "tool"
		if in.cur.msg.ToolName == "" {
			in.cur.msg.ToolName = name
		}
		in.msgs = append(in.msgs, in.cur.msg)
	case "reasoning":
		// An earlier answer's thinking, sent back as SDKs do with a whole
		// output: the model is shown it again with the output it led to
		// (as the runtime's thinking of that assistant message).
		return reasoningItemFields.decodeAt(in, obj, param)
	default:
		if slices.Contains(builtinItemTypes, typ) {
			return invalid(param+".type", "unsupported_value", "Input items of type '"+typ+
				"' are not supported by this deployment: it keeps no state and runs no built-in tools.")
		}
		return invalidValue(param+".type", typ, "message", "function_call", "function_call_output", "reasoning")
	}
	return nil
}

func (in *inputDecoder) messageRole(obj object, param string) *Error {
	role, e := requiredString(obj, "role", param+".role")
	if e != nil {
		return e
	}
	switch role {
	case "user", "system", "assistant":
	case "developer":
		role = "system"
	default:
		return invalidValue(param+".role", role, "user", "system", "developer", "assistant")
	}
	in.cur.msg.Role = role
	return nil
}

var (
	messageItemFields = newFields("",
		known[inputDecoder]("type"),
		known[inputDecoder]("role"),
		required("content", func(in *inputDecoder, raw json.RawMessage, param string) (e *Error) {
			in.cur.msg.Content, e = decodeInputContent(raw, param, in.cur.msg.Role == "assistant")
			return e
		}),
		// An earlier output message sent back carries its ID and status.
		optional("id", ignoredString[inputDecoder]),
		optional("status", ignoredString[inputDecoder]),
		optional("phase", ignoredString[inputDecoder]),
	)
	// What a function call item carries besides its call: its ID and
	// status as output, and, for tools this deployment does not have
	// (namespaces, programmatic callers, asynchronous calls), where it
	// came from: accepted and ignored.
	callExtras = []field[inputDecoder]{
		optional("id", ignoredString[inputDecoder]),
		optional("status", ignoredString[inputDecoder]),
		optional("namespace", ignoredString[inputDecoder]),
		optional("caller", ignoredObject[inputDecoder]),
	}
	functionCallItemFields = newFields("", slices.Concat([]field[inputDecoder]{
		known[inputDecoder]("type"),
		required("call_id", set(asString, func(in *inputDecoder) *string { return &in.cur.call.ID })),
		required("name", set(asString, func(in *inputDecoder) *string { return &in.cur.call.Name })),
		required("arguments", set(decodeArguments, func(in *inputDecoder) *json.RawMessage { return &in.cur.call.Arguments })),
		optional("async", acceptedBool[inputDecoder]),
	}, callExtras)...)
	functionCallOutputItemFields = newFields("", slices.Concat([]field[inputDecoder]{
		known[inputDecoder]("type"),
		required("call_id", set(asString, func(in *inputDecoder) *string { return &in.cur.callID })),
		required("output", func(in *inputDecoder, raw json.RawMessage, param string) (e *Error) {
			in.cur.msg.Content, e = decodeInputContent(raw, param, false)
			return e
		}),
		// The function's name, which newer clients send along.
		optional("name", set(asString, func(in *inputDecoder) *string { return &in.cur.msg.ToolName })),
	}, callExtras)...)
	reasoningItemFields = newFields("",
		known[inputDecoder]("type"),
		optional("id", ignoredString[inputDecoder]),
		optional("status", ignoredString[inputDecoder]),
		// A summary is the model's own account of its thinking, which
		// the thinking itself (content, or sealed) stands for.
		optional("summary", func(_ *inputDecoder, raw json.RawMessage, param string) *Error {
			_, e := decodeReasoningText(raw, param, "summary_text")
			return e
		}),
		// Decoded before content: the sealed thinking is the node's own
		// and takes the place of the plain one.
		optional("encrypted_content", (*inputDecoder).encryptedContent),
		optional("content", func(in *inputDecoder, raw json.RawMessage, param string) *Error {
			text, e := decodeReasoningText(raw, param, "reasoning_text")
			if e == nil && !in.cur.sealed {
				in.addThinking(text)
			}
			return e
		}),
	)
)

// reasoningAD binds a sealed reasoning to its use: a value sealed by the
// node for anything else does not open as one.
var reasoningAD = []byte("hearth responses reasoning v1")

// encryptedContent opens a reasoning item's sealed thinking, which this
// node made (include reasoning.encrypted_content).
func (in *inputDecoder) encryptedContent(raw json.RawMessage, param string) *Error {
	s, e := asString(raw, param)
	if e != nil {
		return e
	}
	sealed, err := base64.StdEncoding.DecodeString(s)
	var text []byte
	if err == nil && in.sealer != nil {
		text, err = in.sealer.Open(nil, sealed, reasoningAD)
	}
	if err != nil || in.sealer == nil {
		return invalid(param, "invalid_encrypted_content", "The encrypted content of this reasoning item could not be verified: "+
			"it was not made by this deployment, or the deployment was reset since. Send the item without it, or leave the item out.")
	}
	in.addThinking(string(text))
	in.cur.sealed = true
	return nil
}

func (in *inputDecoder) addThinking(s string) {
	if s == "" {
		return
	}
	if in.thinking.Len() > 0 {
		in.thinking.WriteByte('\n')
	}
	in.thinking.WriteString(s)
}

// decodeReasoningText decodes a reasoning item's summary or content: an
// array of parts of type typ, their texts joined by line breaks.
func decodeReasoningText(raw json.RawMessage, param, typ string) (string, *Error) {
	items, e := asArray(raw, param)
	if e != nil {
		return "", e
	}
	var sb strings.Builder
	for i, it := range items {
		p := param + "[" + strconv.Itoa(i) + "]"
		part, e := asObject(it, p)
		if e != nil {
			return "", e
		}
		got, e := requiredString(part, "type", p+".type")
		if e != nil {
			return "", e
		}
		if got != typ {
			return "", invalidValue(p+".type", got, typ)
		}
		if k, ok := firstUnknownOf(part, "type", "text"); ok {
			return "", unknownField(p + "." + k)
		}
		text, e := requiredString(part, "text", p+".text")
		if e != nil {
			return "", e
		}
		if sb.Len() > 0 {
			sb.WriteByte('\n')
		}
		sb.WriteString(text)
	}
	return sb.String(), nil
}

// fewerToolCalls is the tighter of two limits on tool calls, 0 being none.
func fewerToolCalls(cur, n int) int {
	if cur == 0 || n < cur {
		return n
	}
	return cur
}

// decodeInputContent decodes the content of an input message or a
// function call's output: a string, or an array of text parts
// concatenated without separator. Refusal parts count as text in the
// assistant's own messages.
func decodeInputContent(raw json.RawMessage, param string, assistant bool) (string, *Error) {
	return decodeTextParts(raw, param, func(typ, p string) (string, []string, *Error) {
		switch typ {
		case "input_text":
			// A caching hint: the runtime caches the prompt's prefix itself.
			return "text", []string{"prompt_cache_breakpoint"}, nil
		case "output_text":
			// Sent back from an earlier output, with its annotations.
			return "text", []string{"annotations", "logprobs"}, nil
		case "refusal":
			if !assistant {
				return "", nil, invalidValue(p, typ, "input_text", "output_text")
			}
			return "refusal", nil, nil
		case "input_image", "input_file", "input_audio":
			return "", nil, invalid(p, "unsupported_content_type",
				"Content parts of type '"+typ+"' are not supported: this deployment's model accepts text only.")
		default:
			return "", nil, invalidValue(p, typ, "input_text", "output_text")
		}
	})
}

var textFields = newFields("text",
	optional("format", (*responsesDecoder).textFormat),
	optional("verbosity", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.verbosity, e = decodeVerbosity(raw, param)
		return e
	}),
)

// textFormat decodes text.format, whose allowed keys depend on its type,
// into Runtime.Format as chat's response_format.
func (d *responsesDecoder) textFormat(raw json.RawMessage, param string) *Error {
	obj, e := asObject(raw, param)
	if e != nil {
		return e
	}
	typ, e := requiredString(obj, "type", param+".type")
	if e != nil {
		return e
	}
	d.format.typ = typ
	switch typ {
	case "text", "json_object":
		if k, ok := firstUnknownOf(obj, "type"); ok {
			return unknownField(param + "." + k)
		}
		if typ == "json_object" {
			d.Runtime.Format = json.RawMessage(`"json"`)
		}
		return nil
	case "json_schema":
		return textFormatSchemaFields.decode(d, obj)
	default:
		return invalidValue(param+".type", typ, "text", "json_object", "json_schema")
	}
}

var textFormatSchemaFields = newFields("text.format",
	known[responsesDecoder]("type"),
	required("name", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.format.name, e = schemaName(raw, param)
		return e
	}),
	optional("description", set(asString, func(d *responsesDecoder) *string { return &d.format.description })),
	// The schema is always enforced by constrained decoding, so either
	// value of strict is honoured.
	optional("strict", setPtr(asBool, func(d *responsesDecoder) **bool { return &d.format.strict })),
	required("schema", func(d *responsesDecoder, raw json.RawMessage, param string) (e *Error) {
		d.format.schema, e = schemaObject(raw, param, "text.format")
		d.Runtime.Format = d.format.schema
		return e
	}),
)

// decodeTools decodes tools: function tools only, in the Responses API's
// flat shape; a built-in tool is refused naming its type.
func (d *responsesDecoder) decodeTools(raw json.RawMessage, param string) (e *Error) {
	d.tools, e = decodeToolList(raw, param, responsesToolFields, func(t *responsesTool) *llm.Tool { return &t.Tool }, "name", func(typ string) string {
		return "Tools of type '" + clip(typ) + "' are not supported by this deployment: it runs no built-in tools. Use tools of type 'function'."
	})
	if e != nil {
		return e
	}
	d.Runtime.Tools = make([]llm.Tool, len(d.tools))
	for i := range d.tools {
		defaultParameters(&d.tools[i].Tool)
		d.Runtime.Tools[i] = d.tools[i].Tool
	}
	if len(d.tools) == 0 {
		d.Runtime.Tools = nil
	}
	return nil
}

var responsesToolFields = newFields("",
	required("type", onlyFunctionType[responsesTool]), // other types: decodeToolList
	required("name", func(t *responsesTool, raw json.RawMessage, param string) *Error {
		return toolName(&t.Tool, raw, param)
	}),
	optional("description", set(asString, func(t *responsesTool) *string { return &t.Description })),
	optional("parameters", set(rawObject, func(t *responsesTool) *json.RawMessage { return &t.Parameters })),
	optional("strict", setPtr(asBool, func(t *responsesTool) **bool { return &t.strict })),
	// For tool search, programmatic calling and asynchronous calls, which
	// this deployment does not have: every tool is offered at once and
	// called directly, and its output is what the client sends back.
	optional("defer_loading", acceptedBool[responsesTool]),
	optional("allowed_callers", func(_ *responsesTool, raw json.RawMessage, param string) *Error {
		return eachString(raw, param, func(string, string) *Error { return nil })
	}),
	optional("async", acceptedBool[responsesTool]),
	optional("output_schema", func(_ *responsesTool, raw json.RawMessage, param string) *Error {
		_, e := rawObject(raw, param)
		return e
	}),
)

// decodeToolChoice decodes tool_choice into Runtime.ForceTool: "auto" is
// the model's choice, "none" drops the tools, "required" or a named
// function forces a call.
func (d *responsesDecoder) decodeToolChoice(raw json.RawMessage, param string) *Error {
	switch kindOf(raw) {
	case "string":
		switch v := mustString(raw); v {
		case "auto":
		case "none":
			d.Runtime.Tools = nil
		case "required":
			if len(d.tools) == 0 {
				return invalid(param, "invalid_value", "tool_choice 'required' needs at least one tool in 'tools'.")
			}
			d.Runtime.ForceTool = llm.ToolAny
		default:
			return invalidValue(param, v, "none", "auto", "required")
		}
		d.toolChoice = mustString(raw)
		return nil
	case "object":
	default:
		return typeError(param, "a string or an object", raw)
	}
	obj := mustObject(raw)
	typ, e := requiredString(obj, "type", param+".type")
	if e != nil {
		return e
	}
	if typ == "allowed_tools" {
		return d.allowedTools(obj, raw, param)
	}
	if typ != "function" {
		return invalid(param+".type", "unsupported_value", "tool_choice of type '"+clip(typ)+
			"' is not supported by this deployment; use 'auto', 'none', 'required' or {\"type\":\"function\",\"name\":…}.")
	}
	if k, ok := firstUnknownOf(obj, "type", "name"); ok {
		return unknownField(param + "." + k)
	}
	name, e := requiredString(obj, "name", param+".name")
	if e != nil {
		return e
	}
	if !slices.ContainsFunc(d.tools, func(t responsesTool) bool { return t.Name == name }) {
		return invalid(param+".name", "invalid_value", "tool_choice names '"+clip(name)+"', which is not a function in 'tools'.")
	}
	d.toolChoice, d.namedChoice, d.Runtime.ForceTool = name, true, name
	return nil
}

// allowedTools decodes {"type":"allowed_tools","mode":…,"tools":[{"type":
// "function","name":…}]}: the model may call only those of tools this
// time, and must call one in mode required.
func (d *responsesDecoder) allowedTools(obj object, raw json.RawMessage, param string) *Error {
	if k, ok := firstUnknownOf(obj, "type", "mode", "tools"); ok {
		return unknownField(param + "." + k)
	}
	var a allowedTools
	var e *Error
	if a.mode, e = requiredString(obj, "mode", param+".mode"); e != nil {
		return e
	}
	tools, ok := obj.get("tools")
	if !ok {
		return missing(param + ".tools")
	}
	e = a.decodeTools(tools, param+".tools", func(t object, p string) (string, *Error) {
		if e := refuseType(t, p, "function", notFunctionChoice); e != nil {
			return "", e
		}
		if k, ok := firstUnknownOf(t, "type", "name"); ok {
			return "", unknownField(p + "." + k)
		}
		return requiredString(t, "name", p+".name")
	})
	if e != nil {
		return e
	}
	if e := a.apply(&d.Runtime, param); e != nil {
		return e
	}
	d.allowed = raw
	return nil
}

// maxMetadata, maxMetadataKey and maxMetadataValue are OpenAI's limits.
const (
	maxMetadata      = 16
	maxMetadataKey   = 64
	maxMetadataValue = 512
)

// decodeMetadata accepts up to 16 string pairs, which the response echoes.
func (d *responsesDecoder) decodeMetadata(raw json.RawMessage, param string) *Error {
	obj, e := asObject(raw, param)
	if e != nil {
		return e
	}
	if len(obj) > maxMetadata {
		return invalid(param, "object_above_max_properties", "Invalid '"+param+"': too many properties. Expected an object with at most 16 properties, but got "+strconv.Itoa(len(obj))+" instead.")
	}
	for _, m := range obj {
		k, v := string(m.key), m.raw
		p := param + "." + clip(k)
		if len(k) > maxMetadataKey {
			return invalid(p, "string_above_max_length", "Invalid '"+param+"': metadata keys are at most 64 characters long.")
		}
		s, e := asString(v, p)
		if e != nil {
			return e
		}
		if len(s) > maxMetadataValue {
			return invalid(p, "string_above_max_length", "Invalid '"+p+"': metadata values are at most 512 characters long.")
		}
		d.metadata = append(d.metadata, [2]string{k, s})
	}
	slices.SortFunc(d.metadata, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return nil
}

func mustObject(raw []byte) object { return dropNulls(splitObject(raw)) }

// appendEcho appends the request's settings as a response object repeats
// them, each member followed by a comma.
func (d *responsesDecoder) appendEcho(dst []byte) []byte {
	dst = append(dst, `"instructions":`...)
	dst = appendStringPtr(dst, d.instructions)
	dst = append(dst, `,"max_output_tokens":`...)
	if m := d.Runtime.Options.MaxTokens; m != nil {
		dst = appendInt(dst, int64(*m))
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"max_tool_calls":`...)
	if m := d.maxToolCalls; m != nil {
		dst = appendInt(dst, int64(*m))
	} else {
		dst = append(dst, "null"...)
	}
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, d.Model)
	dst = append(dst, `,"parallel_tool_calls":`...)
	dst = strconv.AppendBool(dst, d.parallel)
	dst = append(dst, `,"previous_response_id":null,"reasoning":{"effort":`...)
	dst = appendStringOrNull(dst, d.effort)
	dst = append(dst, `,"summary":`...)
	dst = appendStringOrNull(dst, d.summary)
	dst = append(dst, `},"store":false,"temperature":`...)
	dst = appendFloatPtr(dst, d.Runtime.Options.Temperature)
	dst = append(dst, `,"text":{"format":`...)
	dst = d.format.appendJSON(dst)
	dst = append(dst, `,"verbosity":`...)
	dst = appendString(dst, cmp.Or(d.verbosity, "medium"))
	dst = append(dst, `},"tool_choice":`...)
	switch {
	case d.allowed != nil:
		dst = appendCompact(dst, d.allowed)
	case d.namedChoice:
		dst = append(dst, `{"type":"function","name":`...)
		dst = appendString(dst, d.toolChoice)
		dst = append(dst, '}')
	case d.toolChoice != "":
		dst = appendString(dst, d.toolChoice)
	default:
		dst = append(dst, `"auto"`...)
	}
	dst = append(dst, `,"tools":[`...)
	for i := range d.tools {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = d.tools[i].appendJSON(dst)
	}
	dst = append(dst, `],"top_logprobs":`...)
	dst = appendInt(dst, int64(d.topLogprobs))
	dst = append(dst, `,"top_p":`...)
	dst = appendFloatPtr(dst, d.Runtime.Options.TopP)
	dst = append(dst, `,"truncation":`...)
	dst = appendString(dst, cmp.Or(d.truncation, "disabled"))
	dst = append(dst, `,"user":`...)
	dst = appendStringPtr(dst, d.user)
	dst = append(dst, `,"safety_identifier":`...)
	dst = appendStringPtr(dst, d.safetyID)
	dst = append(dst, `,"prompt_cache_key":`...)
	dst = appendStringPtr(dst, d.cacheKey)
	dst = append(dst, `,"metadata":{`...)
	for i, kv := range d.metadata {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, kv[0])
		dst = append(dst, ':')
		dst = appendString(dst, kv[1])
	}
	return append(dst, "},"...)
}

func (f *textFormat) appendJSON(dst []byte) []byte {
	if f.typ == "" {
		return append(dst, `{"type":"text"}`...)
	}
	dst = append(dst, `{"type":`...)
	dst = appendString(dst, f.typ)
	if f.typ == "json_schema" {
		dst = append(dst, `,"name":`...)
		dst = appendString(dst, f.name)
		if f.description != "" {
			dst = append(dst, `,"description":`...)
			dst = appendString(dst, f.description)
		}
		dst = append(dst, `,"schema":`...)
		dst = appendCompact(dst, f.schema)
		dst = append(dst, `,"strict":`...)
		dst = strconv.AppendBool(dst, f.strict != nil && *f.strict)
	}
	return append(dst, '}')
}

func (t *responsesTool) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"type":"function","name":`...)
	dst = appendString(dst, t.Name)
	dst = append(dst, `,"description":`...)
	dst = appendStringOrNull(dst, t.Description)
	dst = append(dst, `,"parameters":`...)
	if t.Parameters != nil {
		dst = appendCompact(dst, t.Parameters)
	} else {
		dst = append(dst, "null"...)
	}
	// OpenAI's default for a function tool of the Responses API is strict.
	dst = append(dst, `,"strict":`...)
	dst = strconv.AppendBool(dst, t.strict == nil || *t.strict)
	return append(dst, '}')
}

func appendStringPtr(dst []byte, s *string) []byte {
	if s == nil {
		return append(dst, "null"...)
	}
	return appendString(dst, *s)
}

func appendFloatPtr(dst []byte, f *float64) []byte {
	if f == nil {
		return append(dst, "null"...)
	}
	return strconv.AppendFloat(dst, *f, 'g', -1, 64)
}

// Sealer seals what a response hands a client only to get it back (the
// reasoning of a reasoning item, in its encrypted_content) and opens it
// when it comes back: an AEAD under a key of the node's (internal/sealbox).
type Sealer interface {
	Seal(dst, plaintext, ad []byte) []byte
	Open(dst, sealed, ad []byte) ([]byte, error)
}
