package openai

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"

	"github.com/hearthd/hearth/llm"
)

// maxStop is OpenAI's limit on stop sequences.
const maxStop = 4

// decodeStop decodes stop sequences: a string or an array of at most
// maxStop strings. It returns nil when no sequence is left.
func decodeStop(raw json.RawMessage, param string) ([]string, *Error) {
	var stops []string
	switch kindOf(raw) {
	case "string":
		stops = []string{mustString(raw)}
	case "array":
		items := mustArray(raw)
		if len(items) > maxStop {
			return nil, arrayTooLong(param, maxStop, len(items))
		}
		for i, it := range items {
			s, e := asString(it, param+"["+strconv.Itoa(i)+"]")
			if e != nil {
				return nil, e
			}
			stops = append(stops, s)
		}
	default:
		return nil, typeError(param, "a string or an array of strings", raw)
	}
	// An empty stop sequence would end every generation at once; OpenAI
	// treats it as no stop sequence, and so do we.
	stops = slices.DeleteFunc(stops, func(s string) bool { return s == "" })
	if len(stops) == 0 {
		return nil, nil
	}
	return stops, nil
}

// sampling returns the sampling parameters that chat and legacy completions
// share, in decoding order, for a request kind whose options opts returns.
func sampling[T any](opts func(*T) *llm.Options) []field[T] {
	return []field[T]{
		optional("temperature", setPtr(floatIn(0, 2), func(d *T) **float64 { return &opts(d).Temperature })),
		optional("top_p", setPtr(floatIn(0, 1), func(d *T) **float64 { return &opts(d).TopP })),
		optional("presence_penalty", setPtr(floatIn(-2, 2), func(d *T) **float64 { return &opts(d).PresencePenalty })),
		optional("frequency_penalty", setPtr(floatIn(-2, 2), func(d *T) **float64 { return &opts(d).FrequencyPenalty })),
		optional("seed", setPtr(intIn(math.MinInt64, math.MaxInt64), func(d *T) **int64 { return &opts(d).Seed })),
		// vLLM's extra sampling parameters, which OpenAI-compatible
		// clients send in the body (extra_body).
		optional("top_k", setPtr(intIn(-1, 1<<20), func(d *T) **int64 { return &opts(d).TopK })),
		optional("min_p", setPtr(floatIn(0, 1), func(d *T) **float64 { return &opts(d).MinP })),
		optional("repetition_penalty", setPtr(floatIn(0, 10), func(d *T) **float64 { return &opts(d).RepetitionPenalty })),
		optional("stop", func(d *T, raw json.RawMessage, param string) (e *Error) {
			opts(d).Stop, e = decodeStop(raw, param)
			return e
		}),
	}
}
