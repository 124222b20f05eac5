package config

import (
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// kind is a setting's type, read from its flag.Value.
type kind int

const (
	kindString kind = iota
	kindBool
	kindInt
	kindUint
	kindFloat
	kindDuration
	kindTable
)

func (k kind) String() string {
	return [...]string{"string", "bool", "integer", "integer", "float", "duration", "table"}[k]
}

// kindOf reads the type of the standard flag values through flag.Getter; a
// Value that is neither one of those nor a Table takes strings.
func kindOf(v flag.Value) kind {
	if _, ok := v.(*Table); ok {
		return kindTable
	}
	g, ok := v.(flag.Getter)
	if !ok {
		return kindString
	}
	switch g.Get().(type) {
	case bool:
		return kindBool
	case int, int64:
		return kindInt
	case uint, uint64:
		return kindUint
	case float64:
		return kindFloat
	case time.Duration:
		return kindDuration
	}
	return kindString
}

// parsed is a checked value, ready to store: text for flag.Value.Set, or a
// whole table.
type parsed struct {
	text  string
	table map[string]any
}

func (p parsed) store(v flag.Value) error {
	if t, ok := v.(*Table); ok {
		*t.m = p.table
		return nil
	}
	return v.Set(p.text)
}

// fromTOML checks a decoded TOML value against the setting's type. Values
// are only echoed for numbers, never strings (which may be secrets).
func fromTOML(k kind, raw any) (parsed, error) {
	wrong := func(want string) (parsed, error) {
		return parsed{}, fmt.Errorf("want %s, got a TOML %s", want, tomlType(raw))
	}
	switch k {
	case kindBool:
		if b, ok := raw.(bool); ok {
			return parsed{text: strconv.FormatBool(b)}, nil
		}
		return wrong("true or false")
	case kindInt, kindUint:
		n, ok := raw.(int64)
		if !ok {
			return wrong("an integer")
		}
		if k == kindUint && n < 0 {
			return parsed{}, fmt.Errorf("want a non-negative integer, got %d", n)
		}
		return parsed{text: strconv.FormatInt(n, 10)}, nil
	case kindFloat:
		switch n := raw.(type) {
		case float64:
			return parsed{text: strconv.FormatFloat(n, 'g', -1, 64)}, nil
		case int64:
			return parsed{text: strconv.FormatInt(n, 10)}, nil
		}
		return wrong("a number")
	case kindDuration:
		s, ok := raw.(string)
		if !ok {
			return wrong(`a duration string such as "30s"`)
		}
		if _, err := time.ParseDuration(s); err != nil {
			return parsed{}, fmt.Errorf(`want a duration such as "30s" or "2m": %w`, err)
		}
		return parsed{text: s}, nil
	case kindTable:
		m, ok := raw.(map[string]any)
		if !ok {
			return wrong("a table such as { num_ctx = 4096 }")
		}
		return parsed{table: m}, checkTable(m)
	}
	if s, ok := raw.(string); ok {
		return parsed{text: s}, nil
	}
	return wrong("a string")
}

// fromText checks an environment value against the setting's type.
func fromText(k kind, s string) (parsed, error) {
	var err error
	switch k {
	case kindBool:
		if _, err = strconv.ParseBool(s); err != nil {
			return parsed{}, fmt.Errorf("want true or false, got %q", s)
		}
	case kindInt:
		if _, err = strconv.ParseInt(s, 10, 64); err != nil {
			return parsed{}, fmt.Errorf("want an integer, got %q", s)
		}
	case kindUint:
		if _, err = strconv.ParseUint(s, 10, 64); err != nil {
			return parsed{}, fmt.Errorf("want a non-negative integer, got %q", s)
		}
	case kindFloat:
		if _, err = strconv.ParseFloat(s, 64); err != nil {
			return parsed{}, fmt.Errorf("want a number, got %q", s)
		}
	case kindDuration:
		if _, err = time.ParseDuration(s); err != nil {
			return parsed{}, fmt.Errorf("want a duration such as 30s or 2m: %w", err)
		}
	case kindTable:
		// One variable holds the whole table, so it is JSON.
		m, err := jsonTable(s)
		if err != nil {
			return parsed{}, err
		}
		return parsed{table: m}, checkTable(m)
	}
	return parsed{text: s}, nil
}

func jsonTable(s string) (map[string]any, error) {
	var m map[string]any
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf(`want a JSON object such as {"num_ctx":4096}: %w`, err)
	}
	for k, v := range m {
		m[k] = fromJSON(v)
	}
	return m, nil
}

// fromJSON turns JSON numbers into the int64 or float64 TOML would give.
func fromJSON(v any) any {
	switch x := v.(type) {
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n
		}
		f, _ := x.Float64()
		return f
	case []any:
		for i := range x {
			x[i] = fromJSON(x[i])
		}
	}
	return v
}

// checkTable accepts flat entries: numbers, strings, booleans and arrays
// of them.
func checkTable(m map[string]any) error {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		v := m[k]
		if arr, ok := v.([]any); ok {
			for _, e := range arr {
				if !isScalar(e) {
					return fmt.Errorf("parameter %s: want numbers, strings or booleans in the array, got a %s", k, tomlType(e))
				}
			}
			continue
		}
		if !isScalar(v) {
			return fmt.Errorf("parameter %s: want a number, string, boolean or array, got a %s", k, tomlType(v))
		}
	}
	return nil
}

func isScalar(v any) bool {
	switch v.(type) {
	case string, int64, float64, bool:
		return true
	}
	return false
}

func tomlType(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case int64:
		return "integer"
	case float64:
		return "float"
	case bool:
		return "boolean"
	case []any:
		return "array"
	case map[string]any:
		return "table"
	default:
		return "date/time"
	}
}

// Table is a setting holding a flat table: numbers, strings, booleans and
// arrays of them, such as a model's runtime parameters. In the file it is a
// TOML table, in the environment a JSON object, on the command line a
// repeatable key=value flag. Each source replaces the whole table.
type Table struct {
	m   *map[string]any
	key string
	// flagged: a flag has set the table; further flags add to it.
	flagged bool
}

// TableVar defines a Table flag name on fs, stored in *p, whose key in the
// file is key (a plural where the flag, given once per entry, is singular).
func TableVar(fs *flag.FlagSet, p *map[string]any, name, key, usage string) {
	fs.Var(&Table{m: p, key: key}, name, usage)
}

func (t *Table) String() string {
	if t == nil || t.m == nil || len(*t.m) == 0 {
		return ""
	}
	b, _ := json.Marshal(*t.m)
	return string(b)
}

// Set adds one key=value entry; the value is typed as an integer, float,
// boolean or else a string.
func (t *Table) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want key=value, got %q", s)
	}
	if !t.flagged {
		*t.m = map[string]any{}
		t.flagged = true
	}
	(*t.m)[k] = scalar(v)
	return nil
}

func scalar(v string) any {
	if i, err := strconv.ParseInt(v, 10, 64); err == nil {
		return i
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return f
	}
	if b, err := strconv.ParseBool(v); err == nil {
		return b
	}
	return v
}

// tomlDefault renders a flag's default (its DefValue) as a TOML value.
func tomlDefault(k kind, def string) string {
	switch k {
	case kindString:
		return strconv.Quote(def)
	case kindDuration:
		return strconv.Quote(shortDuration(def))
	case kindTable:
		if def == "" {
			return "{}"
		}
	}
	return def
}

// shortDuration drops the zero units time.Duration.String writes: "1m0s"
// reads "1m", "1h0m0s" reads "1h".
func shortDuration(s string) string {
	if strings.HasSuffix(s, "m0s") || strings.HasSuffix(s, "h0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
