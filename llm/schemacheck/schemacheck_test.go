package schemacheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// prop is an object schema with one property a of schema s.
func prop(s string) string { return `{"type":"object","properties":{"a":` + s + `}}` }

func pattern(p string) string {
	b, _ := json.Marshal(p)
	return prop(`{"type":"string","pattern":` + string(b) + `}`)
}

// Each refused schema is one the real runtime could not take (Ollama
// 0.17.4, the tiny model: "crash" is its runner stopped, every stream on
// it cut; "server" is the whole server down; "hang" is no answer, ever;
// "500" an error the API turned into a 503; "wrong" sampled anything but
// the schema); each accepted one it took.
func TestRules(t *testing.T) {
	for _, c := range []struct {
		schema  string
		pointer string // "-" for accepted
		reason  string // part of the reason
	}{
		// Accepted: what SDKs and tool definitions send.
		{`{"type":"object","properties":{"city":{"type":"string","description":"a city"},"unit":{"type":"string","enum":["c","f"]}},"required":["city"]}`, "-", ""},
		{prop(`{"type":"string","maxLength":2000}`), "-", ""},
		{prop(`{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":2000}`), "-", ""},
		{prop(`{"type":"integer","minimum":0,"maximum":3000000000}`), "-", ""},
		{prop(`{"type":"integer","minimum":-9007199254740991}`), "-", ""},
		{prop(`{"type":"number","minimum":1e300}`), "-", ""}, // not read by the converter
		{pattern(`^[0-9]{2,3}-\.x$`), "-", ""},
		{pattern(`^\x41\u0042\n$`), "-", ""},
		{pattern(`^[\u0000-\u007F]*$`), "-", ""},
		{pattern(`^(a|b)+c?$`), "-", ""},
		{pattern(`^a(b$`), "-", ""},
		{pattern(`^(a?){2,5}$`), "-", ""},
		{pattern(`^$`), "-", ""},
		{pattern(`^[]$`), "-", ""},
		{pattern(`^é+$`), "-", ""},
		{`{"$defs":{"p":{"type":"object","properties":{"x":{"type":"number"}}}},"type":"object","properties":{"a":{"$ref":"#/$defs/p"},"b":{"$ref":"#/$defs/p"}}}`, "-", ""},
		{`{"type":"object","properties":{"a-b":{"type":"string"}},"additionalProperties":true}`, "-", ""},
		{`{"anyOf":[{"type":"string"},{"type":["integer","null"]}]}`, "-", ""},
		{`{"type":"object","allOf":[{"properties":{"a":{"type":"string"}}},{"anyOf":[{"properties":{"b":{"const":1}}}]}]}`, "-", ""},
		{`{"type":"array","prefixItems":[{"type":"string","format":"date-time"},{"format":"uuid"}]}`, "-", ""},
		{`{}`, "-", ""},

		// Rule 1: the converter recurses per level.
		{strings.Repeat(`{"type":"array","items":`, 70) + `{"type":"string"}` + strings.Repeat(`}`, 70), strings.Repeat("/items", 64), "deeper than 64"}, // 3 000 levels: crash
		// Rule 2.
		{prop(`{"type":"string","maxLength":2001}`), "/properties/a/maxLength", "0 to 2000"},                        // crash
		{prop(`{"type":"string","minLength":100000}`), "/properties/a/minLength", "0 to 2000"},                      // crash
		{prop(`{"type":"string","minLength":-1}`), "/properties/a/minLength", "0 to 2000"},                          // crash
		{prop(`{"type":"string","minLength":"1"}`), "/properties/a/minLength", "0 to 2000"},                         // 500
		{prop(`{"type":"string","minLength":5,"maxLength":3}`), "/properties/a/minLength", "above maxLength"},       // hang
		{prop(`{"type":"array","items":{},"maxItems":1e300}`), "/properties/a/maxItems", "0 to 2000"},               // undefined
		{prop(`{"type":"array","items":{},"minItems":3,"maxItems":2}`), "/properties/a/minItems", "above maxItems"}, // hang
		// Rule 3.
		{pattern(`^a{1000000}$`), "/properties/a/pattern", "from 0 to 2000"}, // crash
		{pattern(`^a{2001}$`), "/properties/a/pattern", "from 0 to 2000"},
		{pattern(`^a{-1}$`), "/properties/a/pattern", "from 0 to 2000"},          // crash
		{pattern(`^a{5,3}$`), "/properties/a/pattern", "m ≤ n"},                  // hang
		{pattern(`^a{1,2,3}$`), "/properties/a/pattern", "{m}, {m,}"},            // 500
		{pattern(`^a{$`), "/properties/a/pattern", "unbalanced '{'"},             // 500
		{pattern(`^\d{3}$`), "/properties/a/pattern", `escape \d`},               // crash
		{pattern(`^[\d]$`), "/properties/a/pattern", `escape \d`},                // crash
		{pattern(`^[a\-z]$`), "/properties/a/pattern", `escape \-`},              // crash
		{pattern(`^a\$`), "/properties/a/pattern", "escapes nothing"},            // crash
		{pattern(`^\x4*$`), "/properties/a/pattern", "2 hex digits"},             // the grammar's parser refuses it
		{pattern(`^(?:ab)$`), "/properties/a/pattern", "(? groups"},              // server
		{pattern(`^*$`), "/properties/a/pattern", "nothing to repeat"},           // server
		{pattern(`^a|*$`), "/properties/a/pattern", "nothing to repeat"},         // crash
		{pattern(`^(|{2})$`), "/properties/a/pattern", "nothing to repeat"},      //
		{pattern(`^()*$`), "/properties/a/pattern", "may match nothing"},         // crash
		{pattern(`^(a?)+$`), "/properties/a/pattern", "may match nothing"},       // crash
		{pattern(`^(a|)*$`), "/properties/a/pattern", "may match nothing"},       // crash
		{pattern(`^(a*){2,}$`), "/properties/a/pattern", "may match nothing"},    //
		{pattern(`^a}$`), "/properties/a/pattern", "unexpected '}'"},             // hang
		{pattern(`^a]$`), "/properties/a/pattern", "unexpected ']'"},             // hang
		{pattern("^a\x00b$"), "/properties/a/pattern", "NUL"},                    // crash
		{pattern(`^ab`), "/properties/a/pattern", "start with ^ and end with $"}, // 500
		{pattern(`^[ab$`), "/properties/a/pattern", "unbalanced '['"},            // 500
		{pattern(`^a)b$`), "/properties/a/pattern", "unbalanced ')'"},            // wrong
		{pattern(`^` + strings.Repeat("(", 65) + strings.Repeat(")", 65) + `$`), "/properties/a/pattern", "deeper than 64"},
		{prop(`{"type":"string","pattern":5}`), "/properties/a/pattern", "must be a string"}, // 500
		// Rule 4.
		{`{"$ref":"#"}`, "/$ref", "not local"},                                                    // 500
		{`{"$ref":"https://example.com/s.json"}`, "/$ref", "not local"},                           // wrong
		{`{"$ref":"file:///etc/passwd"}`, "/$ref", "not local"},                                   // 500
		{`{"$ref":"#/$defs/missing"}`, "/$ref", "names no member"},                                // 500
		{`{"$ref":5}`, "/$ref", "must be a string"},                                               // 500
		{`{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, "/$defs/a/$ref", "recursive"}, // hang
		{`{"$defs":{"n":{"type":"object","properties":{"c":{"type":"array","items":{"$ref":"#/$defs/n"}}}}},"$ref":"#/$defs/n"}`, "/$defs/n/properties/c/items/$ref", "recursive"},
		{`{"type":"object","properties":{"a":{"anyOf":[{"$ref":"#/properties/a"},{"type":"null"}]}}}`, "/properties/a/anyOf/0/$ref", "recursive"},
		{`{"type":"object","properties":{"a":{"const":{"$ref":"https://x"}}}}`, "/properties/a/const/$ref", "not local"}, // 500
		// Rule 5.
		{prop(`{"type":"integer","minimum":1e300}`), "/properties/a/minimum", "within ±9007199254740991"},    // 500
		{prop(`{"type":"integer","exclusiveMaximum":-1e300}`), "/properties/a/exclusiveMaximum", "within ±"}, // 500
		{prop(`{"type":["integer","null"],"maximum":1e19}`), "/properties/a/0/maximum", "within ±"},          //
		{prop(`{"type":"integer","maximum":"9"}`), "/properties/a/maximum", "within ±"},                      // 500
		// Rule 6.
		{prop(`{"type":"string","format":5}`), "/properties/a/format", "must be a string"}, // 500
		{`{"anyOf":{"type":"string"}}`, "/anyOf", "must be an array"},                      // 500
		{`{"type":"object","properties":[1]}`, "/properties", "must be an object"},         // 500
		{prop(`{"type":"decimal"}`), "/properties/a", "type decimal"},                      // 500
		{prop(`true`), "/properties/a", "schema object"},                                   // 500
		{`[]`, "", "JSON object"},
		// Rule 7.
		{`{"type":"object","properties":{"a]":{"type":"string"}},"additionalProperties":true}`, "/properties/a]", `']' or '\'`}, // crash
		// Rule 8.
		{nested(12, strings.Repeat("p", 200)), "", "too complex"}, // crash
		{optionalProps(500), "", "too complex"},                   // crash
	} {
		err := Check([]byte(c.schema))
		var e *Error
		switch {
		case c.pointer == "-":
			if err != nil {
				t.Errorf("%.120s: refused: %v", c.schema, err)
			}
		case !errors.As(err, &e):
			t.Errorf("%.120s: accepted (%v), want refused at %s", c.schema, err, c.pointer)
		case e.Pointer != c.pointer || !strings.Contains(e.Reason, c.reason):
			t.Errorf("%.120s: %q at %q, want %q at %q", c.schema, e.Reason, e.Pointer, c.reason, c.pointer)
		}
	}
}

// nested is d objects nested, each with one property named name+level.
func nested(d int, name string) string {
	s := `{"type":"string"}`
	for i := range d {
		s = fmt.Sprintf(`{"type":"object","properties":{"%s%d":%s}}`, name, i, s)
	}
	return s
}

// optionalProps is an object of n optional string properties.
func optionalProps(n int) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":{"type":"string"}`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

// What the runtime took, near the edge of rule 8: 250 optional
// properties (a grammar of 27 592 bytes; 300 crash), 500 required ones,
// six levels of 200-byte names.
func TestLargeSchemasTheRuntimeTakes(t *testing.T) {
	names := make([]string, 500)
	for i := range names {
		names[i] = fmt.Sprintf(`"k%d"`, i)
	}
	required := strings.TrimSuffix(optionalProps(500), "}") + `,"required":[` + strings.Join(names, ",") + `]}`
	for _, s := range []string{optionalProps(250), required, nested(6, strings.Repeat("p", 200))} {
		if err := Check([]byte(s)); err != nil {
			t.Errorf("%.80s: %v", s, err)
		}
	}
}

// The port of the converter's integer ranges writes what it does.
func TestMinMaxInt(t *testing.T) {
	for _, c := range []struct {
		lo, hi int64
		want   string
	}{
		{0, 9, `[0-9]`},
		{1, 10, `[1-9] | "10"`},
		{minInt64, 0, `"-" [1-9] [0-9]{0,15} | "0"`},
		{0, maxInt64, `[0] | [1-9] [0-9]{0,15}`},
		{-5, -1, `"-" ([1-5])`},
	} {
		var b strings.Builder
		minMaxInt(c.lo, c.hi, &b, 16, true)
		if b.String() != c.want {
			t.Errorf("%d..%d: %q, want %q", c.lo, c.hi, b.String(), c.want)
		}
	}
}

// FuzzCheck: Check never panics, and what it accepts is valid JSON whose
// every pattern it scanned whole.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		prop(`{"type":"string","maxLength":2000}`), pattern(`^(a|b){2,3}[x-z]\.$`), `{"$defs":{"a":{"type":"string"}},"$ref":"#/$defs/a"}`,
		prop(`{"type":"integer","minimum":-12,"maximum":345}`), `{"type":"object","allOf":[{"$ref":"#/$defs/x"}],"$defs":{"x":{"properties":{"q":{}}}}}`,
		`{"anyOf":[{"type":"array","prefixItems":[{}]},{"enum":[1,"a",null]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if err := Check(b); err == nil && !json.Valid(b) {
			t.Fatalf("accepted invalid JSON %q", b)
		}
	})
}

// FuzzPattern: the scan of a pattern never panics and ends where the
// pattern does, or refuses it.
func FuzzPattern(f *testing.F) {
	for _, p := range []string{`^a{2,3}$`, `^(a|)b*$`, `^[\x41-\x5a]+\.$`, `^\d$`, `^((a)?)+$`, `^a{,}$`} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		n, err := checkPattern(p, 4)
		if err == nil && n < len(p) {
			t.Fatalf("%q: grammar estimated at %d bytes, less than the pattern", p, n)
		}
	})
}
