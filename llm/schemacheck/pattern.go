package schemacheck

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// nonLiteral and escapedInRegexps are the converter's NON_LITERAL_SET and
// ESCAPED_IN_REGEXPS_BUT_NOT_IN_LITERALS.
const (
	nonLiteral       = "|.()[]{}*+?"
	escapedInRegexps = "^$.[]()|{}*+?"
)

// patternScan follows the converter's _visit_pattern over a pattern
// without its ^ and $, checking what it makes of it (rule 3) and
// estimating the grammar it writes.
type patternScan struct {
	p        string
	i        int
	ruleName int
	size     int // the sub-rules of repeated groups, classes and dots
	dot      bool
}

// checkPattern checks pattern p (rule 3) and returns an estimate from
// above of the grammar its rule takes, named ruleName long.
func checkPattern(p string, ruleName int) (int, error) {
	if strings.IndexByte(p, 0) >= 0 {
		return 0, errors.New("a pattern cannot hold a NUL character")
	}
	if len(p) < 2 || p[0] != '^' || p[len(p)-1] != '$' {
		return 0, errors.New("a pattern must start with ^ and end with $")
	}
	sc := &patternScan{p: p[1 : len(p)-1], ruleName: ruleName}
	if _, err := sc.seq(0); err != nil {
		return 0, err
	}
	if sc.i < len(sc.p) {
		// The converter stops at an unbalanced ')' and drops the rest.
		return 0, fmt.Errorf("unbalanced ')' at %d", sc.i+1)
	}
	size := ruleName + 9 + 4*len(p) + 40 + sc.size
	if sc.dot {
		size += 30
	}
	return size, nil
}

// elem is one item of a sequence the converter builds: a literal run, or
// anything else (a group, class, dot, repetition or "|"), with the length
// of the pattern it came from.
type elem struct {
	literal  bool
	text     string // a literal run's grammar text
	alt      bool   // "|"
	nullable bool   // it may match nothing
	src      int
}

// seq scans a sequence up to its closing ')' (consumed) or the end, as
// transform does, and reports whether it may match nothing.
func (sc *patternScan) seq(depth int) (bool, error) {
	if depth > MaxDepth {
		return false, fmt.Errorf("groups nested deeper than %d", MaxDepth)
	}
	var seq []elem
	for sc.i < len(sc.p) {
		start := sc.i
		switch c := sc.p[sc.i]; c {
		case '.':
			sc.dot = true
			sc.i++
			seq = append(seq, elem{src: 1})
		case '(':
			sc.i++
			if sc.i < len(sc.p) && sc.p[sc.i] == '?' {
				return false, fmt.Errorf("(? groups at %d are not supported", start+1)
			}
			nullable, err := sc.seq(depth + 1)
			if err != nil {
				return false, err
			}
			seq = append(seq, elem{nullable: nullable, src: sc.i - start})
		case ')':
			if depth == 0 {
				return joinSeq(seq) // the rest is reported by checkPattern
			}
			sc.i++
			return joinSeq(seq)
		case '[':
			if err := sc.class(); err != nil {
				return false, err
			}
			seq = append(seq, elem{src: sc.i - start})
		case '|':
			sc.i++
			seq = append(seq, elem{alt: true, src: 1})
		case '*', '+', '?':
			sc.i++
			if err := sc.repeat(seq, start, c != '?', c != '+'); err != nil {
				return false, err
			}
		case '{':
			lo, unbounded, err := sc.repetition()
			if err != nil {
				return false, err
			}
			if err := sc.repeat(seq, start, unbounded, lo == 0); err != nil {
				return false, err
			}
		default:
			run, err := sc.literal()
			if err != nil {
				return false, err
			}
			if sc.i == start {
				// A ']' or '}' outside a class: the converter would loop
				// on it forever.
				return false, fmt.Errorf("unexpected %q at %d", c, start+1)
			}
			seq = append(seq, elem{literal: true, text: run, src: sc.i - start})
		}
	}
	return joinSeq(seq)
}

// repeat applies a repetition (its source from start) to the last item of
// seq: unbounded (*, +, {m,}) or not; zero when it may repeat zero times.
func (sc *patternScan) repeat(seq []elem, start int, unbounded, zero bool) error {
	if len(seq) == 0 || seq[len(seq)-1].alt {
		return fmt.Errorf("%q at %d has nothing to repeat", sc.p[start:sc.i], start+1)
	}
	last := &seq[len(seq)-1]
	if unbounded && last.nullable {
		// The grammar repeats it through a rule that refers to itself
		// before reading anything: a left recursion the runtime's parser
		// refuses.
		return fmt.Errorf("%q at %d repeats without end what may match nothing", sc.p[start:sc.i], start+1)
	}
	switch {
	case last.literal:
		// Repeated on its own, quoted.
		if err := checkGrammarChars(last.text, false); err != nil {
			return fmt.Errorf("at %d: %w", start+1, err)
		}
	case sc.p[start] == '{':
		// A rule of its own, referred to by the repetition.
		sc.size += sc.ruleName + 12 + 4*last.src + 10
	}
	last.literal, last.text = false, ""
	last.nullable = last.nullable || zero
	last.src += sc.i - start
	return nil
}

// joinSeq ends a sequence as join_seq does: consecutive literal runs are
// merged into one grammar literal, which is checked (rule 3). It reports
// whether the sequence may match nothing: one of its alternatives (split
// at "|") may.
func joinSeq(seq []elem) (bool, error) {
	var run strings.Builder
	flush := func() error {
		defer run.Reset()
		return checkGrammarChars(run.String(), false)
	}
	nullable, alt := false, true
	for _, e := range seq {
		if e.literal {
			run.WriteString(e.text)
			alt = false
			continue
		}
		if err := flush(); err != nil {
			return false, err
		}
		if e.alt {
			nullable = nullable || alt
			alt = true
			continue
		}
		alt = alt && e.nullable
	}
	if err := flush(); err != nil {
		return false, err
	}
	return nullable || alt, nil
}

// literal takes a literal run as the converter does and returns what it
// puts between the quotes of a grammar literal.
func (sc *patternScan) literal() (string, error) {
	p := sc.p
	var run strings.Builder
	for sc.i < len(p) {
		c := p[sc.i]
		switch {
		case c == '\\' && sc.i < len(p)-1:
			if next := p[sc.i+1]; strings.IndexByte(escapedInRegexps, next) >= 0 {
				run.WriteByte(next)
			} else {
				run.WriteString(p[sc.i : sc.i+2])
			}
			sc.i += 2
		case c == '"':
			run.WriteString(`\"`)
			sc.i++
		case strings.IndexByte(nonLiteral, c) < 0 &&
			(sc.i == len(p)-1 || run.Len() == 0 || p[sc.i+1] == '.' || strings.IndexByte(nonLiteral, p[sc.i+1]) < 0):
			run.WriteByte(c)
			sc.i++
		default:
			return run.String(), nil
		}
	}
	return run.String(), nil
}

// class takes a character class, copied into the grammar as it is.
func (sc *patternScan) class() error {
	start := sc.i
	sc.i++
	for sc.i < len(sc.p) && sc.p[sc.i] != ']' {
		if sc.p[sc.i] == '\\' {
			sc.i += 2
		} else {
			sc.i++
		}
	}
	if sc.i >= len(sc.p) {
		return fmt.Errorf("unbalanced '[' at %d", start+1)
	}
	sc.i++
	if err := checkGrammarChars(sc.p[start+1:sc.i-1], true); err != nil {
		return fmt.Errorf("in the class at %d: %w", start+1, err)
	}
	return nil
}

// repetition takes {m}, {m,}, {,n} or {m,n} (rule 3) and returns m, and
// whether it has no n.
func (sc *patternScan) repetition() (lo int, unbounded bool, err error) {
	start := sc.i
	end := strings.IndexByte(sc.p[sc.i:], '}')
	if end < 0 {
		return 0, false, fmt.Errorf("unbalanced '{' at %d", start+1)
	}
	body := sc.p[sc.i+1 : sc.i+end]
	sc.i += end + 1
	num := func(s string) (int, bool) {
		n, err := strconv.Atoi(s)
		return n, err == nil && s[0] != '+' && s[0] != '-' && n <= MaxRepetition
	}
	lo, hi, ok := 0, 0, false
	switch m, n, two := strings.Cut(body, ","); {
	case !two:
		lo, ok = num(m)
		hi = lo
	case strings.Contains(n, ","):
	case m == "" && n == "":
		ok = true // {,}: any number
		unbounded = true
	case n == "":
		lo, ok = num(m)
		unbounded = true
	case m == "":
		hi, ok = num(n)
	default:
		var ok2 bool
		lo, ok = num(m)
		hi, ok2 = num(n)
		ok = ok && ok2
	}
	if !ok || !unbounded && lo > hi {
		return 0, false, fmt.Errorf("{%s} at %d: a repetition must be {m}, {m,}, {,n} or {m,n} with m ≤ n, each from 0 to %d", clip(body), start+1, MaxRepetition)
	}
	return lo, unbounded, nil
}

// checkGrammarChars checks text the converter copies into a grammar
// literal (or, with class, a character class) for what the grammar's
// parser refuses: an escape it does not know, a \x, \u or \U without its
// 2, 4 or 8 hex digits, a backslash at the end.
func checkGrammarChars(s string, class bool) error {
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if i == len(s)-1 {
			return errors.New("a backslash escapes nothing")
		}
		i++
		esc, digits := s[i], 0
		switch esc {
		case 't', 'r', 'n', '\\', '"', '[', ']':
		case 'x':
			digits = 2
		case 'u':
			digits = 4
		case 'U':
			digits = 8
		default:
			what := "outside a class \\^ \\$ \\. \\( \\) \\| \\{ \\} \\* \\+ \\? too"
			if class {
				what = "and no other in a class"
			}
			return fmt.Errorf(`the runtime does not know the escape \%c (it knows \t \r \n \\ \" \[ \] \xHH \uHHHH \UHHHHHHHH, %s)`, esc, what)
		}
		for range digits {
			if i+1 >= len(s) || !isHex(s[i+1]) {
				return fmt.Errorf(`\%c needs %d hex digits right after it`, esc, digits)
			}
			i++
		}
	}
	return nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
