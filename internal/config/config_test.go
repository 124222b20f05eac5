package config

import (
	"errors"
	"flag"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

// testConfig has a setting of every supported type.
type testConfig struct {
	Name    string
	On      bool
	N       int
	Big     int64
	U       uint
	F       float64
	D       time.Duration
	Params  map[string]any
	Secret  string
	LongKey string
}

func defaults() testConfig {
	return testConfig{Name: "dflt", N: 3, F: 1.5, D: 90 * time.Second}
}

func testLoader(c *testConfig) *Loader {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.StringVar(&c.Name, "name", c.Name, "the name")
	fs.BoolVar(&c.On, "on", c.On, "switch it on")
	fs.IntVar(&c.N, "n", c.N, "a count")
	fs.Int64Var(&c.Big, "big", c.Big, "a big count")
	fs.UintVar(&c.U, "u", c.U, "a natural number")
	fs.Float64Var(&c.F, "f", c.F, "a rate")
	fs.DurationVar(&c.D, "d", c.D, "a timeout")
	TableVar(fs, &c.Params, "param", "params", "a parameter `key=value`")
	fs.StringVar(&c.Secret, "secret", c.Secret, "a secret")
	fs.StringVar(&c.LongKey, "long-key", c.LongKey, "unlike name, long_key | has an underscore")
	return &Loader{Program: "testd", Schema: fs, EnvPrefix: "T_", ConfigEnv: "T_CONFIG", ForeignEnv: []string{"T_OTHER_"}}
}

func writeFile(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// load loads args and environ onto the defaults.
func load(args, environ []string) (testConfig, Result, error) {
	c := defaults()
	l := testLoader(&c)
	cmd := flag.NewFlagSet("test", flag.ContinueOnError)
	cmd.SetOutput(io.Discard)
	l.AddFlags(cmd)
	res, err := l.Load(cmd, args, environ)
	return c, res, err
}

func TestPrecedence(t *testing.T) {
	path := writeFile(t, `
name = "file"
n = 10
big = 10
f = 2
d = "1m"
on = true
params = { a = 1, b = "x" }
`)
	got, res, err := load(
		[]string{"--config", path, "--big=30", "--param", "c=3", "--param", "d=true"},
		[]string{"T_N=20", "T_BIG=20", "T_F=2.5", "T_NAME=", "T_PARAMS={\"e\":[1,\"y\"]}"},
	)
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.Name = ""                                         // environment (empty) over file
	want.N = 20                                            // environment over file
	want.Big = 30                                          // flag over environment over file
	want.F = 2.5                                           // environment over file (an integer in the file)
	want.D = time.Minute                                   // file
	want.On = true                                         // file
	want.Params = map[string]any{"c": int64(3), "d": true} // flags replace the table
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	if res.File != path || len(res.UnknownEnv) != 0 {
		t.Fatalf("result %+v", res)
	}

	// Without flags the environment's table replaces the file's.
	got, _, err = load([]string{"--config", path}, []string{`T_PARAMS={"e":[1,"y"]}`})
	if err != nil || !reflect.DeepEqual(got.Params, map[string]any{"e": []any{int64(1), "y"}}) {
		t.Fatalf("params %v, %v", got.Params, err)
	}
	// Nothing given: the defaults, untouched.
	got, _, err = load(nil, nil)
	if err != nil || !reflect.DeepEqual(got, defaults()) {
		t.Fatalf("no sources: %v %+v", err, got)
	}
}

func TestFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string
		notWant    string
	}{
		{"unknown", "n = 1\n\nzzz = 2\n", []string{`line 3: unknown key "zzz"`}, "did you mean"},
		{"flag spelling", "long-key = \"v\"\n", []string{`line 1: unknown key "long-key" (did you mean long_key?)`}, ""},
		{"upper case", "NAME = \"v\"\n", []string{`unknown key "NAME" (did you mean name?)`}, ""},
		{"typo", "long_kye = \"v\"\n", []string{`did you mean long_key?`}, ""},
		{"dotted", "x.long_key = 1\n", []string{`line 1: unknown key "x.long_key" (did you mean long_key?)`}, ""},
		{"section", "n = 1\n[limits]\nn = 2\n", []string{`line 2: unknown key "limits" (the file has no sections`}, ""},
		{"array of tables", "[[servers]]\nname = \"a\"\n", []string{`line 1: unknown key "servers"`}, ""},
		{"string for int", "name = \"x\"\nn = \"8\"\n", []string{"config n (", "line 2): want an integer, got a TOML string"}, ""},
		{"float for int", "big = 1.5\n", []string{"config big", "want an integer, got a TOML float"}, ""},
		{"negative uint", "u = -1\n", []string{"config u", "want a non-negative integer, got -1"}, ""},
		{"string for float", "f = \"fast\"\n", []string{"config f", "want a number, got a TOML string"}, ""},
		{"bad duration", "d = \"30\"\n", []string{"config d", `want a duration such as "30s" or "2m": time: missing unit`}, ""},
		{"integer duration", "d = 30\n", []string{`want a duration string such as "30s", got a TOML integer`}, ""},
		{"string as bool", "on = \"yes\"\n", []string{"config on", "want true or false, got a TOML string"}, ""},
		{"bool as string", "name = true\n", []string{"config name", "want a string, got a TOML boolean"}, ""},
		{"date", "name = 2024-01-01\n", []string{"config name", "got a TOML date/time"}, ""},
		{"secret not echoed", "secret = [\"s3cr3t\"]\n", []string{"config secret", "got a TOML array"}, "s3cr3t"},
		{"two problems", "n = \"x\"\nzzz = 1\nd = \"soon\"\n", []string{"config n (", `line 2: unknown key "zzz"`, "config d ("}, ""},
		{"syntax", "name = \"a\"\nn = \n", []string{"line 2 column"}, ""},
		{"duplicate", "name = \"a\"\nname = \"b\"\n", []string{"already defined"}, ""},
		{"table not a table", "params = \"a=1\"\n", []string{"config params", "want a table"}, ""},
		{"nested table", "params = { a = { b = 1 } }\n", []string{"config params", "parameter a: want a number"}, ""},
		{"table in array", "params = { a = [{ b = 1 }] }\n", []string{"parameter a: want numbers, strings or booleans in the array"}, ""},
		{"setting below a section", "name = \"a\"\n[params]\nx = 1\nn = 2\nd = \"1s\"\n",
			[]string{"config params (", "line 2)", "d, n is a testd setting, not part of params: move it above the [params] header"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.body)
			_, _, err := load([]string{"--config", path}, nil)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q lacks %q", msg, w)
				}
			}
			if !strings.Contains(msg, path) {
				t.Errorf("error %q does not name the file", msg)
			}
			if tc.notWant != "" && strings.Contains(msg, tc.notWant) {
				t.Errorf("error %q has %q", msg, tc.notWant)
			}
		})
	}
}

func TestFileTableSection(t *testing.T) {
	// A table-valued setting may be a section when it comes last.
	got, _, err := load([]string{"--config", writeFile(t, "n = 4\n[params]\nnum_ctx = 4096\nstop = [\"a\", \"b\"]\n")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.N != 4 || !reflect.DeepEqual(got.Params, map[string]any{"num_ctx": int64(4096), "stop": []any{"a", "b"}}) {
		t.Fatalf("got %+v", got)
	}
}

func TestEnv(t *testing.T) {
	got, res, err := load(nil, []string{
		"PATH=/bin",
		"T_ON=1",
		"T_D=2m30s",
		"T_U=7",
		"T_CONFIG=",        // names the file; no setting
		"T_OTHER_LISTEN=x", // another program's
		"T_LONG_KY=typo",   // near miss
		"T_COLOUR=blue",    // unrelated
		"T_NAME=a=b",       // the first = splits
		"T_SECRET=",        // empty string
	})
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.On, want.D, want.U, want.Name = true, 150*time.Second, 7, "a=b"
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
	wantUnknown := []UnknownEnv{{Name: "T_COLOUR"}, {Name: "T_LONG_KY", DidYouMean: "T_LONG_KEY"}}
	if !reflect.DeepEqual(res.UnknownEnv, wantUnknown) {
		t.Fatalf("unknown %+v", res.UnknownEnv)
	}

	_, _, err = load(nil, []string{"T_N=many", "T_ON=", "T_D=5", "T_U=-1", "T_F=x", "T_PARAMS=[1]", "T_BIG=1.0"})
	for _, w := range []string{
		`config n (environment T_N): want an integer, got "many"`,
		`config on (environment T_ON): want true or false`,
		`config d (environment T_D): want a duration such as 30s or 2m`,
		`config u (environment T_U): want a non-negative integer`,
		`config f (environment T_F): want a number`,
		`config params (environment T_PARAMS): want a JSON object`,
		`config big (environment T_BIG): want an integer`,
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
}

func TestWarnUnknownEnv(t *testing.T) {
	var b strings.Builder
	log := slog.New(slog.NewTextHandler(&b, nil))
	Result{UnknownEnv: []UnknownEnv{{Name: "T_A"}, {Name: "T_NAM", DidYouMean: "T_NAME"}}}.WarnUnknownEnv(log)
	out := b.String()
	if !strings.Contains(out, "name=T_A\n") || !strings.Contains(out, "name=T_NAM did_you_mean=T_NAME") {
		t.Fatalf("log %q", out)
	}
}

// TestOverriddenValuesChecked: every value is checked, also one a higher
// source overrides.
func TestOverriddenValuesChecked(t *testing.T) {
	path := writeFile(t, "n = \"x\"\n")
	_, _, err := load([]string{"--config", path, "--n=1", "--d=1s"}, []string{"T_N=2", "T_D=soon"})
	for _, w := range []string{"config n (" + path + " line 1)", "config d (environment T_D)"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
}

func TestFlagErrors(t *testing.T) {
	for _, args := range [][]string{{"--n=x"}, {"--param", "novalue"}, {"--param", "=1"}, {"--nope"}} {
		if _, _, err := load(args, nil); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
	if _, _, err := load([]string{"-h"}, nil); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestFileChoice(t *testing.T) {
	byFlag := writeFile(t, "name = \"flag\"\n")
	byEnv := writeFile(t, "name = \"env\"\n")
	byDefault := writeFile(t, "name = \"default\"\n")
	absent := filepath.Join(t.TempDir(), "absent.toml")
	for _, tc := range []struct {
		name        string
		args, env   []string
		defaultPath string
		want        string // the name loaded, or "error"
	}{
		{"flag over environment", []string{"--config", byFlag}, []string{"T_CONFIG=" + byEnv}, byDefault, "flag"},
		{"environment over default", nil, []string{"T_CONFIG=" + byEnv}, byDefault, "env"},
		{"default", nil, nil, byDefault, "default"},
		{"default absent", nil, nil, absent, "dflt"},
		{"no default", nil, nil, "", "dflt"},
		{"named absent", []string{"--config", absent}, nil, byDefault, "error"},
		{"named by environment absent", nil, []string{"T_CONFIG=" + absent}, byDefault, "error"},
		{"default unreadable", nil, nil, t.TempDir(), "error"}, // a directory
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := defaults()
			l := testLoader(&c)
			l.DefaultPath = tc.defaultPath
			res, err := l.Load(flag.NewFlagSet("test", flag.ContinueOnError), tc.args, tc.env)
			switch {
			case tc.want == "error":
				if err == nil {
					t.Fatal("no error")
				}
				if strings.Contains(tc.name, "absent") && !errors.Is(err, fs.ErrNotExist) {
					t.Fatalf("error %v does not wrap fs.ErrNotExist", err)
				}
			case err != nil:
				t.Fatal(err)
			case c.Name != tc.want:
				t.Fatalf("loaded %q, want %q", c.Name, tc.want)
			case tc.want == "dflt" && res.File != "":
				t.Fatalf("read %q", res.File)
			}
		})
	}
}

func TestAddFlagsSubset(t *testing.T) {
	c := defaults()
	l := testLoader(&c)
	cmd := flag.NewFlagSet("admin", flag.ContinueOnError)
	cmd.SetOutput(io.Discard)
	l.AddFlags(cmd, "name")
	other := cmd.Int("count", 1, "a flag of the command, no setting")
	path := writeFile(t, "name = \"file\"\nn = 9\n")
	if _, err := l.Load(cmd, []string{"--config", path, "--name", "flag", "--count", "2"}, []string{"T_COUNT=5"}); err != nil {
		t.Fatal(err)
	}
	// The file still sets what the command line does not offer.
	if c.Name != "flag" || c.N != 9 || *other != 2 {
		t.Fatalf("name %q n %d count %d", c.Name, c.N, *other)
	}
	cmd = flag.NewFlagSet("admin", flag.ContinueOnError)
	cmd.SetOutput(io.Discard)
	l.AddFlags(cmd, "name")
	if _, err := l.Load(cmd, []string{"--n", "1"}, nil); err == nil {
		t.Fatal("a setting not offered was taken on the command line")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("AddFlags took an unknown name")
		}
	}()
	l.AddFlags(flag.NewFlagSet("x", flag.ContinueOnError), "nope")
}

func TestSettings(t *testing.T) {
	c := defaults()
	c.D = time.Hour
	var got []string
	for _, s := range testLoader(&c).Settings() {
		got = append(got, strings.Join([]string{s.Key, s.Flag, s.Env, s.Type, s.Default}, " "))
	}
	want := []string{
		"big big T_BIG integer 0",
		`d d T_D duration "1h"`,
		"f f T_F float 1.5",
		"long_key long-key T_LONG_KEY string \"\"",
		"n n T_N integer 3",
		`name name T_NAME string "dflt"`,
		"on on T_ON bool false",
		"params param T_PARAMS table {}",
		`secret secret T_SECRET string ""`,
		"u u T_U integer 0",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("settings\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for in, out := range map[string]string{"1h0m0s": "1h", "1m0s": "1m", "1m30s": "1m30s", "2h30m0s": "2h30m", "30s": "30s", "0s": "0s", "500ms": "500ms"} {
		if got := shortDuration(in); got != out {
			t.Errorf("shortDuration(%s) = %s, want %s", in, got, out)
		}
	}
}

func TestMarkdownTable(t *testing.T) {
	c := defaults()
	table := testLoader(&c).MarkdownTable()
	for _, w := range []string{
		"| key | type | default | environment | flag | what it does |\n|---|---|---|---|---|---|\n| `big` |",
		"| `long_key` | string | `\"\"` | `T_LONG_KEY` | `--long-key` | unlike name, `long_key` \\| has an underscore |\n",
		"| `params` | table | `{}` | `T_PARAMS` | `--param` | a parameter `key=value` |\n",
	} {
		if !strings.Contains(table, w) {
			t.Errorf("table lacks %q:\n%s", w, table)
		}
	}
	if got := codeOutside("a long_key `long_key` b", regexp.MustCompile(`\b(long_key)\b`)); got != "a `long_key` `long_key` b" {
		t.Errorf("codeOutside: %q", got)
	}
}

func TestUpdateDoc(t *testing.T) {
	const table = "| a |\n"
	path := writeFile(t, "# doc\n\n"+DocBegin+"\n| old |\n"+DocEnd+"\n\nmore\n")
	stale, err := UpdateDoc(path, table, false)
	if err != nil || !stale {
		t.Fatalf("stale %v, %v", stale, err)
	}
	if stale, err = UpdateDoc(path, table, true); err != nil || !stale {
		t.Fatalf("write: stale %v, %v", stale, err)
	}
	if b, _ := os.ReadFile(path); string(b) != "# doc\n\n"+DocBegin+"\n| a |\n"+DocEnd+"\n\nmore\n" {
		t.Fatalf("rewritten %q", b)
	}
	if stale, err = UpdateDoc(path, table, false); err != nil || stale {
		t.Fatalf("after write: stale %v, %v", stale, err)
	}
	if _, err := UpdateDoc(writeFile(t, "no markers\n"), table, true); err == nil {
		t.Fatal("no markers: no error")
	}
}

func TestSuggest(t *testing.T) {
	c := defaults()
	settings := testLoader(&c).Settings()
	for in, want := range map[string]string{
		"long-key": "long_key", "LONG_KEY": "long_key", "x.long_key": "long_key",
		"long_kee": "long_key", "lnog_key": "long_key", "secert": "secret",
		"zzz": "", "completely_else": "", "nam": "", // too short for a typo
	} {
		if got := suggest(settings, in); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"a", "", 1}, {"kitten", "sitting", 3}, {"max_concurent", "max_concurrent", 1}, {"ab", "ba", 2}} {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}

func TestLogLevel(t *testing.T) {
	for in, want := range map[string]slog.Level{"debug": slog.LevelDebug, "INFO": slog.LevelInfo, "Warn": slog.LevelWarn, "error": slog.LevelError} {
		if got, err := LogLevel(in); err != nil || got != want {
			t.Errorf("LogLevel(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "verbose", "info+2"} {
		if _, err := LogLevel(bad); err == nil {
			t.Errorf("LogLevel(%q): no error", bad)
		}
	}
}

func TestProblems(t *testing.T) {
	var p Problems
	if p.Err() != nil {
		t.Fatal("no problems, an error")
	}
	if !p.HostPort("listen", "127.0.0.1:1") || p.HostPort("metrics-listen", "9464") {
		t.Fatal("HostPort")
	}
	p.LogLevel("log-level", "info")
	p.LogLevel("log-level", "loud")
	p.Add("n", "must be at least %d, got %d", 1, 0)
	want := "config metrics-listen: \"9464\" is not host:port: address 9464: missing port in address\n" +
		"config log-level: \"loud\" is not debug, info, warn or error\n" +
		"config n: must be at least 1, got 0"
	if err := p.Err(); err == nil || err.Error() != want {
		t.Fatalf("got\n%v\nwant\n%s", err, want)
	}
}

func TestCommented(t *testing.T) {
	got := Commented([]byte("# A comment = not a key\n#listen = \"x\"\n  #indented = 1\n#max_queue = 256\nreal = 1\n#   spaced = 2\n"))
	if want := "listen = \"x\"\nmax_queue = 256\n"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}
