package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/hearthd/hearth/internal/textcheck"
	"github.com/hearthd/hearth/store"
)

// Error codes of the management API.
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
	CodeUnavailable         = "unavailable"
)

// apiError is an error answer. Handlers return it; anything else they return
// is an internal error.
type apiError struct {
	status  int
	code    string
	message string
	param   string
	// retryAfter, if set, is sent as Retry-After (seconds).
	retryAfter int
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func invalid(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: CodeInvalidRequest, message: fmt.Sprintf(format, clipArgs(args)...), param: clip(param)}
}

func notFound(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusNotFound, code: CodeNotFound, message: fmt.Sprintf(format, clipArgs(args)...), param: clip(param)}
}

// errUnavailable answers a request the database cannot serve now: nothing
// changed, and the same request may be sent again.
var errUnavailable = &apiError{status: http.StatusServiceUnavailable, code: CodeUnavailable, retryAfter: 1,
	message: "the control plane's database is unavailable; nothing was changed, retry after the Retry-After delay"}

// storeFailure is the answer for a store error: 503 if the database is
// out of reach, else nil (an internal error).
func storeFailure(err error) *apiError {
	if errors.Is(err, store.ErrUnavailable) {
		return errUnavailable
	}
	return nil
}

func conflict(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusConflict, code: CodeConflict, message: fmt.Sprintf(format, clipArgs(args)...), param: clip(param)}
}

type errorEnvelope struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Code      string  `json:"code"`
	Message   string  `json:"message"`
	Param     *string `json:"param"`
	RequestID string  `json:"request_id"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only our own response types reach here; they always encode.
		b = []byte(`{"error":{"code":"internal_error","message":"encode response","param":null,"request_id":""}}`)
		status = http.StatusInternalServerError
	}
	writeRaw(w, status, b)
}

func writeRaw(w http.ResponseWriter, status int, b []byte) {
	if status == http.StatusNoContent {
		w.WriteHeader(status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *apiError) {
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	obj := errorObject{Code: e.code, Message: e.message, RequestID: w.Header().Get("X-Request-Id")}
	if e.param != "" {
		p := e.param
		obj.Param = &p
	}
	writeJSON(w, e.status, errorEnvelope{Error: obj})
}

// decodeJSON decodes exactly one JSON object from the body into v (a
// pointer to a struct), refusing unknown fields, and turns every decoding
// failure into a 400 (or 413) that names the offending field where there is
// one.
func (s *Server) decodeJSON(r *http.Request, v any) *apiError {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return decodeError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("", "request body must hold a single JSON object")
	}
	// encoding/json matches field names case-insensitively; the API does
	// not, so "Name" is an unknown field rather than a silent alias. Where
	// every field name is lowercase ASCII, only a body with an uppercase
	// letter, a byte outside ASCII (Unicode folds, such as the Kelvin sign
	// for k) or an escape can hold such an alias: the others, nearly every
	// node report, skip the second parse.
	f := s.jsonFields(reflect.TypeOf(v).Elem())
	if f.lower && !mayAlias(body) {
		return nil
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) == nil {
		for k := range top {
			if !f.known[k] {
				return invalid(k, "unknown field %q (field names are case-sensitive)", k)
			}
		}
	}
	return nil
}

// fieldNames is what decodeJSON needs to know of a request type.
type fieldNames struct {
	known map[string]bool // the JSON names of its fields
	lower bool            // every one lowercase ASCII (letters, digits, _)
}

// jsonFields returns the JSON names of a struct type's fields, worked out
// once per type: every node report comes through here.
func (s *Server) jsonFields(t reflect.Type) fieldNames {
	if f, ok := s.fieldNames.Load(t); ok {
		return f.(fieldNames)
	}
	f := fieldNames{known: map[string]bool{}, lower: true}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "" {
			name = t.Field(i).Name
		}
		f.known[name] = true
		for _, c := range []byte(name) {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '_' {
				f.lower = false
			}
		}
	}
	s.fieldNames.Store(t, f)
	return f
}

// mayAlias reports whether a JSON body could name a lowercase field in
// another case: it holds an uppercase ASCII letter, a non-ASCII byte or an
// escape.
func mayAlias(body []byte) bool {
	for _, c := range body {
		if (c >= 'A' && c <= 'Z') || c >= 0x80 || c == '\\' {
			return true
		}
	}
	return false
}

func decodeError(err error) *apiError {
	var (
		mbe *http.MaxBytesError
		se  *json.SyntaxError
		te  *json.UnmarshalTypeError
	)
	switch {
	case errors.As(err, &mbe):
		return &apiError{status: http.StatusRequestEntityTooLarge, code: CodePayloadTooLarge,
			message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
	case errors.Is(err, io.EOF):
		return invalid("", "request body must be a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("", "request body is truncated JSON")
	case errors.As(err, &se):
		return invalid("", "request body is not valid JSON (at byte %d)", se.Offset)
	case errors.As(err, &te):
		if te.Field == "" {
			return invalid("", "request body must be a JSON object")
		}
		return invalid(te.Field, "%s must be %s", te.Field, jsonTypeName(te.Type))
	}
	// encoding/json reports unknown fields only as text.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name = strings.Trim(name, `"`)
		return invalid(name, "unknown field %q", name)
	}
	return invalid("", "request body could not be decoded")
}

func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer in range"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Ptr:
		return jsonTypeName(t.Elem())
	default:
		return "an object"
	}
}

// maxEcho bounds how much of a value from the request an error repeats, so
// an error answer stays small whatever was sent.
const maxEcho = 64

// clip shortens s to maxEcho bytes plus "…".
func clip(s string) string { return textcheck.Clip(s, maxEcho) }

// maxArg bounds a string argument of an error message: the values from the
// request it repeats, and messages of the validators (which quote values
// themselves), kept whole up to this size.
const maxArg = 256

// clipArgs clips the string arguments of an error message.
func clipArgs(args []any) []any {
	for i, a := range args {
		if s, ok := a.(string); ok {
			args[i] = textcheck.Clip(s, maxArg)
		}
	}
	return args
}
