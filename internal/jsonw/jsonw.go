// Package jsonw writes JSON by appending to a byte slice, for the hot paths
// that encode fixed shapes by hand instead of through encoding/json's
// reflection (the OpenAI chunks, the runtime's requests).
package jsonw

import "unicode/utf8"

const hexDigits = "0123456789abcdef"

// AppendString appends s as a quoted JSON string. It is hand-written rather
// than taken from encoding/json because that package offers no append-style
// string encoder, and the streaming path must not allocate per token. The
// output decodes to exactly what encoding/json would produce: control
// characters, quotes and backslashes are escaped, U+2028 and U+2029 are
// escaped so the output is also safe inside JavaScript, and invalid UTF-8
// is replaced with U+FFFD. HTML characters are left as they are: the
// consumers are JSON parsers, not HTML pages.
func AppendString[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		b := s[i]
		if b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '"', '\\':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		n := min(len(s)-i, utf8.UTFMax)
		c, size := utf8.DecodeRuneInString(string(s[i : i+n]))
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
