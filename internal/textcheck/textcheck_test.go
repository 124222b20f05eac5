package textcheck

import "testing"

func TestHidden(t *testing.T) {
	for s, want := range map[string]rune{
		"web-1":              0,
		"café ☕":             0,
		"👩‍💻 team":           0, // ZWJ sequence
		"admin\u202Egnp.exe": '\u202E',
		"x\u2066y\u2069":     '\u2066',
		"tab\there":          '\t',
		"line\u2028break":    '\u2028',
		"c1\u0085":           '\u0085',
		"zero\u200bwidth":    '\u200b',
		"bom\ufeff":          '\ufeff',
		"lrm\u200e":          '\u200e',
		"bad utf8 \xff":      '\ufffd',
		// Drawn as nothing.
		"\u3164":         '\u3164',
		"a\u3164b":       '\u3164',
		"\u115f":         '\u115f',
		"\u1160x":        '\u1160',
		"half\uffa0":     '\uffa0',
		"\u2800":         '\u2800',
		"cgj\u034f":      '\u034f',
		"khmer\u17b4":    '\u17b4',
		"\U000e0041 tag": '\U000e0041',
		// Joiners between two characters that show, selectors after one.
		"می\u200cخواهم":        0, // ZWNJ in Persian
		"❤\ufe0f ok":           0,
		"1\ufe0f\u20e3":        0, // keycap
		"\u200d":               '\u200d',
		"\u200c":               '\u200c',
		"a\u200d":              '\u200d',
		"\u200db":              '\u200d',
		"a \u200db":            '\u200d',
		"a\u200d b":            '\u200d',
		"a\u200d\u200cb":       '\u200d',
		"\ufe0f":               '\ufe0f',
		"x \ufe0f":             '\ufe0f',
		"🏳\ufe0f\u200d🌈 team":  0, // a selector, then a joiner
		"❤\ufe0f\u200d🔥":       0,
		"\U000e0100 ideograph": '\U000e0100',
	} {
		r, hidden := Hidden(s)
		if hidden != (want != 0) || r != want {
			t.Errorf("Hidden(%q) = %U, %v; want %U", s, r, hidden, want)
		}
	}
}

func TestClip(t *testing.T) {
	for _, c := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 64, "short"},
		{"abcdef", 3, "abc…"},
		{"ééé", 3, "é…"}, // never splits a rune
		{"", 0, ""},
	} {
		if got := Clip(c.s, c.n); got != c.want {
			t.Errorf("Clip(%q, %d) = %q, want %q", c.s, c.n, got, c.want)
		}
	}
}
