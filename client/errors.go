package client

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Error codes of the management API (the Error schema's enum), and
// forbidden: a read-only token's write.
const (
	CodeInvalidRequest      = "invalid_request"
	CodeUnauthorized        = "unauthorized"
	CodeForbidden           = "forbidden"
	CodeNotFound            = "not_found"
	CodeConflict            = "conflict"
	CodeCapacityUnavailable = "capacity_unavailable"
	CodeIdempotencyConflict = "idempotency_conflict"
	CodeRateLimited         = "rate_limited"
	CodeMethodNotAllowed    = "method_not_allowed"
	CodePayloadTooLarge     = "payload_too_large"
	CodeInternal            = "internal_error"
	// CodeUnavailable is a 503 of the control plane whose database cannot
	// be reached: nothing changed, so any request may be sent again.
	CodeUnavailable = "unavailable"
)

// APIError is an error answer of the management API. Methods return it as
// a value, so
//
//	var apiErr client.APIError
//	if errors.As(err, &apiErr) && apiErr.Param == "name" { … }
//
// reads it, and errors.As(err, &client.APIError{}) tests for one.
type APIError struct {
	StatusCode int
	Code       string // e.g. not_found; empty if the answer was not the API's JSON
	Message    string
	Param      string // the field, query parameter, header or path parameter at fault, if any
	RequestID  string // req_…: finds the request in the control plane's log
	// RetryAfter is the Retry-After of a 429 or 503, else 0.
	RetryAfter time.Duration
}

func (e APIError) Error() string {
	var b strings.Builder
	b.WriteString(e.Message)
	b.WriteString(" (")
	if e.Code != "" {
		b.WriteString(e.Code)
	} else {
		fmt.Fprintf(&b, "HTTP %d", e.StatusCode)
	}
	if e.Param != "" {
		b.WriteString(", param ")
		b.WriteString(e.Param)
	}
	if e.RequestID != "" {
		b.WriteString(", request ")
		b.WriteString(e.RequestID)
	}
	b.WriteString(")")
	return b.String()
}

// errorBody is the Error schema: every error answer of the API.
type errorBody struct {
	Error struct {
		Code      string  `json:"code"`
		Message   string  `json:"message"`
		Param     *string `json:"param"`
		RequestID string  `json:"request_id"`
	} `json:"error"`
}

// HasCode reports whether err is an APIError with the given code.
func HasCode(err error, code string) bool {
	var e APIError
	return errors.As(err, &e) && e.Code == code
}

// IsNotFound reports whether err is a 404: an unknown ID, or one of
// another project (which the API answers exactly like an unknown one).
func IsNotFound(err error) bool { return hasStatus(err, http.StatusNotFound) }

func hasStatus(err error, status int) bool {
	var e APIError
	return errors.As(err, &e) && e.StatusCode == status
}

// ErrServerFailed is the error of WaitServerRunning when the server turned
// failed: its node did not converge within the control plane's timeout.
// The node keeps trying; a later convergence still makes it running.
var ErrServerFailed = errors.New("server failed")

// ErrServerDeleting is the error of WaitServerRunning when the server is
// being deleted: it will never run.
var ErrServerDeleting = errors.New("server is being deleted")

// ErrActionFailed is the error of WaitAction when the action ended in
// error (its Error says why).
var ErrActionFailed = errors.New("action failed")
