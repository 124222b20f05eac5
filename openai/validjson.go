package openai

import (
	"encoding/binary"
	"math/bits"
)

// validJSON reports whether b is valid JSON, exactly as json.Valid does:
// the same grammar, whitespace, nesting limit and leniency towards invalid
// UTF-8 inside strings (FuzzValidJSON checks they agree). It exists because
// json.Valid feeds every byte through its scanner's state functions, an
// indirect call per byte, which showed in profiles of the request path;
// this walks the bytes in loops instead, and a string's body 8 bytes at a
// time. It does not allocate unless b nests deeper than 64 levels.
func validJSON(b []byte) bool {
	// The open arrays and objects, innermost last, as '[' or '{'.
	var buf [64]byte
	stack := buf[:0]
	i := 0
	for {
		// A value is expected at i.
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		switch c := b[i]; c {
		case '{', '[':
			// encoding/json counts a container, even an empty one,
			// against its limit as soon as it opens.
			if len(stack) == maxNestingDepth {
				return false
			}
			stack = append(stack, c)
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == c+2 { // '}' or ']'
				stack = stack[:len(stack)-1]
				i++
				break
			}
			if c == '{' {
				if i = scanKey(b, i); i < 0 {
					return false
				}
			}
			continue
		case '"':
			i = scanString(b, i+1)
		case 't':
			i = scanLiteral(b, i, "true")
		case 'f':
			i = scanLiteral(b, i, "false")
		case 'n':
			i = scanLiteral(b, i, "null")
		default:
			i = scanNumber(b, i)
		}
		if i < 0 {
			return false
		}
		// A value ended at i: close containers until one wants another
		// value after a comma.
		for {
			i = skipSpace(b, i)
			if len(stack) == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			top := stack[len(stack)-1]
			c := b[i]
			if c == top+2 { // '}' or ']'
				stack = stack[:len(stack)-1]
				i++
				continue
			}
			if c != ',' {
				return false
			}
			i++
			if top == '{' {
				if i = scanKey(b, skipSpace(b, i)); i < 0 {
					return false
				}
			}
			break
		}
	}
}

// maxNestingDepth is encoding/json's limit on nested arrays and objects.
const maxNestingDepth = 10000

// scanKey scans an object member's key and its colon from i, returning
// where the value may start, or -1.
func scanKey(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = scanString(b, i+1); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return i + 1
}

func scanLiteral(b []byte, i int, lit string) int {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return -1
	}
	return i + len(lit)
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// scanString scans a string's body from i, just past its opening quote,
// returning the index past its closing quote, or -1. As in encoding/json,
// any byte from 0x20 up is allowed, valid UTF-8 or not.
func scanString(b []byte, i int) int {
	for {
		// Skip 8 ordinary bytes at a time. Each mask flags the bytes of x
		// that are below 0x20, a quote or a backslash; a borrow can flag
		// a byte wrongly, but only above one flagged rightly, so the
		// lowest flag is the first byte that needs a look.
		for len(b)-i >= 8 {
			x := binary.LittleEndian.Uint64(b[i:])
			q := x ^ ('"' * lsb)
			s := x ^ ('\\' * lsb)
			m := ((x - 0x20*lsb) &^ x) | ((q - lsb) &^ q) | ((s - lsb) &^ s)
			if m &= msb; m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			return -1
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if len(b)-i < 6 || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return -1
				}
				i += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default:
			i++
		}
	}
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// scanNumber scans a number from i, returning the index past it, or -1.
// Whatever follows is left for the caller to judge, as in "01" or "1x".
func scanNumber(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	if i >= len(b) {
		return -1
	}
	switch c := b[i]; {
	case c == '0':
		i++
	case '1' <= c && c <= '9':
		i = skipDigits(b, i+1)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}
