package openai

import (
	"encoding/json"
	"math"
)

// Decoders for parameters this deployment cannot honour. Each accepts the
// values that change nothing here and refuses the rest with a 400 naming
// the parameter, rather than ignoring them silently. They ignore *d, so
// any request kind's table can list them.

// ignoredString accepts any string: an end-user identifier or a caching
// hint changes nothing in the output.
func ignoredString[T any](_ *T, raw json.RawMessage, param string) *Error {
	_, e := asString(raw, param)
	return e
}

// ignoredObject accepts any object: caching options change nothing in the
// output.
func ignoredObject[T any](_ *T, raw json.RawMessage, param string) *Error {
	_, e := asObject(raw, param)
	return e
}

// noModeration refuses any moderation setting: the deployment runs its one
// model and no moderation model, and ignoring the setting would let a
// client take an unmoderated answer for a moderated one.
func noModeration[T any](_ *T, _ json.RawMessage, param string) *Error {
	return invalid(param, "unsupported_parameter",
		"Moderation is not available on this deployment: it runs one model and no moderation model. Omit '"+param+"'.")
}

// acceptedBool accepts either boolean: the flag cannot change anything
// here, whatever its value.
func acceptedBool[T any](_ *T, raw json.RawMessage, param string) *Error {
	_, e := asBool(raw, param)
	return e
}

// unsupported refuses any value.
func unsupported[T any](_ *T, _ json.RawMessage, param string) *Error {
	return invalid(param, "unsupported_parameter", "'"+param+"' is not supported by this deployment's model.")
}

// deprecated refuses any value of a parameter replaced by replacement.
func deprecated[T any](replacement string) decodeFunc[T] {
	return func(_ *T, _ json.RawMessage, param string) *Error {
		return invalid(param, "unsupported_parameter",
			"The deprecated '"+param+"' parameter is not supported; use '"+replacement+"'.")
	}
}

// onlyValue accepts the string want only, the one value of a setting
// that this deployment honours (its default).
func onlyValue[T any](want string) decodeFunc[T] {
	return func(_ *T, raw json.RawMessage, param string) *Error {
		v, e := asString(raw, param)
		if e == nil && v != want {
			return invalid(param, "unsupported_value",
				param+" '"+clip(v)+"' is not supported by this deployment; send '"+want+"' or omit it.")
		}
		return e
	}
}

func onlyOneChoice[T any](_ *T, raw json.RawMessage, param string) *Error {
	n, e := asInt(raw, param, 1, math.MaxInt64)
	if e != nil {
		return e
	}
	if n != 1 {
		return invalid(param, "unsupported_value", "Only n=1 is supported by this deployment.")
	}
	return nil
}

func noLogitBias[T any](_ *T, raw json.RawMessage, param string) *Error {
	return refuseNonEmpty(raw, param, "logit_bias is not supported by this deployment.")
}

func noStore[T any](_ *T, raw json.RawMessage, param string) *Error {
	return refuseBool(raw, param, true, "unsupported_value",
		"Storing completions is not supported by this deployment; send store false or omit it.")
}

func noMetadata[T any](_ *T, raw json.RawMessage, param string) *Error {
	return refuseNonEmpty(raw, param,
		"metadata is only kept with stored completions, which this deployment does not support.")
}

func defaultServiceTier[T any](_ *T, raw json.RawMessage, param string) *Error {
	v, e := asString(raw, param)
	if e != nil {
		return e
	}
	if v != "auto" && v != "default" {
		return invalid(param, "unsupported_value",
			"service_tier '"+v+"' is not supported by this deployment; use 'auto' or 'default'.")
	}
	return nil
}

func textModality[T any](_ *T, raw json.RawMessage, param string) *Error {
	return eachString(raw, param, func(v, p string) *Error {
		if v != "text" {
			return invalid(p, "unsupported_value", "Only the 'text' output modality is supported by this deployment.")
		}
		return nil
	})
}

// refuseBool accepts a boolean other than refused, and answers refused
// with code and msg.
func refuseBool(raw []byte, param string, refused bool, code, msg string) *Error {
	v, e := asBool(raw, param)
	if e != nil {
		return e
	}
	if v == refused {
		return invalid(param, code, msg)
	}
	return nil
}

// refuseNonEmpty accepts an empty object and answers any other with msg.
func refuseNonEmpty(raw []byte, param, msg string) *Error {
	m, e := asObject(raw, param)
	if e != nil {
		return e
	}
	if len(m) > 0 {
		return invalid(param, "unsupported_parameter", msg)
	}
	return nil
}
