package schemacheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// converter builds the runtime's own schema converter: llama.cpp's
// json-schema-to-grammar.cpp from the Ollama module hearth builds against
// (go.mod), with stubs for the little of llama.cpp it needs
// (testdata/converter). g++ and nlohmann-json3-dev come with
// scripts/ensure-deps.sh.
func converter(t *testing.T) func(schemas [][]byte) []converted {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/ollama/ollama").Output()
	if err != nil {
		t.Fatalf("go list the ollama module: %v", err)
	}
	src := filepath.Join(strings.TrimSpace(string(out)), "llama", "llama.cpp", "common")
	dir := t.TempDir()
	for _, f := range []string{"json-schema-to-grammar.cpp", "json-schema-to-grammar.h"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stubs, _ := filepath.Abs("testdata/converter")
	for _, f := range []string{"common.h", "ggml.h", "json.hpp", "main.cpp"} {
		b, err := os.ReadFile(filepath.Join(stubs, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "j2g")
	cmd := exec.Command("g++", "-std=c++17", "-O1", "-I", dir, "-o", bin, filepath.Join(dir, "main.cpp"), filepath.Join(dir, "json-schema-to-grammar.cpp"))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the converter (g++ and nlohmann-json3-dev: scripts/ensure-deps.sh): %v\n%s", err, b)
	}
	return func(schemas [][]byte) []converted {
		cmd := exec.Command(bin)
		cmd.Stdin = bytes.NewReader(append(bytes.Join(schemas, []byte("\n")), '\n'))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("the converter: %v", err)
		}
		var res []converted
		dec := json.NewDecoder(bytes.NewReader(out))
		for dec.More() {
			var c converted
			if err := dec.Decode(&c); err != nil {
				t.Fatal(err)
			}
			res = append(res, c)
		}
		if len(res) != len(schemas) {
			t.Fatalf("the converter answered %d of %d schemas", len(res), len(schemas))
		}
		return res
	}
}

// converted is what the converter made of a schema.
type converted struct {
	Grammar string `json:"grammar"`
	Error   string `json:"error"`
}

// Against the runtime's converter: a schema Check accepts converts, into a
// grammar no larger than Check's estimate (rule 8 errs on the safe side);
// the grammar of 300 optional properties is past the runtime's buffer and
// that of 250 within it (the runtime crashed, and did not); integer
// ranges are written as the port writes them.
func TestAgainstTheConverter(t *testing.T) {
	convert := converter(t)
	compact := func(s string) []byte {
		var b bytes.Buffer
		if err := json.Compact(&b, []byte(s)); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}

	r := rand.New(rand.NewSource(1))
	var schemas [][]byte
	var estimates []int
	for range 300 {
		root := randomSchema(r, 0).(map[string]any)
		root["$defs"] = map[string]any{"d0": randomSchema(r, 3), "d1": randomSchema(r, 4), "d2": map[string]any{"type": "string"}}
		b, _ := json.Marshal(root)
		c := &checker{}
		if c.check(b) == nil {
			schemas, estimates = append(schemas, b), append(estimates, c.estimate)
		}
	}
	if len(schemas) < 100 {
		t.Fatalf("only %d random schemas accepted", len(schemas))
	}
	for i, c := range convert(schemas) {
		if c.Error != "" {
			t.Fatalf("accepted, but the converter refuses it (%s): %s", c.Error, schemas[i])
		}
		if estimates[i] < len(c.Grammar) {
			t.Fatalf("grammar estimated at %d bytes, the converter's is %d: %s", estimates[i], len(c.Grammar), schemas[i])
		}
	}

	for n, fits := range map[int]bool{250: true, 300: false} {
		s := compact(optionalProps(n))
		g := convert([][]byte{s})[0]
		if limit := bufferSize(len(s)); g.Error != "" || (len(g.Grammar) < limit) != fits || (Check(s) == nil) != fits {
			t.Errorf("%d optional properties: a grammar of %d bytes (%s), %d kept; Check: %v", n, len(g.Grammar), g.Error, limit, Check(s))
		}
	}

	var ranges [][]byte
	var want []string
	for range 200 {
		lo, hi := int64(minInt64), int64(maxInt64)
		mag := func() int64 { return r.Int63n([]int64{10, 1000, 1e6, 1e9}[r.Intn(4)]) * int64(1-2*r.Intn(2)) }
		var s string
		switch r.Intn(3) {
		case 0:
			lo = mag()
			hi = min(lo+r.Int63n(1e9), 1<<31-1)
			s = fmt.Sprintf(`{"type":"integer","minimum":%d,"maximum":%d}`, lo, hi)
		case 1:
			lo = mag()
			s = fmt.Sprintf(`{"type":"integer","minimum":%d}`, lo)
		default:
			hi = mag()
			s = fmt.Sprintf(`{"type":"integer","maximum":%d}`, hi)
		}
		var b strings.Builder
		minMaxInt(lo, hi, &b, 16, true)
		ranges, want = append(ranges, []byte(s)), append(want, "root ::= ("+b.String()+") space\n")
	}
	for i, c := range convert(ranges) {
		if !strings.Contains(c.Grammar, want[i]) {
			t.Fatalf("%s: the port writes %q; the converter:\n%s%s", ranges[i], want[i], c.Grammar, c.Error)
		}
	}
}

// randomSchema is a schema of the kinds tools and formats are made of,
// nested up to about 5 deep.
func randomSchema(r *rand.Rand, d int) any {
	name := func() string {
		return strings.Repeat(string(rune('a'+r.Intn(26))), 1+r.Intn(30)) + fmt.Sprint(r.Intn(100))
	}
	k := r.Intn(9)
	if d > 4 {
		k = 5 + r.Intn(4)
	}
	switch k {
	case 0, 1:
		props, req := map[string]any{}, []any{}
		for range r.Intn(12) {
			n := name()
			props[n] = randomSchema(r, d+1)
			if r.Intn(2) == 0 {
				req = append(req, n)
			}
		}
		s := map[string]any{"type": "object", "properties": props, "required": req}
		switch r.Intn(6) {
		case 0:
			s["additionalProperties"] = r.Intn(2) == 0
		case 1:
			s["additionalProperties"] = randomSchema(r, d+1)
		}
		return s
	case 2:
		s := map[string]any{"type": "array", "items": randomSchema(r, d+1)}
		if r.Intn(2) == 0 {
			s["minItems"], s["maxItems"] = r.Intn(5), 5+r.Intn(100)
		}
		return s
	case 3:
		var alts []any
		for range 1 + r.Intn(4) {
			alts = append(alts, randomSchema(r, d+1))
		}
		return map[string]any{"anyOf": alts}
	case 4:
		return map[string]any{"$ref": fmt.Sprintf("#/$defs/d%d", r.Intn(3))}
	case 5:
		lo := r.Int63n(1_000_000_000) - 500_000_000
		return map[string]any{"type": "integer", "minimum": lo, "maximum": min(lo+r.Int63n(2_000_000_000), 1<<31-1)}
	case 6:
		pats := []string{`^[a-z]{2,8}-\.x$`, `^(ab|cd)+[0-9]?$`, `^.{3,}$`, `^\x41b+(b{2}|c)*$`, `^[A-Z][a-z]*( [A-Z][a-z]*){0,3}$`}
		return map[string]any{"type": "string", "pattern": pats[r.Intn(len(pats))]}
	case 7:
		var vals []any
		for range r.Intn(10) {
			vals = append(vals, name())
		}
		return map[string]any{"enum": vals}
	}
	types := []string{"string", "number", "boolean", "null", "integer"}
	s := map[string]any{"type": types[r.Intn(len(types))]}
	if s["type"] == "string" && r.Intn(2) == 0 {
		s["maxLength"] = r.Intn(2000)
		s["format"] = []string{"date", "uuid", "email"}[r.Intn(3)]
	}
	return s
}
