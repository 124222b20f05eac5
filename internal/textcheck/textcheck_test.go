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
