package daemon

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pelletier/go-toml/v2"
	"github.com/pelletier/go-toml/v2/unstable"
)

// DefaultConfigPath is where hearthd serve looks for its configuration file.
const DefaultConfigPath = "/etc/hearth/hearthd.toml"

// ConfigEnv names the variable that points hearthd at another configuration
// file; ApplyEnv leaves it alone.
const ConfigEnv = "HEARTH_CONFIG"

const envPrefix = "HEARTH_"

// fileConfig is the configuration file: one flat table, one key per Config
// field (same Go field name), spelled like the flag with underscores. Flat
// keeps a single spelling rule across file, environment and flags.
//
// Values are decoded as `any` and type-checked when applied: go-toml's own
// type errors name the Go field rather than the key the operator wrote, and
// carry no line.
type fileConfig struct {
	Listen      any `toml:"listen"`
	StateDir    any `toml:"state_dir"`
	AdminSocket any `toml:"admin_socket"`

	Model         any `toml:"model"`
	ModelGGUF     any `toml:"model_gguf"`
	ModelTemplate any `toml:"model_template"`
	// A table of Ollama parameters; its flag is the repeatable
	// --model-param key=value.
	ModelParams any `toml:"model_params" flag:"model-param"`

	OllamaURL       any `toml:"ollama_url"`
	OllamaStart     any `toml:"ollama_start"`
	OllamaBin       any `toml:"ollama_bin"`
	OllamaModelsDir any `toml:"ollama_models_dir"`
	RuntimeTimeout  any `toml:"runtime_timeout"`

	MaxConcurrent     any `toml:"max_concurrent"`
	MaxQueue          any `toml:"max_queue"`
	MaxBodyBytes      any `toml:"max_body_bytes"`
	ReadTimeout       any `toml:"read_timeout"`
	IdleTimeout       any `toml:"idle_timeout"`
	WriteStallTimeout any `toml:"write_stall_timeout"`
	ShutdownTimeout   any `toml:"shutdown_timeout"`

	MetricsListen  any `toml:"metrics_listen"`
	TLSCert        any `toml:"tls_cert"`
	TLSKey         any `toml:"tls_key"`
	AllowPlainHTTP any `toml:"allow_plain_http"`

	ControlURL      any `toml:"control_url"`
	EnrollmentToken any `toml:"enrollment_token"`
	NodeChip        any `toml:"node_chip"`
	NodeRAM         any `toml:"node_ram"`
	NodeStorage     any `toml:"node_storage"`
	Firewall        any `toml:"firewall"`

	SSHUser            any `toml:"ssh_user"`
	AuthorizedKeysFile any `toml:"authorized_keys_file"`
	DesiredStateFile   any `toml:"desired_state_file"`

	LogLevel any `toml:"log_level"`
}

// ConfigKey is one setting under its three spellings.
type ConfigKey struct {
	Name string // in the file: max_concurrent
	Flag string // on the command line: max-concurrent
	Env  string // in the environment: HEARTH_MAX_CONCURRENT
	// Field is the Config field it sets.
	Field string
}

// ConfigKeys lists every setting in file order.
func ConfigKeys() []ConfigKey {
	t := reflect.TypeFor[fileConfig]()
	keys := make([]ConfigKey, 0, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name := f.Tag.Get("toml")
		fl := f.Tag.Get("flag")
		if fl == "" {
			fl = strings.ReplaceAll(name, "_", "-")
		}
		keys = append(keys, ConfigKey{
			Name:  name,
			Flag:  fl,
			Env:   envPrefix + strings.ToUpper(name),
			Field: f.Name,
		})
	}
	return keys
}

// LoadFile applies the TOML file at path onto cfg; keys the file does not
// set keep their value. A missing file is an error wrapping fs.ErrNotExist:
// the caller decides whether the file may be absent. After any other error
// cfg may be partly updated and should not be used.
func LoadFile(path string, cfg *Config) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	return loadTOML(path, data, cfg)
}

func loadTOML(path string, data []byte, cfg *Config) error {
	var fc fileConfig
	dec := toml.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fc); err != nil {
		var strict *toml.StrictMissingError
		var de *toml.DecodeError
		switch {
		case errors.As(err, &strict):
			errs := make([]error, 0, len(strict.Errors))
			for _, e := range strict.Errors {
				row, _ := e.Position()
				key := strings.Join(e.Key(), ".")
				msg := fmt.Sprintf("config file %s line %d: unknown key %q", path, row, key)
				if hint := suggestKey(key); hint != "" {
					msg += fmt.Sprintf(" (did you mean %s?)", hint)
				} else if isTableHeader(data, row) {
					msg += " (the file has no sections: write every key at the top)"
				}
				errs = append(errs, errors.New(msg))
			}
			return errors.Join(errs...)
		case errors.As(err, &de):
			row, col := de.Position()
			return fmt.Errorf("config file %s line %d column %d: %s", path, row, col, strings.TrimPrefix(de.Error(), "toml: "))
		default:
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}

	lines := keyLines(data)
	fv := reflect.ValueOf(fc)
	cv := reflect.ValueOf(cfg).Elem()
	var errs []error
	for i, k := range ConfigKeys() {
		raw := fv.Field(i).Interface()
		if raw == nil {
			continue // not in the file
		}
		err := setTOML(cv.FieldByName(k.Field), raw)
		if m, ok := raw.(map[string]any); ok && err == nil {
			err = notSettings(m)
		}
		if err != nil {
			where := path
			if n, ok := lines[k.Name]; ok {
				where = fmt.Sprintf("%s line %d", path, n)
			}
			errs = append(errs, fmt.Errorf("config %s (%s): %w", k.Name, where, err))
		}
	}
	return errors.Join(errs...)
}

// notSettings catches hearthd settings inside a table: in TOML every key
// after a [model_params] header belongs to that table, so settings written
// below it would otherwise be passed to the runtime as parameters.
func notSettings(m map[string]any) error {
	for _, k := range ConfigKeys() {
		if _, ok := m[k.Name]; ok {
			return fmt.Errorf("%s is a hearthd setting, not a parameter: move it above the [table] header or write the table inline", k.Name)
		}
	}
	return nil
}

// suggestKey maps a near miss (a flag spelling, other case) to the key.
func suggestKey(key string) string {
	want := strings.ToLower(strings.ReplaceAll(key, "-", "_"))
	for _, k := range ConfigKeys() {
		if k.Name == want || strings.HasSuffix(want, "."+k.Name) {
			return k.Name
		}
	}
	return ""
}

// isTableHeader reports whether line row (1-based) of data opens a table.
func isTableHeader(data []byte, row int) bool {
	lines := bytes.Split(data, []byte("\n"))
	return row >= 1 && row <= len(lines) && bytes.HasPrefix(bytes.TrimSpace(lines[row-1]), []byte("["))
}

// keyLines finds the line of each top-level key, for error messages. The
// document has already been decoded, so parse errors cannot occur here.
func keyLines(data []byte) map[string]int {
	lines := map[string]int{}
	var p unstable.Parser
	p.Reset(data)
	inTable := false
	for p.NextExpression() {
		e := p.Expression()
		switch e.Kind {
		case unstable.Table, unstable.ArrayTable:
			inTable = true // later keys belong to the table
		case unstable.KeyValue:
			if inTable {
				continue
			}
		default:
			continue
		}
		it := e.Key()
		if it.Next() && it.IsLast() {
			n := it.Node()
			if _, seen := lines[string(n.Data)]; !seen {
				lines[string(n.Data)] = p.Shape(n.Raw).Start.Line
			}
		}
	}
	return lines
}

var durationType = reflect.TypeFor[time.Duration]()

// setTOML stores a decoded TOML value into a Config field, checking its
// type. Values are only echoed for numbers and durations, never strings
// (which may be secrets such as enrollment_token).
func setTOML(dst reflect.Value, raw any) error {
	switch {
	case dst.Type() == durationType:
		s, ok := raw.(string)
		if !ok {
			return fmt.Errorf("want a duration string such as \"30s\", got a TOML %s", tomlType(raw))
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as \"30s\" or \"2m\": %w", err)
		}
		dst.SetInt(int64(d))
	case dst.Kind() == reflect.String:
		s, ok := raw.(string)
		if !ok {
			return fmt.Errorf("want a string, got a TOML %s", tomlType(raw))
		}
		dst.SetString(s)
	case dst.Kind() == reflect.Bool:
		b, ok := raw.(bool)
		if !ok {
			return fmt.Errorf("want true or false, got a TOML %s", tomlType(raw))
		}
		dst.SetBool(b)
	case dst.Kind() == reflect.Int:
		n, ok := raw.(int64)
		if !ok {
			return fmt.Errorf("want an integer, got a TOML %s", tomlType(raw))
		}
		if dst.OverflowInt(n) {
			return fmt.Errorf("%d is out of range", n)
		}
		dst.SetInt(n)
	case dst.Type() == paramsType:
		m, ok := raw.(map[string]any)
		if !ok {
			return fmt.Errorf("want a table such as { num_ctx = 4096 }, got a TOML %s", tomlType(raw))
		}
		if err := checkParams(m); err != nil {
			return err
		}
		dst.Set(reflect.ValueOf(m))
	default:
		return fmt.Errorf("unsupported setting type %s", dst.Type())
	}
	return nil
}

var paramsType = reflect.TypeFor[map[string]any]()

// checkParams accepts the flat parameter values the runtime takes: numbers,
// strings, booleans and arrays of them.
func checkParams(m map[string]any) error {
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

// setText parses a flag or environment value into a Config field.
func setText(dst reflect.Value, s string) error {
	switch {
	case dst.Type() == durationType:
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as 30s or 2m: %w", err)
		}
		dst.SetInt(int64(d))
	case dst.Kind() == reflect.String:
		dst.SetString(s)
	case dst.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", s)
		}
		dst.SetBool(b)
	case dst.Kind() == reflect.Int:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || dst.OverflowInt(n) {
			return fmt.Errorf("want an integer, got %q", s)
		}
		dst.SetInt(n)
	case dst.Type() == paramsType:
		// One variable holds the whole table, so it is JSON.
		var m map[string]any
		dec := json.NewDecoder(strings.NewReader(s))
		dec.UseNumber()
		if err := dec.Decode(&m); err != nil {
			return fmt.Errorf(`want a JSON object such as {"num_ctx":4096}: %w`, err)
		}
		for k, v := range m {
			m[k] = fromJSON(v)
		}
		if err := checkParams(m); err != nil {
			return err
		}
		dst.Set(reflect.ValueOf(m))
	default:
		return fmt.Errorf("unsupported setting type %s", dst.Type())
	}
	return nil
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

// ApplyEnv applies the HEARTH_* variables in environ (os.Environ form) onto
// cfg. An empty value sets a string setting to "" (e.g.
// HEARTH_METRICS_LISTEN= disables metrics) and is an error for any other
// type. HEARTH_ variables that are no setting are returned as unknown, for
// the caller to warn about: a typo should be visible, but an unrelated
// variable in a shared environment must not stop the node. HEARTH_CONFIG
// is not a setting and is not reported.
func ApplyEnv(environ []string, cfg *Config) (unknown []string, err error) {
	byEnv := make(map[string]ConfigKey)
	for _, k := range ConfigKeys() {
		byEnv[k.Env] = k
	}
	cv := reflect.ValueOf(cfg).Elem()
	var errs []error
	for _, kv := range environ {
		name, val, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || name == ConfigEnv {
			continue
		}
		k, ok := byEnv[name]
		if !ok {
			unknown = append(unknown, name)
			continue
		}
		if err := setText(cv.FieldByName(k.Field), val); err != nil {
			errs = append(errs, fmt.Errorf("config %s (environment %s): %w", k.Name, name, err))
		}
	}
	sort.Strings(unknown)
	return unknown, errors.Join(errs...)
}

// ApplyFlags copies onto cfg the settings whose flags were given on the
// command line (fs.Visit), taking their values from parsed: the scratch
// Config the flags were bound to. Flags that are no setting (such as
// --config) are skipped. So: bind the flags to a scratch Config and parse;
// then build cfg as Defaults, LoadFile, ApplyEnv, ApplyFlags.
func ApplyFlags(fs *flag.FlagSet, parsed Config, cfg *Config) {
	byFlag := make(map[string]ConfigKey)
	for _, k := range ConfigKeys() {
		byFlag[k.Flag] = k
	}
	from := reflect.ValueOf(parsed)
	to := reflect.ValueOf(cfg).Elem()
	fs.Visit(func(f *flag.Flag) {
		if k, ok := byFlag[f.Name]; ok {
			to.FieldByName(k.Field).Set(from.FieldByName(k.Field))
		}
	})
}

// validateExtra checks the settings Validate does not: TLS, public plain
// HTTP, the control plane and node description, the log level. Keys are
// named by flag, like Validate.
func (c Config) validateExtra() []error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config %s: %s", key, fmt.Sprintf(format, args...)))
	}
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		bad("tls-key", "must be set when tls-cert is")
	case c.TLSKey != "" && c.TLSCert == "":
		bad("tls-cert", "must be set when tls-key is")
	}
	if host, _, err := net.SplitHostPort(c.Listen); err == nil && c.TLSCert == "" && !c.AllowPlainHTTP && !isLoopback(host) {
		bad("listen", "%q is not a loopback address, and plain HTTP there would carry API keys in the clear: set tls-cert and tls-key, or allow-plain-http (for example behind a TLS proxy)", c.Listen)
	}
	if c.MetricsListen != "" {
		if _, _, err := net.SplitHostPort(c.MetricsListen); err != nil {
			bad("metrics-listen", "%q is not host:port (\"\" disables metrics): %v", c.MetricsListen, err)
		}
	}
	if c.ControlURL != "" {
		if u, err := url.Parse(c.ControlURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("control-url", "%q is not an http(s) URL", c.ControlURL)
		}
	}
	if c.NodeRAM < 0 {
		bad("node-ram", "must not be negative, got %d", c.NodeRAM)
	}
	if c.NodeStorage < 0 {
		bad("node-storage", "must not be negative, got %d", c.NodeStorage)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level", "%q is not debug, info, warn or error", c.LogLevel)
	}
	return errs
}

// isLoopback reports whether host only ever means this machine. An empty
// host or a name other than localhost may resolve to a public address.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
