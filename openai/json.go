package openai

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/hearthd/hearth/internal/jsonw"
)

// appendString appends s as a quoted JSON string (jsonw.AppendString).
func appendString[S ~string | ~[]byte](dst []byte, s S) []byte { return jsonw.AppendString(dst, s) }

// AppendJSONString appends s to dst as a quoted JSON string, escaped as
// described at appendString: what encoding/json would produce, control
// bytes and invalid UTF-8 included. For JSON that hearth writes by hand
// outside the OpenAI shapes (the /readyz body).
func AppendJSONString(dst []byte, s string) []byte { return appendString(dst, s) }

// appendStringOrNull appends s as a JSON string, or null when s is empty.
func appendStringOrNull(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return appendString(dst, s)
}

func appendInt(dst []byte, n int64) []byte { return strconv.AppendInt(dst, n, 10) }

// appendCompact appends raw, valid JSON from a request, without its
// insignificant whitespace: a line break would end a server-sent event.
func appendCompact(dst []byte, raw json.RawMessage) []byte {
	b := bytes.NewBuffer(dst)
	if json.Compact(b, raw) != nil {
		return append(dst, "null"...)
	}
	return b.Bytes()
}
