package openai

import (
	"context"
	"errors"
	"strconv"

	"github.com/hearthd/hearth/internal/textcheck"
	"github.com/hearthd/hearth/llm"
)

// Error is an API error in OpenAI's shape. Status is the HTTP status; an
// empty Param or Code is sent as null.
type Error struct {
	Status  int
	Message string
	Type    string
	Param   string
	Code    string
}

func (e *Error) Error() string {
	if e.Param != "" {
		return strconv.Itoa(e.Status) + " " + e.Type + " (" + e.Param + "): " + e.Message
	}
	return strconv.Itoa(e.Status) + " " + e.Type + ": " + e.Message
}

// Error types, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeRateLimit      = "requests"
	TypeServer         = "server_error"
)

// InvalidRequest is a 400 about param (empty when no single parameter is
// at fault).
func InvalidRequest(param, msg string) *Error {
	return &Error{Status: 400, Message: msg, Type: TypeInvalidRequest, Param: param}
}

// invalid is a 400 with an OpenAI error code.
func invalid(param, code, msg string) *Error {
	return &Error{Status: 400, Message: msg, Type: TypeInvalidRequest, Param: param, Code: code}
}

// ModelNotFound is the 404 for a model other than the deployment's.
func ModelNotFound(model string) *Error {
	return &Error{
		Status:  404,
		Message: "The model `" + clip(model) + "` does not exist or you do not have access to it.",
		Type:    TypeInvalidRequest,
		Code:    "model_not_found",
	}
}

// InvalidAPIKey is the 401 for a missing or wrong API key. It never echoes
// the key, not even in part.
func InvalidAPIKey() *Error {
	return &Error{
		Status:  401,
		Message: "Incorrect API key provided. Send your deployment API key as 'Authorization: Bearer <key>'.",
		Type:    TypeInvalidRequest,
		Code:    "invalid_api_key",
	}
}

// RequestTooLarge is the 413 for a body over limit bytes.
func RequestTooLarge(limit int64) *Error {
	return &Error{
		Status:  413,
		Message: "Request body too large: the limit is " + strconv.FormatInt(limit, 10) + " bytes.",
		Type:    TypeInvalidRequest,
		Code:    "request_too_large",
	}
}

// RateLimited is the 429 for a request refused by admission control; OpenAI
// uses type "requests" and code "rate_limit_exceeded", which client SDKs
// retry on.
func RateLimited(msg string) *Error {
	if msg == "" {
		msg = "Rate limit reached: too many concurrent requests. Please retry shortly."
	}
	return &Error{Status: 429, Message: msg, Type: TypeRateLimit, Code: "rate_limit_exceeded"}
}

// Unavailable is the 503 for a model runtime that is not ready. Type
// server_error with a null code matches OpenAI's own overload answer.
func Unavailable(msg string) *Error {
	if msg == "" {
		msg = "The model is not available right now. Please retry shortly."
	}
	return &Error{Status: 503, Message: msg, Type: TypeServer}
}

// Timeout is the 504 for a runtime that did not start answering in time.
func Timeout() *Error {
	return &Error{
		Status:  504,
		Message: "The model did not start answering in time. Please retry.",
		Type:    TypeServer,
		Code:    "timeout",
	}
}

// InternalError is the 500 for anything unexpected. Its message is fixed
// so that internal details never reach the client.
func InternalError() *Error {
	return &Error{
		Status:  500,
		Message: "The server had an error while processing your request.",
		Type:    TypeServer,
	}
}

// NotFound is the 404 for an unknown route, worded as OpenAI words it.
func NotFound(method, path string) *Error {
	return &Error{Status: 404, Message: "Invalid URL (" + method + " " + path + ")", Type: TypeInvalidRequest}
}

// MethodNotAllowed is the 405 for a known route called with the wrong method.
func MethodNotAllowed(method, path string) *Error {
	return &Error{
		Status:  405,
		Message: "Method " + method + " is not allowed for " + path + ".",
		Type:    TypeInvalidRequest,
	}
}

// RuntimeError maps an error from llm.Runtime.Chat or Stream.Recv to the
// API error to send: *runtime.InvalidRequestError → 400, runtime.ErrTimeout
// or a deadline → 504, runtime.ErrUnavailable → 503, anything else → 500
// with a fixed message (the caller logs err itself).
func RuntimeError(err error) *Error {
	var inv *llm.InvalidRequestError
	switch {
	case errors.As(err, &inv):
		return InvalidRequest(inv.Param, inv.Msg)
	case errors.Is(err, llm.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return Timeout()
	case errors.Is(err, llm.ErrUnavailable):
		return Unavailable("")
	default:
		return InternalError()
	}
}

// AppendErrorJSON appends
// {"error":{"message":…,"type":…,"param":…|null,"code":…|null}}.
func AppendErrorJSON(dst []byte, e *Error) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = appendString(dst, e.Message)
	dst = append(dst, `,"type":`...)
	dst = appendString(dst, e.Type)
	dst = append(dst, `,"param":`...)
	dst = appendStringOrNull(dst, e.Param)
	dst = append(dst, `,"code":`...)
	dst = appendStringOrNull(dst, e.Code)
	return append(dst, "}}"...)
}

// maxEcho bounds how much of a value from the request an error repeats: an
// error answer stays a few hundred bytes whatever was sent.
const maxEcho = 64

// clip shortens s to maxEcho bytes plus "…".
func clip(s string) string { return textcheck.Clip(s, maxEcho) }
