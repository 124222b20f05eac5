package openai

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/hearthd/hearth/internal/ids"
	"github.com/hearthd/hearth/llm"
)

// DefaultCompletionMaxTokens is max_tokens of a legacy completion that
// names none, as OpenAI has it (OpenAI's legacy completions are short by
// default, unlike chat).
const DefaultCompletionMaxTokens = 16

// CompletionRequest is a validated POST /completions (legacy) request.
type CompletionRequest struct {
	Model        string
	Stream       bool
	IncludeUsage bool // stream_options.include_usage
	// Prompts are the texts to continue, each N times: choice i continues
	// Prompts[i/N] (OpenAI's order). Runtime.Prompt is Prompts[0].
	Prompts []string
	// N is the completions per prompt; len(Prompts)·N ≤ MaxChoices.
	N       int
	Runtime llm.CompletionRequest
}

// DecodeCompletionRequest decodes and validates a legacy completion request
// body for a deployment serving modelID (the mapping is in the package
// comment). An absent max_tokens stays nil: the caller applies
// DefaultCompletionMaxTokens, within its output cap. The result shares no
// memory with body.
func DecodeCompletionRequest(body []byte, modelID string) (*CompletionRequest, *Error) {
	obj, e := decodeBody(body)
	if e != nil {
		return nil, e
	}
	d := &completionDecoder{modelID: modelID, CompletionRequest: CompletionRequest{N: 1}}
	if e := completionFields.decode(d, obj); e != nil {
		return nil, e
	}
	if len(d.Prompts)*d.N > MaxChoices {
		return nil, invalid("n", "integer_above_max_value", fmt.Sprintf(
			"%d prompts with n=%d ask for %d completions; at most %d are generated per request.", len(d.Prompts), d.N, len(d.Prompts)*d.N, MaxChoices))
	}
	d.Runtime.Prompt = d.Prompts[0]
	return &d.CompletionRequest, nil
}

type completionDecoder struct {
	CompletionRequest
	modelID string
}

func completionOptions(d *completionDecoder) *llm.Options { return &d.Runtime.Options }

// completionFields is the allow-list and decoders of a legacy completion
// request, in decoding order (stream_options follows stream).
var completionFields = newFields("", slices.Concat(
	[]field[completionDecoder]{
		required("model", func(d *completionDecoder, raw json.RawMessage, param string) (e *Error) {
			d.Model, e = decodeModel(raw, param, d.modelID)
			return e
		}),
		required("prompt", func(d *completionDecoder, raw json.RawMessage, param string) (e *Error) {
			d.Prompts, e = decodePrompt(raw, param)
			return e
		}),
		optional("suffix", set(asString, func(d *completionDecoder) *string { return &d.Runtime.Suffix })),
		optional("max_tokens", setPtr(maxTokens, func(d *completionDecoder) **int { return &d.Runtime.Options.MaxTokens })),
	},
	sampling(completionOptions),
	[]field[completionDecoder]{
		optional("stream", set(asBool, func(d *completionDecoder) *bool { return &d.Stream })),
		optional("stream_options", func(d *completionDecoder, raw json.RawMessage, param string) *Error {
			// The same object as chat's: decode it through chat's table.
			cd := chatDecoder{ChatRequest: ChatRequest{Stream: d.Stream}}
			e := cd.streamOptions(raw, param)
			d.IncludeUsage = cd.IncludeUsage
			return e
		}),
		optional("user", ignoredString[completionDecoder]),
		optional("n", func(d *completionDecoder, raw json.RawMessage, param string) *Error {
			n, e := asInt(raw, param, 1, MaxChoices)
			d.N = int(n)
			return e
		}),
		optional("best_of", func(_ *completionDecoder, raw json.RawMessage, param string) *Error {
			n, e := asInt(raw, param, 1, 20)
			if e == nil && n != 1 {
				e = invalid(param, "unsupported_value", "Only best_of=1 is supported by this deployment.")
			}
			return e
		}),
		optional("echo", func(_ *completionDecoder, raw json.RawMessage, param string) *Error {
			return refuseBool(raw, param, true, "unsupported_value",
				"echo is not supported by this deployment; send echo false or omit it.")
		}),
		optional("logprobs", func(_ *completionDecoder, raw json.RawMessage, param string) *Error {
			if _, e := asInt(raw, param, 0, 5); e != nil {
				return e
			}
			return invalid(param, "unsupported_parameter",
				"logprobs are not supported for legacy completions by this deployment; use /chat/completions or omit logprobs.")
		}),
		optional("logit_bias", noLogitBias[completionDecoder]),
	},
)...)

// decodePrompt decodes prompt: a non-empty string, or an array of 1 to
// MaxChoices of them (one completion each). Token arrays are refused: the
// runtime continues text only.
func decodePrompt(raw json.RawMessage, param string) ([]string, *Error) {
	switch kindOf(raw) {
	case "string":
		s := mustString(raw)
		if s == "" {
			// Ollama takes an empty prompt for a request to load the model.
			return nil, invalid(param, "invalid_value", "'"+param+"' must not be empty.")
		}
		return []string{s}, nil
	case "array":
		items := mustArray(raw)
		switch {
		case len(items) == 0:
			return nil, invalid(param, "invalid_value", "'"+param+"' must not be an empty array.")
		case kindOf(items[0]) == "integer" || kindOf(items[0]) == "array":
			return nil, invalid(param, "unsupported_value",
				"Token arrays are not supported by this deployment's model runtime; send 'prompt' as text.")
		case len(items) > MaxChoices:
			return nil, arrayTooLong(param, MaxChoices, len(items))
		}
		prompts := make([]string, len(items))
		for i, it := range items {
			p := param + "[" + strconv.Itoa(i) + "]"
			s, e := asString(it, p)
			if e != nil {
				return nil, e
			}
			if s == "" {
				return nil, invalid(p, "invalid_value", "'"+p+"' must not be empty.")
			}
			prompts[i] = s
		}
		return prompts, nil
	default:
		return nil, typeError(param, "a string or an array of strings", raw)
	}
}

// NewTextCompletionID returns "cmpl-" followed by 29 random base62
// characters, the shape of OpenAI's legacy completion IDs.
func NewTextCompletionID() string { return ids.New("cmpl-", 29) }

// AppendTextCompletion appends a complete (non-streamed) text_completion
// object. An empty fingerprint is sent as null.
func AppendTextCompletion(dst []byte, id string, created int64, model, fingerprint, text, finish string, u Usage) []byte {
	return AppendTextCompletionChoices(dst, id, created, model, fingerprint, []TextChoice{{Text: text, Finish: finish}}, u)
}

// TextChoice is one choice of a legacy completion: its text and finish
// reason.
type TextChoice struct{ Text, Finish string }

// AppendTextCompletionChoices appends a text_completion object with
// several choices, indexed in order.
func AppendTextCompletionChoices(dst []byte, id string, created int64, model, fingerprint string, choices []TextChoice, u Usage) []byte {
	dst = appendTextHead(dst, id, created, model, fingerprint)
	dst = append(dst, `"choices":[`...)
	for i, c := range choices {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"text":`...)
		dst = appendString(dst, c.Text)
		dst = append(dst, `,"index":`...)
		dst = appendInt(dst, int64(i))
		dst = append(dst, `,"logprobs":null,"finish_reason":`...)
		dst = appendString(dst, c.Finish)
		dst = append(dst, '}')
	}
	dst = append(dst, `],"usage":`...)
	dst = appendUsage(dst, u)
	return append(dst, '}')
}

// appendTextHead appends `{"id":…,"object":"text_completion","created":…,
// "model":…,"system_fingerprint":…,`.
func appendTextHead(dst []byte, id string, created int64, model, fingerprint string) []byte {
	dst = append(dst, `{"id":`...)
	dst = appendString(dst, id)
	dst = append(dst, `,"object":"text_completion","created":`...)
	dst = appendInt(dst, created)
	dst = append(dst, `,"model":`...)
	dst = appendString(dst, model)
	dst = append(dst, `,"system_fingerprint":`...)
	dst = appendStringOrNull(dst, fingerprint)
	return append(dst, ',')
}

// TextChunkEncoder encodes the server-sent events of one streamed legacy
// completion, as ChunkEncoder does for chat: AppendText per piece of text,
// then AppendFinish, AppendUsage when usage was requested, and AppendDone;
// AppendError instead of the rest on a failure mid-stream. It is immutable
// and safe for concurrent use.
type TextChunkEncoder struct {
	head   string // `data: {…,"system_fingerprint":…,`
	choice string // head + `"choices":[{"text":`
	index  string // `,"index":N`
	end    string // closes the choice, the chunk and the event
}

// NewTextChunkEncoder prepares the encoder for completion id.
func NewTextChunkEncoder(id string, created int64, model, fingerprint string, includeUsage bool) *TextChunkEncoder {
	head := string(appendTextHead([]byte("data: "), id, created, model, fingerprint))
	end := "}]}\n\n"
	if includeUsage {
		end = `}],"usage":null}` + "\n\n"
	}
	return &TextChunkEncoder{head: head, choice: head + `"choices":[{"text":`, index: `,"index":0`, end: end}
}

// ForChoice returns the encoder of choice i of the same completion.
func (c *TextChunkEncoder) ForChoice(i int) *TextChunkEncoder {
	e := *c
	e.index = `,"index":` + strconv.Itoa(i)
	return &e
}

// AppendText appends a chunk carrying text. It does not allocate when dst
// has room.
func (c *TextChunkEncoder) AppendText(dst []byte, text string) []byte {
	dst = append(dst, c.choice...)
	dst = appendString(dst, text)
	dst = append(dst, c.index...)
	dst = append(dst, notFinished...)
	return append(dst, c.end...)
}

// AppendFinish appends the chunk with no text and the finish reason.
func (c *TextChunkEncoder) AppendFinish(dst []byte, reason string) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `""`...)
	dst = append(dst, c.index...)
	dst = append(dst, `,"logprobs":null,"finish_reason":`...)
	dst = appendString(dst, reason)
	return append(dst, c.end...)
}

// AppendUsage appends the usage chunk, which has no choices.
func (c *TextChunkEncoder) AppendUsage(dst []byte, u Usage) []byte {
	dst = append(dst, c.head...)
	dst = append(dst, `"choices":[],"usage":`...)
	dst = appendUsage(dst, u)
	return append(dst, "}\n\n"...)
}

// AppendDone appends the terminating data: [DONE] event.
func (c *TextChunkEncoder) AppendDone(dst []byte) []byte {
	return append(dst, "data: [DONE]\n\n"...)
}

// AppendError appends an error event for a failure mid-stream.
func (c *TextChunkEncoder) AppendError(dst []byte, e *Error) []byte {
	return (*ChunkEncoder)(nil).AppendError(dst, e)
}
