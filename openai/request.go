package openai

import (
	"encoding/json"
	"fmt"
	"math"

	"github.com/hearthd/hearth/llm"
)

// ChatRequest is a validated POST /chat/completions request.
type ChatRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	// N is the number of choices, 1…MaxChoices: n independent generations
	// of the same request.
	N       int
	Runtime llm.Request
}

// MaxChoices is the largest n: each choice is a generation of its own
// and takes a generation slot, so n is kept well below what a node runs
// at once.
const MaxChoices = 8

// DecodeChatRequest decodes and validates a chat completion request body for
// a deployment serving modelID. The mapping is in the package comment. The
// result shares no memory with body, so body may be reused afterwards.
func DecodeChatRequest(body []byte, modelID string) (*ChatRequest, *Error) {
	obj, e := decodeBody(body)
	if e != nil {
		return nil, e
	}
	d := &chatDecoder{modelID: modelID, ChatRequest: ChatRequest{N: 1}}
	if e := chatFields.decode(d, obj); e != nil {
		return nil, e
	}
	d.Runtime.Messages = withVerbosity(d.Runtime.Messages, d.verbosity)
	return &d.ChatRequest, nil
}

// chatDecoder is the state of one DecodeChatRequest call.
type chatDecoder struct {
	ChatRequest
	modelID   string // the only model the deployment serves
	verbosity string
}

// chatFields is the one list of the top-level fields of a chat completion
// request: any other key is refused as unknown. The package comment's
// table documents the same fields, and a test keeps the two in step.
//
// The order is the order of decoding, so it decides which error a request
// with several wrong fields gets; moving a field changes that. Decoders
// rely on it too: max_completion_tokens follows max_tokens, tool_choice
// follows tools and stream_options follows stream.
//
// To support a parameter listed as refused here, replace its decoder.
var chatFields = newFields("",
	required("model", func(d *chatDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Model, e = decodeModel(raw, param, d.modelID)
		return e
	}),
	required("messages", func(d *chatDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Runtime.Messages, e = decodeMessages(raw, param)
		return e
	}),

	optional("temperature", setPtr(floatIn(0, 2), func(d *chatDecoder) **float64 { return &d.Runtime.Options.Temperature })),
	optional("top_p", setPtr(floatIn(0, 1), func(d *chatDecoder) **float64 { return &d.Runtime.Options.TopP })),
	optional("presence_penalty", setPtr(floatIn(-2, 2), func(d *chatDecoder) **float64 { return &d.Runtime.Options.PresencePenalty })),
	optional("frequency_penalty", setPtr(floatIn(-2, 2), func(d *chatDecoder) **float64 { return &d.Runtime.Options.FrequencyPenalty })),
	optional("seed", setPtr(intIn(math.MinInt64, math.MaxInt64), func(d *chatDecoder) **int64 { return &d.Runtime.Options.Seed })),
	// vLLM's extra sampling parameters, which OpenAI-compatible clients
	// send in the body (extra_body).
	optional("top_k", setPtr(intIn(-1, 1<<20), func(d *chatDecoder) **int64 { return &d.Runtime.Options.TopK })),
	optional("min_p", setPtr(floatIn(0, 1), func(d *chatDecoder) **float64 { return &d.Runtime.Options.MinP })),
	optional("repetition_penalty", setPtr(floatIn(0, 10), func(d *chatDecoder) **float64 { return &d.Runtime.Options.RepetitionPenalty })),
	optional("max_tokens", setPtr(maxTokens, func(d *chatDecoder) **int { return &d.Runtime.Options.MaxTokens })),
	optional("max_completion_tokens", (*chatDecoder).maxCompletionTokens),
	optional("stop", func(d *chatDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Runtime.Options.Stop, e = decodeStop(raw, param)
		return e
	}),
	optional("response_format", func(d *chatDecoder, raw json.RawMessage, _ string) *Error {
		return decodeResponseFormat(raw, &d.Runtime)
	}),

	optional("functions", deprecated[chatDecoder]("tools")),
	optional("function_call", deprecated[chatDecoder]("tool_choice")),
	optional("tools", func(d *chatDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Runtime.Tools, e = decodeTools(raw, param)
		return e
	}),
	optional("tool_choice", func(d *chatDecoder, raw json.RawMessage, param string) *Error {
		return decodeToolChoice(raw, param, &d.Runtime)
	}),
	optional("parallel_tool_calls", func(d *chatDecoder, raw json.RawMessage, param string) *Error {
		return parallelToolCalls(&d.Runtime, raw, param)
	}),

	optional("stream", set(asBool, func(d *chatDecoder) *bool { return &d.Stream })),
	optional("stream_options", (*chatDecoder).streamOptions),

	optional("user", ignoredString[chatDecoder]),
	optional("safety_identifier", ignoredString[chatDecoder]),
	optional("prompt_cache_key", ignoredString[chatDecoder]),
	optional("n", func(d *chatDecoder, raw json.RawMessage, param string) *Error {
		n, e := asInt(raw, param, 1, MaxChoices)
		d.N = int(n)
		return e
	}),
	optional("logit_bias", noLogitBias[chatDecoder]),
	optional("logprobs", set(asBool, func(d *chatDecoder) *bool { return &d.Runtime.Options.Logprobs })),
	optional("top_logprobs", (*chatDecoder).topLogprobs),
	optional("store", noStore[chatDecoder]),
	optional("metadata", noMetadata[chatDecoder]),
	optional("service_tier", defaultServiceTier[chatDecoder]),
	optional("modalities", textModality[chatDecoder]),
	optional("audio", unsupported[chatDecoder]),
	optional("prediction", unsupported[chatDecoder]),
	optional("reasoning_effort", (*chatDecoder).reasoningEffort),
	optional("chat_template_kwargs", func(d *chatDecoder, raw json.RawMessage, param string) *Error {
		return templateKwargs(&d.Runtime.Options, raw, param)
	}),
	optional("verbosity", func(d *chatDecoder, raw json.RawMessage, param string) (e *Error) {
		d.verbosity, e = decodeVerbosity(raw, param)
		return e
	}),
	optional("web_search_options", unsupported[chatDecoder]),
	optional("moderation", noModeration[chatDecoder]),
	optional("prompt_cache_retention", ignoredString[chatDecoder]),
	optional("prompt_cache_options", ignoredObject[chatDecoder]),
)

// decodeModel decodes the model, which must be modelID, the only one the
// deployment serves.
func decodeModel(raw json.RawMessage, param, modelID string) (string, *Error) {
	m, e := asString(raw, param)
	if e != nil {
		return "", e
	}
	if m != modelID {
		return "", ModelNotFound(m)
	}
	return m, nil
}

// maxTokens parses an output token limit.
func maxTokens(raw []byte, param string) (int, *Error) {
	n, e := asInt(raw, param, 1, math.MaxInt32)
	return int(n), e
}

// maxCompletionTokens decodes the newer name of max_tokens. Both may be
// sent only if they agree: silently preferring one would hide a client
// bug that changes the output length. max_tokens is decoded first, so a
// MaxTokens already set came from it.
func (d *chatDecoder) maxCompletionTokens(raw json.RawMessage, param string) *Error {
	n, e := maxTokens(raw, param)
	if e != nil {
		return e
	}
	if prev := d.Runtime.Options.MaxTokens; prev != nil && *prev != n {
		return invalid("max_tokens", "invalid_value", fmt.Sprintf(
			"max_tokens (%d) and max_completion_tokens (%d) disagree; send only max_completion_tokens.", *prev, n))
	}
	d.Runtime.Options.MaxTokens = &n
	return nil
}

// topLogprobs decodes top_logprobs (0–20), which needs logprobs true as
// OpenAI has it; logprobs is decoded first.
func (d *chatDecoder) topLogprobs(raw json.RawMessage, param string) *Error {
	n, e := asInt(raw, param, 0, 20)
	if e != nil {
		return e
	}
	if n > 0 && !d.Runtime.Options.Logprobs {
		return invalid(param, "invalid_value", "'top_logprobs' requires 'logprobs' to be true.")
	}
	d.Runtime.Options.TopLogprobs = int(n)
	return nil
}

func (d *chatDecoder) reasoningEffort(raw json.RawMessage, param string) (e *Error) {
	_, d.Runtime.Options.Think, e = decodeEffort(raw, param)
	return e
}

// decodeEffort decodes a reasoning effort into Options.Think: "none" asks
// a reasoning model not to think; "minimal" is "low", the least a runtime
// with levels offers. effort is the value sent.
func decodeEffort(raw json.RawMessage, param string) (effort, think string, e *Error) {
	if effort, e = asString(raw, param); e != nil {
		return "", "", e
	}
	switch effort {
	case "none":
		think = llm.ThinkNone
	case "minimal", "low":
		think = llm.ThinkLow
	case "medium":
		think = llm.ThinkMedium
	case "high", "xhigh", "max":
		// The most a runtime with levels offers.
		think = llm.ThinkHigh
	default:
		return "", "", invalidValue(param, effort, "none", "minimal", "low", "medium", "high", "xhigh", "max")
	}
	return effort, think, nil
}

// templateKwargs decodes chat_template_kwargs, the arguments vLLM hands a
// model's chat template. The runtime renders the template itself and takes
// no arguments for it; what it can take is whether the model thinks, which
// the templates' own switches (enable_thinking, thinking, reasoning_effort)
// say: they set Options.Think unless reasoning_effort (decoded first) did.
// Any other argument is accepted and has no effect.
func templateKwargs(o *llm.Options, raw json.RawMessage, param string) *Error {
	obj, e := asObject(raw, param)
	if e != nil {
		return e
	}
	for _, key := range []string{"enable_thinking", "thinking"} {
		v, ok := obj.get(key)
		if !ok {
			continue
		}
		on, e := asBool(v, param+"."+key)
		if e != nil {
			return e
		}
		if o.Think == "" {
			o.Think = llm.ThinkNone
			if on {
				o.Think = llm.ThinkMedium
			}
		}
	}
	if v, ok := obj.get("reasoning_effort"); ok {
		_, think, e := decodeEffort(v, param+".reasoning_effort")
		if e != nil {
			return e
		}
		if o.Think == "" {
			o.Think = think
		}
	}
	return nil
}

// decodeVerbosity decodes a verbosity: low, medium (the default) or high.
func decodeVerbosity(raw json.RawMessage, param string) (string, *Error) {
	v, e := asString(raw, param)
	if e != nil {
		return "", e
	}
	switch v {
	case "low", "medium", "high":
		return v, nil
	}
	return "", invalidValue(param, v, "low", "medium", "high")
}

// verbosityHints are the instructions a verbosity other than medium adds:
// the runtime has no length setting short of a hard token limit, which
// would cut answers rather than make them brief.
var verbosityHints = map[string]string{
	"low":  "Answer concisely: keep to what was asked, without detail that was not asked for.",
	"high": "Answer thoroughly: explain in detail, with examples where they help.",
}

// withVerbosity adds the verbosity's instruction to msgs: to the system
// message that opens them, or as one before them (a template may take
// only one system message, and only first).
func withVerbosity(msgs []llm.Message, verbosity string) []llm.Message {
	hint, ok := verbosityHints[verbosity]
	if !ok {
		return msgs
	}
	if len(msgs) > 0 && msgs[0].Role == "system" {
		msgs[0].Content += "\n\n" + hint
		return msgs
	}
	return append([]llm.Message{{Role: "system", Content: hint}}, msgs...)
}

func (d *chatDecoder) streamOptions(raw json.RawMessage, param string) *Error {
	if !d.Stream {
		return invalid(param, "invalid_value",
			"The 'stream_options' parameter is only allowed when 'stream' is enabled.")
	}
	return nested(&d.ChatRequest, raw, param, streamOptionsFields)
}

var streamOptionsFields = newFields("stream_options",
	optional("include_usage", set(asBool, func(r *ChatRequest) *bool { return &r.IncludeUsage })),
	optional("include_obfuscation", func(_ *ChatRequest, raw json.RawMessage, param string) *Error {
		return refuseBool(raw, param, true, "unsupported_value",
			"Stream obfuscation is not supported by this deployment; send include_obfuscation false or omit it.")
	}),
)
