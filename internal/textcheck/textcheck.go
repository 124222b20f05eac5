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
// ("Trojan Source"); characters drawn as nothing (blank); and modifiers
// with nothing to modify. The zero-width joiner and non-joiner stay
// allowed between two characters that show (emoji sequences and several
// scripts need them), and variation selectors after one (❤️). s must be
// valid UTF-8 (checked by the caller); an invalid byte counts as hidden.
func Hidden(s string) (rune, bool) {
	prev := ' ' // the start counts as a space: nothing to join or modify
	for _, r := range s {
		switch {
		case r == unicode.ReplacementChar:
			return r, true
		case joiner(prev) && (joiner(r) || unicode.IsSpace(r)):
			return prev, true
		case joiner(r) || unicode.Is(unicode.Variation_Selector, r):
			if !shows(prev) {
				return r, true
			}
		case unicode.IsControl(r), r == '\u2028', r == '\u2029', unicode.Is(unicode.Cf, r), blank(r):
			return r, true
		}
		prev = r
	}
	if joiner(prev) {
		return prev, true
	}
	return 0, false
}

// joiner reports the zero-width non-joiner and joiner.
func joiner(r rune) bool { return r == '\u200c' || r == '\u200d' }

// shows reports whether r (a character Hidden let through) is drawn as
// something a joiner or variation selector can attach to: a variation
// selector counts as the character it follows (🏳️‍🌈 joins after one).
func shows(r rune) bool { return !unicode.IsSpace(r) && !joiner(r) }

// blank reports letters and symbols drawn as nothing, which make a name
// look empty or like another: the Hangul fillers (U+115F, U+1160, U+3164,
// U+FFA0) with the other code points Unicode lists as default-ignorable
// apart from the format characters (U+034F, U+17B4, U+17B5, …), and the
// blank Braille pattern U+2800.
func blank(r rune) bool {
	return r == '\u2800' || unicode.Is(unicode.Other_Default_Ignorable_Code_Point, r)
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
