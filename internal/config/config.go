// Package config loads a program's settings from one schema: a
// flag.FlagSet whose flags are bound to the fields of the program's config
// struct. Each flag's name, default, help text and type (its flag.Value)
// define one setting under three spellings: the flag (--max-concurrent), a
// key of the TOML file (max_concurrent) and an environment variable
// (HEARTH_MAX_CONCURRENT). Precedence: defaults < file < environment <
// flags given on the command line, each only where it sets something.
//
// Libraries such as peterbourgon/ff merge the same sources, but they turn
// file values into flag text: the line, the key and the TOML type are lost,
// and the file cannot be read strictly. Operators get "line 7: unknown key
// max-concurrent (did you mean max_concurrent?)" from this package instead.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"sort"
	"strings"
)

// Loader loads one program's settings.
type Loader struct {
	// Program names the program in messages ("hearthd").
	Program string
	// Schema holds one flag per setting, bound to the config struct's
	// field, with the built-in default and the help text. It is never
	// parsed itself: AddFlags offers its flags on a command's FlagSet.
	Schema *flag.FlagSet
	// EnvPrefix starts every setting's variable ("HEARTH_").
	EnvPrefix string
	// ConfigEnv is the variable naming the configuration file when
	// --config does not; it is no setting.
	ConfigEnv string
	// DefaultPath is the file read when neither --config nor ConfigEnv
	// names one; unlike a named file it may be absent.
	DefaultPath string
	// ForeignEnv lists prefixes of variables that belong to another
	// program sharing EnvPrefix: they are not reported as unknown.
	ForeignEnv []string
}

// Result says where the settings came from.
type Result struct {
	// File is the configuration file read; "" when there was none.
	File string
	// UnknownEnv lists the EnvPrefix variables that are no setting, for
	// the caller to warn about: a typo should be visible, but an unrelated
	// variable in a shared environment must not stop the program.
	UnknownEnv []UnknownEnv
}

// WarnUnknownEnv logs each of UnknownEnv as a warning.
func (r Result) WarnUnknownEnv(log *slog.Logger) {
	for _, u := range r.UnknownEnv {
		attrs := []any{"name", u.Name}
		if u.DidYouMean != "" {
			attrs = append(attrs, "did_you_mean", u.DidYouMean)
		}
		log.Warn("unknown environment variable ignored", attrs...)
	}
}

// UnknownEnv is an environment variable that names no setting.
type UnknownEnv struct {
	Name string
	// DidYouMean is the setting's variable it probably meant, or "".
	DidYouMean string
}

// Setting is one setting of the schema.
type Setting struct {
	Key  string // in the file: max_concurrent
	Flag string // on the command line: max-concurrent
	Env  string // in the environment: HEARTH_MAX_CONCURRENT
	// Type is string, bool, integer, float, duration or table.
	Type string
	// Default is the built-in default as a TOML value.
	Default string
	Usage   string

	value flag.Value
	kind  kind
}

// Settings lists the schema's settings in key order.
func (l *Loader) Settings() []Setting {
	var out []Setting
	l.Schema.VisitAll(func(f *flag.Flag) {
		k := kindOf(f.Value)
		key := strings.ReplaceAll(f.Name, "-", "_")
		if t, ok := f.Value.(*Table); ok && t.key != "" {
			key = t.key
		}
		out = append(out, Setting{
			Key: key, Flag: f.Name, Env: l.EnvPrefix + strings.ToUpper(key),
			Type: k.String(), Default: tomlDefault(k, f.DefValue), Usage: f.Usage,
			value: f.Value, kind: k,
		})
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

// AddFlags defines on cmd the flags of the named settings (by flag name;
// every setting when none is named), sharing the schema's values. A name
// that is no setting is a programming error and panics.
func (l *Loader) AddFlags(cmd *flag.FlagSet, names ...string) {
	if len(names) == 0 {
		l.Schema.VisitAll(func(f *flag.Flag) { cmd.Var(f.Value, f.Name, f.Usage) })
		return
	}
	for _, n := range names {
		f := l.Schema.Lookup(n)
		if f == nil {
			panic(fmt.Sprintf("config: %s has no setting %q", l.Program, n))
		}
		cmd.Var(f.Value, f.Name, f.Usage)
	}
}

// Load defines --config on cmd and parses args with it, then sets every
// setting not given on the command line from the environment (os.Environ
// form) or else the configuration file. Every value of the file and the
// environment is checked, even where a higher source overrides it; all
// problems are reported together, each naming its key and its source.
// After an error the settings may be partly set and should not be used.
func (l *Loader) Load(cmd *flag.FlagSet, args, environ []string) (Result, error) {
	var res Result
	path := cmd.String("config", "", fmt.Sprintf("configuration file (default $%s, or %s if present)", l.ConfigEnv, l.DefaultPath))
	if err := cmd.Parse(args); err != nil {
		return res, err
	}
	given := map[string]bool{}
	cmd.Visit(func(f *flag.Flag) { given[f.Name] = true })

	settings := l.Settings()
	var errs []error
	var fromFile []found
	file, named := *path, true
	if file == "" {
		file = lookupEnv(environ, l.ConfigEnv)
	}
	if file == "" {
		file, named = l.DefaultPath, false
	}
	if file != "" {
		data, err := os.ReadFile(file)
		switch {
		case err == nil:
			res.File = file
			fromFile, err = l.parseFile(settings, file, data)
			errs = append(errs, err)
		case named || !errors.Is(err, fs.ErrNotExist):
			return res, fmt.Errorf("config file: %w", err)
		}
	}
	fromEnv, unknown, err := l.parseEnv(settings, environ)
	res.UnknownEnv = unknown
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	// The environment overrides the file: apply it last.
	for _, v := range append(fromFile, fromEnv...) {
		if given[v.setting.Flag] {
			continue
		}
		if err := v.val.store(v.setting.value); err != nil {
			errs = append(errs, fmt.Errorf("config %s (%s): %w", v.setting.Key, v.where, err))
		}
	}
	return res, errors.Join(errs...)
}

// found is a checked value of a setting and where it was found.
type found struct {
	setting Setting
	val     parsed
	where   string // "/etc/hearth/hearthd.toml line 4", "environment HEARTH_X"
}

// parseEnv checks the EnvPrefix variables in environ. An empty value sets
// a string setting to "" and is an error for any other type.
func (l *Loader) parseEnv(settings []Setting, environ []string) ([]found, []UnknownEnv, error) {
	byEnv := make(map[string]Setting, len(settings))
	for _, s := range settings {
		byEnv[s.Env] = s
	}
	var (
		out     []found
		unknown []UnknownEnv
		errs    []error
	)
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, l.EnvPrefix) || name == l.ConfigEnv {
			continue
		}
		s, ok := byEnv[name]
		if !ok {
			if !l.foreign(name) {
				unknown = append(unknown, UnknownEnv{Name: name, DidYouMean: l.suggestEnv(settings, name)})
			}
			continue
		}
		v, err := fromText(s.kind, val)
		if err != nil {
			errs = append(errs, fmt.Errorf("config %s (environment %s): %w", s.Key, name, err))
			continue
		}
		out = append(out, found{setting: s, val: v, where: "environment " + name})
	}
	sort.Slice(unknown, func(i, j int) bool { return unknown[i].Name < unknown[j].Name })
	return out, unknown, errors.Join(errs...)
}

func (l *Loader) foreign(name string) bool {
	for _, p := range l.ForeignEnv {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

func (l *Loader) suggestEnv(settings []Setting, name string) string {
	key := suggest(settings, strings.ToLower(strings.TrimPrefix(name, l.EnvPrefix)))
	if key == "" {
		return ""
	}
	return l.EnvPrefix + strings.ToUpper(key)
}

// lookupEnv is os.Getenv over an environ slice: the first entry wins.
func lookupEnv(environ []string, name string) string {
	for _, kv := range environ {
		if k, v, _ := strings.Cut(kv, "="); k == name {
			return v
		}
	}
	return ""
}

// suggest maps a near miss to a setting's key: another spelling (a flag
// name, other case), a key under a table or section, or a small typo.
func suggest(settings []Setting, key string) string {
	want := strings.ToLower(strings.ReplaceAll(key, "-", "_"))
	for _, s := range settings {
		if s.Key == want || strings.HasSuffix(want, "."+s.Key) {
			return s.Key
		}
	}
	if len(want) < 4 {
		return ""
	}
	best, bestDist := "", 3 // at most two edits
	for _, s := range settings {
		if d := editDistance(want, s.Key); d < bestDist {
			best, bestDist = s.Key, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes). Hand-written:
// ten lines are cheaper than a dependency.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
