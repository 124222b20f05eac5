package ollama

import (
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The token line Ollama writes for nearly every token of a plain chat
// answer, as encoding/json lays out api.ChatResponse:
//
//	{"model":"…","created_at":"…","message":{"role":"assistant","content":"…"},"done":false}
//
// Decoding it with encoding/json was the largest cost of relaying a token
// (validation, reflection, field matching). fastTokenLine recognises exactly
// this layout and takes the content string out by hand; any other line
// (tool calls, thinking, the final line, errors, another key order or
// whitespace) is left to encoding/json, so the two must agree on every line
// the fast path accepts (FuzzDecodeLine checks it).
//
// /api/generate (legacy completions) writes the same line with the text in
// "response" instead of a message, which the fast path takes too:
//
//	{"model":"…","created_at":"…","response":"…","done":false}
const (
	tokenLineModel    = `{"model":"`
	tokenLineCreated  = `","created_at":"`
	tokenLineContent  = `","message":{"role":"assistant","content":"`
	tokenLineEnd      = `"},"done":false}`
	tokenLineResponse = `","response":"`
	responseLineEnd   = `","done":false}`
)

// fastTokenLine returns the content of a token line. ok is false if line
// is not exactly such a line (an optional trailing '\n' aside) or holds
// anything encoding/json would reject or the fast path does not handle.
func fastTokenLine(line []byte) (content string, ok bool) {
	b := line
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if !hasPrefix(b, tokenLineModel) {
		return "", false
	}
	i := len(tokenLineModel)
	if i = skipPlainString(b, i); i < 0 || !hasPrefix(b[i:], tokenLineCreated) {
		return "", false
	}
	i += len(tokenLineCreated)
	if i = skipPlainString(b, i); i < 0 {
		return "", false
	}
	var start int
	var end string
	switch {
	case hasPrefix(b[i:], tokenLineContent):
		start, end = i+len(tokenLineContent), tokenLineEnd
	case hasPrefix(b[i:], tokenLineResponse):
		start, end = i+len(tokenLineResponse), responseLineEnd
	default:
		return "", false
	}
	// Find the closing quote, noting what the text needs on the way.
	escaped, ascii := false, true
	i = start
	for ; i < len(b); i++ {
		c := b[i]
		if c == '"' {
			break
		}
		switch {
		case c == '\\':
			escaped = true
			i++ // the escaped byte cannot close the string
		case c < 0x20:
			return "", false // a raw control character is invalid JSON
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	if i >= len(b) || string(b[i:]) != end {
		return "", false
	}
	raw := b[start:i]
	if !escaped && (ascii || utf8.Valid(raw)) {
		return string(raw), true
	}
	return unquote(raw)
}

func hasPrefix(b []byte, p string) bool {
	return len(b) >= len(p) && string(b[:len(p)]) == p
}

// skipPlainString returns the index of the quote that ends the string
// starting at b[i], or -1 if the string is unterminated or holds an escape
// or a control character. (Strings the line does not need, the model name
// and time stamp, never hold escapes in Ollama's output; invalid UTF-8 in
// them is fine, as encoding/json accepts it in a field it skips.)
func skipPlainString(b []byte, i int) int {
	for ; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i
		case c == '\\' || c < 0x20:
			return -1
		}
	}
	return -1
}

// unquote decodes the body of a JSON string (without its quotes) the way
// encoding/json does: every escape, \uXXXX surrogate pairs combined, a
// lone surrogate and invalid UTF-8 replaced by U+FFFD. ok is false where
// encoding/json reports a syntax error. (Hand-written because encoding/json
// does not export its unquoting, and strconv.Unquote follows Go's rules,
// not JSON's.)
func unquote(s []byte) (string, bool) {
	var b strings.Builder
	b.Grow(len(s))
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			if r+1 >= len(s) {
				return "", false
			}
			switch e := s[r+1]; e {
			case '"', '\\', '/':
				b.WriteByte(e)
			case 'b':
				b.WriteByte('\b')
			case 'f':
				b.WriteByte('\f')
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'u':
				rr := getu4(s[r:])
				if rr < 0 {
					return "", false
				}
				r += 6
				if utf16.IsSurrogate(rr) {
					// A high surrogate followed by a low one is one
					// rune; otherwise the first becomes U+FFFD and
					// whatever follows is decoded on its own.
					if dec := utf16.DecodeRune(rr, getu4(s[r:])); dec != unicode.ReplacementChar {
						r += 6
						rr = dec
					} else {
						rr = unicode.ReplacementChar
					}
				}
				b.WriteRune(rr)
				continue
			default:
				return "", false
			}
			r += 2
		case c == '"' || c < 0x20:
			return "", false
		case c < utf8.RuneSelf:
			b.WriteByte(c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			b.WriteRune(rr) // RuneError for an invalid byte
			r += size
		}
	}
	return b.String(), true
}

// getu4 decodes the \uXXXX escape at the start of s, or returns -1.
func getu4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[2:6] {
		v, ok := unhex(c)
		if !ok {
			return -1
		}
		r = r*16 + rune(v)
	}
	return r
}

// unhex is the value of one hexadecimal digit (JSON escapes, chunk sizes).
func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// The last line of a chat answer, as encoding/json lays out
// api.ChatResponse (the metrics are omitempty, so any may be missing):
//
//	{"model":"…","created_at":"…","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,"total_duration":…,"load_duration":…,"prompt_eval_count":…,"prompt_eval_duration":…,"eval_count":…,"eval_duration":…}
//
// Ollama 0.17 writes "done" before "done_reason" (its ChatResponse
// declares them in that order):
//
//	…"content":""},"done":true,"done_reason":"stop","total_duration":…
//
// One per stream, but encoding/json's reflection makes it cost as much as
// a dozen token lines; fastFinalLine takes both layouts by hand on the same
// terms as fastTokenLine: exactly one of them or encoding/json decides.
const (
	finalLineMessage    = `","message":{"role":"assistant","content":""}`
	finalLineReason     = `,"done_reason":"`
	finalLineDone       = `","done":true`
	finalLineDoneReason = `,"done":true,"done_reason":"`
)

// fastFinalLine decodes a final line into l. ok is false, and l untouched,
// if line is not exactly such a line (an optional trailing '\n' aside):
// another key, order or spacing, a number that is not a plain integer.
func fastFinalLine(line []byte, l *chatLine) (ok bool) {
	b := line
	if n := len(b); n > 0 && b[n-1] == '\n' {
		b = b[:n-1]
	}
	if !hasPrefix(b, tokenLineModel) {
		return false
	}
	i := len(tokenLineModel)
	if i = skipPlainString(b, i); i < 0 || !hasPrefix(b[i:], tokenLineCreated) {
		return false
	}
	if i = skipPlainString(b, i+len(tokenLineCreated)); i < 0 || !hasPrefix(b[i:], finalLineMessage) {
		return false
	}
	i += len(finalLineMessage)
	var reason []byte
	switch {
	case hasPrefix(b[i:], finalLineReason):
		start := i + len(finalLineReason)
		if i = skipPlainString(b, start); i < 0 || !hasPrefix(b[i:], finalLineDone) {
			return false
		}
		reason = b[start:i]
		i += len(finalLineDone)
	case hasPrefix(b[i:], finalLineDoneReason):
		start := i + len(finalLineDoneReason)
		if i = skipPlainString(b, start); i < 0 {
			return false
		}
		reason = b[start:i]
		i++ // the closing quote
	default:
		return false
	}
	if !utf8.Valid(reason) {
		return false
	}
	var prompt, eval int
	for i < len(b) && b[i] == ',' {
		var key string
		switch {
		case hasPrefix(b[i:], `,"prompt_eval_count":`):
			key = "prompt_eval_count"
		case hasPrefix(b[i:], `,"eval_count":`):
			key = "eval_count"
		case hasPrefix(b[i:], `,"total_duration":`):
			key = "total_duration"
		case hasPrefix(b[i:], `,"load_duration":`):
			key = "load_duration"
		case hasPrefix(b[i:], `,"prompt_eval_duration":`):
			key = "prompt_eval_duration"
		case hasPrefix(b[i:], `,"eval_duration":`):
			key = "eval_duration"
		default:
			return false
		}
		i += len(key) + 4 // ,"key":
		n, next := plainInt(b, i)
		if next < 0 {
			return false
		}
		switch key {
		case "prompt_eval_count":
			prompt = n
		case "eval_count":
			eval = n
		}
		i = next
	}
	if i != len(b)-1 || b[i] != '}' {
		return false
	}
	*l = chatLine{Done: true, DoneReason: string(reason), PromptEvalCount: prompt, EvalCount: eval}
	return true
}

// plainInt reads a non-negative JSON integer at b[i] (no sign, fraction,
// exponent or leading zero, at most 18 digits so it cannot overflow) and
// returns it with the index after it, or next < 0.
func plainInt(b []byte, i int) (n, next int) {
	start := i
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + int(b[i]-'0')
	}
	if d := i - start; d == 0 || d > 18 || d > 1 && b[start] == '0' {
		return 0, -1
	}
	return n, i
}
