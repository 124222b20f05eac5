package openai

import (
	"encoding/json"
	"slices"
	"strconv"
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
