package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// JSON value helpers. Every raw value reaching them comes from a body that
// was validated already (validJSON, as encoding/json's Valid), so kindOf can look at the first
// byte and the must* helpers cannot fail. Each as* helper returns OpenAI's
// 400 for a value of the wrong type or range, naming param.

// object is a decoded JSON object whose null members have been removed, so
// that an explicit null reads as absent everywhere. It holds its members
// in the order they came rather than in a map: a request's objects have a
// handful of members each, found as fast by comparing keys as by hashing
// them, and the keys then stay slices of the body instead of a string and a
// map allocated per member (BenchmarkDecodeChatRequest).
type object []member

// member is one member of an object: key unescaped, raw never null.
type member struct {
	key []byte
	raw json.RawMessage
}

// get returns the value of key, if o has it.
func (o object) get(key string) (json.RawMessage, bool) {
	for i := range o {
		if string(o[i].key) == key {
			return o[i].raw, true
		}
	}
	return nil, false
}

// decodeBody decodes a request body that must be a JSON object.
func decodeBody(body []byte) (object, *Error) {
	// validJSON, as json.Valid's scanner costs every request (FuzzValidJSON checks they agree).
	if validJSON(body) && kindOf(body) == "object" {
		// A copy, as encoding/json's raw values are: the decoded request
		// may keep raw JSON (a schema, tool parameters) past the buffer
		// the body was read into.
		return dropNulls(splitObject(append([]byte(nil), body...))), nil
	}
	// Not an object: encoding/json words the error.
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, bodyError(err)
	}
	return nil, InvalidRequest("", "The request body must be a JSON object, but got null.")
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

// dropNulls removes o's null members, in place.
func dropNulls(o object) object {
	kept := o[:0]
	for _, m := range o {
		if string(m.raw) != "null" {
			kept = append(kept, m)
		}
	}
	clear(o[len(kept):])
	return kept
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
		clip(got), strings.Join(supported, "', '")))
}

func arrayTooLong(param string, limit, got int) *Error {
	return invalid(param, "array_above_max_length", fmt.Sprintf(
		"Invalid '%s': array too long. Expected an array with maximum length %d, but got an array with length %d instead.",
		param, limit, got))
}

// mustString decodes a JSON string. A string without escapes that is
// valid UTF-8 decodes to its own bytes, exactly as encoding/json decodes
// it (FuzzMustString checks this), so that common case skips
// json.Unmarshal and the three allocations it makes per string.
func mustString(raw []byte) string {
	raw = bytes.TrimSpace(raw)
	if len(raw) >= 2 {
		if s := raw[1 : len(raw)-1]; bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
			return string(s)
		}
	}
	var s string
	_ = json.Unmarshal(raw, &s)
	return s
}

func mustArray(raw []byte) []json.RawMessage { return splitArray(raw) }

func asString(raw []byte, param string) (string, *Error) {
	if kindOf(raw) != "string" {
		return "", typeError(param, "a string", raw)
	}
	return mustString(raw), nil
}

func requiredString(obj object, key, param string) (string, *Error) {
	raw, ok := obj.get(key)
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
	return dropNulls(splitObject(raw)), nil
}

// rawObject accepts a JSON object and keeps it as it is.
func rawObject(raw []byte, param string) (json.RawMessage, *Error) {
	if kindOf(raw) != "object" {
		return nil, typeError(param, "an object", raw)
	}
	return raw, nil
}

func formatNumber(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

func asFloat(raw []byte, param string, lo, hi float64) (float64, *Error) {
	if k := kindOf(raw); k != "integer" && k != "decimal" {
		return 0, typeError(param, "a decimal", raw)
	}
	// The syntax is valid, so the only possible error is a range error,
	// where f is ±Inf and the bounds below catch it.
	f, _ := strconv.ParseFloat(string(bytes.TrimSpace(raw)), 64)
	switch {
	case f > hi:
		return 0, invalid(param, "decimal_above_max_value", fmt.Sprintf(
			"Invalid '%s': decimal above maximum value. Expected a value <= %s, but got %s instead.",
			param, formatNumber(hi), clip(string(bytes.TrimSpace(raw)))))
	case f < lo:
		return 0, invalid(param, "decimal_below_min_value", fmt.Sprintf(
			"Invalid '%s': decimal below minimum value. Expected a value >= %s, but got %s instead.",
			param, formatNumber(lo), clip(string(bytes.TrimSpace(raw)))))
	}
	return f, nil
}

// floatIn parses a number in [lo, hi].
func floatIn(lo, hi float64) parser[float64] {
	return func(raw []byte, param string) (float64, *Error) { return asFloat(raw, param, lo, hi) }
}

// intIn parses an integer in [lo, hi].
func intIn(lo, hi int64) parser[int64] {
	return func(raw []byte, param string) (int64, *Error) { return asInt(raw, param, lo, hi) }
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
			"Invalid '%s': integer above maximum value. Expected a value <= %d, but got %s instead.", param, hi, clip(s)))
	case err != nil || n < lo:
		return 0, invalid(param, "integer_below_min_value", fmt.Sprintf(
			"Invalid '%s': integer below minimum value. Expected a value >= %d, but got %s instead.", param, lo, clip(s)))
	}
	return n, nil
}
