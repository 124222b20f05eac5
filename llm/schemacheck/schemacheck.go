// Package schemacheck tells whether the model runtime can take a JSON schema
// to constrain its output with (a chat request's response_format, a tool's
// parameters, the schema of a forced tool call).
//
// Every supported Ollama turns a schema into a llama.cpp grammar
// (common/json-schema-to-grammar.cpp, "the converter" below) and samples
// with it. A grammar the runtime cannot parse crashes its model runner on
// Ollama 0.17.4 (0.9.6 refuses it), cutting every other stream on the
// deployment; some schemas make the converter itself bring down or hang
// the whole server; others it turns into a grammar that silently samples
// something else. So hearthd checks every schema it forwards against the
// rules below, each found on the real runtime (TestRules cites each one;
// the e2e test sends the worst to a real Ollama):
//
//  1. The schema nests at most MaxDepth levels of JSON (the converter
//     recurses per level, on the stack of the runtime's server).
//  2. minItems, maxItems, minLength and maxLength are numbers from 0 to
//     MaxRepetition, and a minimum is at most its maximum: the grammar
//     parser refuses a repetition above 2000, and min > max hangs the
//     server.
//  3. A pattern is a string starting with ^ and ending with $, in the
//     converter's subset of regular expressions: every {m}, {m,} or {m,n}
//     within 0..MaxRepetition and m ≤ n; no *, +, ? or { with nothing to
//     repeat (at its start, after ( or |; "(?:" is one: the converter
//     reads past its own data and the server dies); escapes only those the
//     grammar has (\x, \u and \U with 2, 4 and 8 hex digits, \t \r \n \\
//     \" \[ \], and outside […] also \^ \$ \. \( \) \| \{ \} \* \+ \?; so
//     no \d, \w, \s, \-); no trailing backslash, no NUL; ( nested at most
//     MaxDepth deep.
//  4. A $ref is a string "#/…" naming a member of the schema itself (the
//     converter fetches no remote schema: an https $ref samples anything),
//     and no $ref refers, directly or not, to a schema it is part of (a
//     recursive schema hangs the server or crashes the runner).
//  5. An integer's minimum, maximum, exclusiveMinimum and
//     exclusiveMaximum lie within ±MaxInteger (±1e300 is undefined
//     behaviour in the converter).
//  6. format, when given, is a string; anyOf and oneOf are arrays;
//     properties is an object; type is a type the converter knows. (The
//     converter refuses these; checked here for a clear message.)
//  7. Property names of an object that allows more properties than it
//     names hold no ']' or '\' (they are copied into a character class).
//  8. The grammar fits the converter's buffer: the runtime cuts it at
//     max(32 KiB, min(1 MiB, 4 × the schema's compact length)) bytes, and
//     a cut grammar crashes the runner. Long property names nested deep
//     and hundreds of optional properties get there; grammarSize
//     estimates the grammar from above.
//
// The rules are hand-written rather than a JSON Schema validator's
// (github.com/santhosh-tekuri/jsonschema compiles schemas to validate
// documents): they are about what the converter can take, which differs
// from what JSON Schema allows both ways.
package schemacheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Limits of the rules above.
const (
	MaxDepth      = 64
	MaxRepetition = 2000
	MaxInteger    = 1<<53 - 1
)

// Error is a schema the runtime cannot take.
type Error struct {
	// Pointer is the JSON pointer of the member at fault within the
	// schema ("" for the whole schema).
	Pointer string
	Reason  string
}

func (e *Error) Error() string {
	if e.Pointer == "" {
		return e.Reason
	}
	p := e.Pointer
	if len(p) > 128 {
		p = "…" + p[len(p)-128:]
	}
	return "at " + p + ": " + e.Reason
}

// Check reports whether the runtime can constrain its output with schema,
// a JSON object; nil if it can.
func Check(schema []byte) error { return (&checker{}).check(schema) }

func (c *checker) check(schema []byte) error {
	var compact bytes.Buffer
	if err := json.Compact(&compact, schema); err != nil {
		return &Error{Reason: "not valid JSON"}
	}
	dec := json.NewDecoder(bytes.NewReader(compact.Bytes()))
	dec.UseNumber()
	var root any
	if err := dec.Decode(&root); err != nil {
		return &Error{Reason: "not valid JSON"}
	}
	if _, ok := root.(map[string]any); !ok {
		return &Error{Reason: "must be a JSON object"}
	}
	c.root, c.refs = root, map[string]*refState{}
	if err := c.depth(root, "", 1); err != nil {
		return err
	}
	if err := c.resolveAll(root, ""); err != nil {
		return err
	}
	if _, err := c.visit(root, "", 0); err != nil {
		return err
	}
	c.estimate = c.size + baseGrammar
	if size, limit := c.estimate, bufferSize(compact.Len()); size >= limit {
		return &Error{Reason: fmt.Sprintf("too complex: its grammar would take about %d bytes, more than the %d the runtime takes for a schema of this size; use fewer optional properties, shorter property names or less nesting", size, limit)}
	}
	return nil
}

// bufferSize is the most grammar the runtime keeps for a schema of n
// compact bytes (Ollama's llama.SchemaToGrammar).
func bufferSize(n int) int { return max(32<<10, min(1<<20, 4*n)) }

type checker struct {
	root   any
	refs   map[string]*refState
	size   int // the grammar so far, estimated from above
	visits int
	// estimate is the whole grammar's, once the schema passed the other
	// rules.
	estimate int
}

// maxVisits bounds the schemas the converter visits (each one at least a
// rule of the grammar) well above what fits the largest grammar.
const maxVisits = 50_000

// refState is a $ref the converter resolves: its target, and whether it
// is being visited (a cycle) or was (its rule is shared).
type refState struct {
	target   any
	visiting bool
	done     bool
}

// depth checks rule 1.
func (c *checker) depth(v any, ptr string, d int) error {
	switch v := v.(type) {
	case map[string]any:
		if d > MaxDepth {
			return &Error{Pointer: ptr, Reason: fmt.Sprintf("nested deeper than %d levels", MaxDepth)}
		}
		for k, x := range v {
			if err := c.depth(x, ptr+"/"+escapePointer(k), d+1); err != nil {
				return err
			}
		}
	case []any:
		if d > MaxDepth {
			return &Error{Pointer: ptr, Reason: fmt.Sprintf("nested deeper than %d levels", MaxDepth)}
		}
		for i, x := range v {
			if err := c.depth(x, ptr+"/"+strconv.Itoa(i), d+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolveAll resolves every $ref in the document, as the converter does
// before it converts anything: in any object, but not inside the object
// holding a $ref (rule 4).
func (c *checker) resolveAll(v any, ptr string) error {
	switch v := v.(type) {
	case map[string]any:
		if raw, ok := v["$ref"]; ok {
			ref, ok := raw.(string)
			if !ok {
				return &Error{Pointer: ptr + "/$ref", Reason: "$ref must be a string"}
			}
			if _, err := c.resolve(ref, ptr+"/$ref"); err != nil {
				return err
			}
			return nil
		}
		for k, x := range v {
			if err := c.resolveAll(x, ptr+"/"+escapePointer(k)); err != nil {
				return err
			}
		}
	case []any:
		for i, x := range v {
			if err := c.resolveAll(x, ptr+"/"+strconv.Itoa(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

// resolve finds ref's target as the converter does: "#/" and members
// split at "/" (no ~ escapes), an array's member by its index.
func (c *checker) resolve(ref, ptr string) (*refState, error) {
	if st, ok := c.refs[ref]; ok {
		return st, nil
	}
	if !strings.HasPrefix(ref, "#/") {
		return nil, &Error{Pointer: ptr, Reason: fmt.Sprintf("$ref %q is not local: only \"#/…\" references within the schema are supported", clip(ref))}
	}
	target := c.root
	for _, tok := range strings.Split(ref[2:], "/") {
		switch t := target.(type) {
		case map[string]any:
			x, ok := t[tok]
			if !ok {
				return nil, &Error{Pointer: ptr, Reason: fmt.Sprintf("$ref %q names no member of the schema", clip(ref))}
			}
			target = x
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(t) {
				return nil, &Error{Pointer: ptr, Reason: fmt.Sprintf("$ref %q names no member of the schema", clip(ref))}
			}
			target = t[i]
		default:
			return nil, &Error{Pointer: ptr, Reason: fmt.Sprintf("$ref %q names no member of the schema", clip(ref))}
		}
	}
	st := &refState{target: target}
	c.refs[ref] = st
	return st, nil
}

// primitiveTypes are the types the converter knows (its PRIMITIVE_RULES).
var primitiveTypes = map[string]bool{
	"boolean": true, "number": true, "integer": true, "string": true, "null": true, "object": true, "array": true,
	"value": true, "uuid": true, "char": true, "decimal-part": true, "integral-part": true,
}

// visit walks schema s as the converter's visit does, checking the rules
// that apply where it goes; name is the length of the rule name the
// converter gives it. It returns the length of the name a parent's rule
// refers to it by, and adds its rules to c.size.
func (c *checker) visit(v any, ptr string, name int) (int, error) {
	// The converter visits a schema once per path to it, and a type list
	// visits the schema once per type: nested type lists take it (and
	// this walk) exponentially long. Its grammar grows with every visit.
	if c.visits++; c.visits > maxVisits || c.size > 1<<20 {
		return 0, &Error{Pointer: ptr, Reason: "too complex: the runtime would take too long to turn it into a grammar; use fewer nested type lists (\"type\": [...]) or a simpler schema"}
	}
	s, ok := v.(map[string]any)
	if !ok {
		return 0, &Error{Pointer: ptr, Reason: "must be a schema object"}
	}
	ruleName := max(name, 4) + 1 // "root"; a reserved name gets "-"
	typ, hasType := s["type"]
	if f, ok := s["format"]; ok {
		if _, isString := f.(string); !isString {
			return 0, &Error{Pointer: ptr + "/format", Reason: "format must be a string"}
		}
	}
	is := func(t string) bool { return !hasType || typ == t }
	switch {
	case s["$ref"] != nil:
		ref := s["$ref"].(string) // resolveAll checked it
		st, err := c.resolve(ref, ptr+"/$ref")
		if err != nil {
			return 0, err
		}
		refName := 3 + len(ref)
		switch {
		case st.visiting:
			return 0, &Error{Pointer: ptr + "/$ref", Reason: fmt.Sprintf("$ref %q refers to a schema it is part of: recursive schemas are not supported", clip(ref))}
		case !st.done:
			st.visiting = true
			if _, err := c.visit(st.target, ref[1:], refName); err != nil {
				return 0, err
			}
			st.visiting, st.done = false, true
		}
		c.rule(ruleName, refName)
		return ruleName, nil
	case s["oneOf"] != nil || s["anyOf"] != nil:
		key := "anyOf"
		if _, ok := s["oneOf"]; ok {
			key = "oneOf"
		}
		alts, ok := s[key].([]any)
		if !ok {
			return 0, &Error{Pointer: ptr + "/" + key, Reason: key + " must be an array"}
		}
		return c.union(alts, ptr+"/"+key, name, ruleName)
	}
	if types, ok := typ.([]any); ok {
		alts := make([]any, len(types))
		for i, t := range types {
			cp := make(map[string]any, len(s))
			for k, x := range s {
				cp[k] = x
			}
			cp["type"] = t
			alts[i] = cp
		}
		return c.union(alts, ptr, name, ruleName)
	}
	_, hasProps := s["properties"]
	addl, hasAddl := s["additionalProperties"]
	switch {
	case s["const"] != nil:
		c.rule(ruleName, literalSize(s["const"])+6)
		return ruleName, nil
	case s["enum"] != nil:
		n := 8
		if vals, ok := s["enum"].([]any); ok {
			for _, x := range vals {
				n += literalSize(x) + 3
			}
		} else {
			n += literalSize(s["enum"])
		}
		c.rule(ruleName, n)
		return ruleName, nil
	case is("object") && (hasProps || hasAddl && addl != true):
		props, ok := s["properties"].(map[string]any)
		if hasProps && !ok {
			return 0, &Error{Pointer: ptr + "/properties", Reason: "properties must be an object"}
		}
		n, err := c.object(props, requiredOf(s), addl, ptr, name)
		if err != nil {
			return 0, err
		}
		c.rule(ruleName, n)
		return ruleName, nil
	case (is("object") || typ == "string") && s["allOf"] != nil:
		comps, ok := s["allOf"].([]any)
		if !ok {
			return 0, &Error{Pointer: ptr + "/allOf", Reason: "allOf must be an array"}
		}
		props, required, enumSize, err := c.allOf(comps, ptr+"/allOf")
		if err != nil {
			return 0, err
		}
		n, err := c.object(props, required, nil, ptr, name)
		if err != nil {
			return 0, err
		}
		c.rule(ruleName, n+enumSize)
		return ruleName, nil
	case is("array") && (s["items"] != nil || s["prefixItems"] != nil):
		return c.array(s, ptr, name, ruleName)
	case is("string") && s["pattern"] != nil:
		p, ok := s["pattern"].(string)
		if !ok {
			return 0, &Error{Pointer: ptr + "/pattern", Reason: "pattern must be a string"}
		}
		n, err := checkPattern(p, ruleName)
		if err != nil {
			return 0, &Error{Pointer: ptr + "/pattern", Reason: err.Error()}
		}
		c.size += n
		return ruleName, nil
	case is("string") && isFormat(s["format"]):
		c.rule(ruleName, 30)
		return ruleName, nil
	case typ == "string" && (s["minLength"] != nil || s["maxLength"] != nil):
		if err := checkRepetition(s, ptr, "minLength", "maxLength"); err != nil {
			return 0, err
		}
		c.rule(ruleName, 40)
		return ruleName, nil
	case typ == "integer" && (s["minimum"] != nil || s["exclusiveMinimum"] != nil || s["maximum"] != nil || s["exclusiveMaximum"] != nil):
		n, err := integerRange(s, ptr)
		if err != nil {
			return 0, err
		}
		c.rule(ruleName, n+10)
		return ruleName, nil
	case len(s) == 0 || typ == "object":
		return 6, nil // the shared "object" rule (baseGrammar)
	}
	t, _ := typ.(string)
	switch {
	case !hasType:
		return 0, &Error{Pointer: ptr, Reason: "not a schema the runtime can sample with: it needs a type (or properties, items, enum, const, anyOf, oneOf, allOf or $ref)"}
	case !primitiveTypes[t]:
		return 0, &Error{Pointer: ptr, Reason: "type " + clip(fmt.Sprint(typ)) + " is not one the runtime knows"}
	}
	return len(t), nil // a shared primitive rule (baseGrammar)
}

// rule adds a rule of name and text lengths: "name ::= text\n", and room
// for the digits the converter appends to a name taken by another rule.
func (c *checker) rule(name, text int) { c.size += name + 3 + 5 + text + 1 }

// union visits alternatives as _generate_union_rule does.
func (c *checker) union(alts []any, ptr string, name, ruleName int) (int, error) {
	n := 0
	for i, alt := range alts {
		sub := name + 1 + len(strconv.Itoa(i))
		if name == 0 {
			sub = len("alternative-") + len(strconv.Itoa(i))
		}
		r, err := c.visit(alt, ptr+"/"+strconv.Itoa(i), sub)
		if err != nil {
			return 0, err
		}
		n += r + 3
	}
	c.rule(ruleName, n)
	return ruleName, nil
}

// object visits an object's properties as _build_object_rule does and
// returns the length of its own rule's text; its properties' rules are
// added to c.size.
func (c *checker) object(props map[string]any, required map[string]bool, addl any, ptr string, name int) (int, error) {
	sep := 1
	if name == 0 {
		sep = 0
	}
	text := 30
	lastRest := 0 // the optional property after which no "…-rest" rule comes
	for k, v := range props {
		sub := name + sep + len(k)
		r, err := c.visit(v, ptr+"/properties/"+escapePointer(k), sub)
		if err != nil {
			return 0, err
		}
		kv := sub + 3
		c.rule(kv, literalSize(k)+17+r)
		if required[k] {
			text += kv + 12
			continue
		}
		// An alternative in the object's rule, and the rule of the
		// optional properties after it ("…-rest"), which the last one
		// has not: the shortest is taken for it.
		rest := sub + 5
		text += kv + rest + 6
		c.rule(rest, 22+kv+rest)
		if cost := 2*rest + kv + 31; lastRest == 0 || cost < lastRest {
			lastRest = cost
		}
	}
	c.size -= lastRest
	if addl == true || isObject(addl) {
		sub := name + sep + len("additional")
		value := len("value")
		if isObject(addl) {
			r, err := c.visit(addl, ptr+"/additionalProperties", sub+len("-value"))
			if err != nil {
				return 0, err
			}
			value = r
		}
		key := len("string")
		if len(props) > 0 {
			// Every name goes into a character class, a character at a
			// time (_not_strings): rule 7.
			n := 30
			for k := range props {
				if strings.ContainsAny(k, `]\`) {
					return 0, &Error{Pointer: ptr + "/properties/" + escapePointer(k),
						Reason: `a property name with ']' or '\' cannot be excluded from additionalProperties by the runtime`}
				}
				n += 30 * len(k)
			}
			key = sub + 2
			c.rule(key, n)
		}
		c.rule(sub+3, key+11+value)
		text += 2*(sub+3) + 40
	}
	return text, nil
}

// allOf gathers what the converter takes of allOf's components: their
// properties (of a $ref's target too, following $refs to $refs), those
// of components outside an anyOf required, and their enum values.
func (c *checker) allOf(comps []any, ptr string) (props map[string]any, required map[string]bool, enumSize int, err error) {
	props, required = map[string]any{}, map[string]bool{}
	var add func(v any, req bool, seen map[string]bool) error
	add = func(v any, req bool, seen map[string]bool) error {
		s, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		if ref, ok := s["$ref"].(string); ok {
			if seen[ref] {
				// The converter would follow it forever.
				return &Error{Pointer: ptr, Reason: fmt.Sprintf("$ref %q refers to itself: recursive schemas are not supported", clip(ref))}
			}
			seen[ref] = true
			if st := c.refs[ref]; st != nil {
				return add(st.target, req, seen)
			}
			return nil
		}
		if ps, ok := s["properties"].(map[string]any); ok {
			for k, x := range ps {
				props[k] = x
				if req {
					required[k] = true
				}
			}
			return nil
		}
		if vals, ok := s["enum"].([]any); ok {
			for _, x := range vals {
				enumSize += literalSize(x) + 3
			}
		}
		return nil
	}
	for _, comp := range comps {
		if s, ok := comp.(map[string]any); ok {
			if alts, ok := s["anyOf"].([]any); ok {
				for _, alt := range alts {
					if err := add(alt, false, map[string]bool{}); err != nil {
						return nil, nil, 0, err
					}
				}
				continue
			}
		}
		if err := add(comp, true, map[string]bool{}); err != nil {
			return nil, nil, 0, err
		}
	}
	return props, required, enumSize, nil
}

// array visits an array's items as the converter does.
func (c *checker) array(s map[string]any, ptr string, name, ruleName int) (int, error) {
	sep := 1
	if name == 0 {
		sep = 0
	}
	key := "items"
	items, ok := s["items"]
	if !ok {
		key, items = "prefixItems", s["prefixItems"]
	}
	if tuple, ok := items.([]any); ok {
		n := 20
		for i, it := range tuple {
			r, err := c.visit(it, ptr+"/"+key+"/"+strconv.Itoa(i), name+sep+len("tuple-")+len(strconv.Itoa(i)))
			if err != nil {
				return 0, err
			}
			n += r + 12
		}
		c.rule(ruleName, n)
		return ruleName, nil
	}
	r, err := c.visit(items, ptr+"/"+key, name+sep+len("item"))
	if err != nil {
		return 0, err
	}
	if err := checkRepetition(s, ptr, "minItems", "maxItems"); err != nil {
		return 0, err
	}
	c.rule(ruleName, 2*r+50)
	return ruleName, nil
}

// checkRepetition checks rule 2 for a pair of bounds.
func checkRepetition(s map[string]any, ptr, minKey, maxKey string) error {
	bound := func(key string) (float64, bool, error) {
		raw, ok := s[key]
		if !ok {
			return 0, false, nil
		}
		f, ok := number(raw)
		if !ok || f < 0 || f > MaxRepetition {
			return 0, false, &Error{Pointer: ptr + "/" + key, Reason: fmt.Sprintf("%s must be a number from 0 to %d: the runtime cannot repeat more", key, MaxRepetition)}
		}
		return f, true, nil
	}
	lo, hasLo, err := bound(minKey)
	if err != nil {
		return err
	}
	hi, hasHi, err := bound(maxKey)
	if err != nil {
		return err
	}
	if hasLo && hasHi && int(lo) > int(hi) {
		return &Error{Pointer: ptr + "/" + minKey, Reason: fmt.Sprintf("%s is above %s", minKey, maxKey)}
	}
	return nil
}

// integerRange checks rule 5 and returns the length of the rule text the
// converter writes for the range (_build_min_max_int).
func integerRange(s map[string]any, ptr string) (int, error) {
	var bounds [4]int64
	var has [4]bool
	for i, key := range [...]string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		raw, ok := s[key]
		if !ok {
			continue
		}
		f, ok := number(raw)
		if !ok || f < -MaxInteger || f > MaxInteger {
			return 0, &Error{Pointer: ptr + "/" + key, Reason: fmt.Sprintf("%s must be a number within ±%d", key, int64(MaxInteger))}
		}
		bounds[i], has[i] = int64(f), true
	}
	lo, hi := int64(minInt64), int64(maxInt64)
	switch {
	case has[0]:
		lo = bounds[0]
	case has[1]:
		lo = bounds[1] + 1
	}
	switch {
	case has[2]:
		hi = bounds[2]
	case has[3]:
		hi = bounds[3] - 1
	}
	var b strings.Builder
	minMaxInt(lo, hi, &b, 16, true)
	return b.Len(), nil
}

// number is a JSON number's value.
func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func requiredOf(s map[string]any) map[string]bool {
	req := map[string]bool{}
	if list, ok := s["required"].([]any); ok {
		for _, x := range list {
			if k, ok := x.(string); ok {
				req[k] = true
			}
		}
	}
	return req
}

// isFormat reports whether the converter has a rule for string format f.
func isFormat(f any) bool {
	switch f {
	case "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5", "date", "time", "date-time":
		return true
	}
	return false
}

func isObject(v any) bool { _, ok := v.(map[string]any); return ok }

// literalSize is the length of the grammar literal of a JSON value: its
// JSON with '"', '\', CR and LF escaped, in quotes.
func literalSize(v any) int {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
	n := b.Len() - 1 // Encode's newline
	for _, c := range b.Bytes()[:n] {
		if c == '"' || c == '\\' {
			n++
		}
	}
	return n + 2
}

// baseGrammar bounds the rules a grammar may carry once: space, the
// primitives (object, value, string, char, …) and string formats.
const baseGrammar = 1400

func escapePointer(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
