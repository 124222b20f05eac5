// Package textcheck decides whether free text from a user (names,
// descriptions) is safe to show to other people and in terminals.
package textcheck

import (
	"unicode"
	"unicode/utf8"
)

// Hidden returns the first character of s that would not show as itself
// when printed, and whether there is one: control characters (C0, C1),
// line and paragraph separators, and format characters (Unicode Cf),
// among them the bidirectional overrides and isolates (U+202A–U+202E,
// U+2066–U+2069) that can make a name read differently from what it is
// ("Trojan Source"). The zero-width joiner and non-joiner stay allowed:
// emoji sequences and several scripts need them. s must be valid UTF-8
// (checked by the caller); an invalid byte counts as hidden.
func Hidden(s string) (rune, bool) {
	for _, r := range s {
		switch {
		case r == '\u200c' || r == '\u200d':
		case r == unicode.ReplacementChar:
			return r, true
		case unicode.IsControl(r), r == '\u2028', r == '\u2029', unicode.Is(unicode.Cf, r):
			return r, true
		}
	}
	return 0, false
}

// Clip shortens s to at most n bytes, cut on a rune boundary and marked
// with "…", for repeating a value from a request (in an error, a report)
// without repeating all of it.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
