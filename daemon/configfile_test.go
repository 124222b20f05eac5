package daemon

import (
	"errors"
	"flag"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pelletier/go-toml/v2"
)

// writeConfig writes a config file into a temp dir and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hearthd.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// validateAll is what start-up runs once Validate calls validateExtra.
func validateAll(c Config) error {
	return errors.Join(c.Validate(), errors.Join(c.validateExtra()...))
}

func TestConfigKeysCoverConfig(t *testing.T) {
	ct := reflect.TypeFor[Config]()
	keys := ConfigKeys()
	if len(keys) != ct.NumField() {
		t.Errorf("%d config keys for %d Config fields", len(keys), ct.NumField())
	}
	seen := map[string]bool{}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	for _, k := range keys {
		f, ok := ct.FieldByName(k.Field)
		if !ok {
			t.Errorf("key %s sets unknown Config field %s", k.Name, k.Field)
			continue
		}
		if seen[k.Field] {
			t.Errorf("Config field %s has two keys", k.Field)
		}
		seen[k.Field] = true
		if !snake.MatchString(k.Name) {
			t.Errorf("key %q is not snake_case", k.Name)
		}
		wantFlag := strings.ReplaceAll(k.Name, "_", "-")
		if k.Name == "model_params" {
			wantFlag = "model-param" // repeatable key=value
		}
		if k.Flag != wantFlag || k.Env != "HEARTH_"+strings.ToUpper(k.Name) {
			t.Errorf("key %s: flag %s env %s", k.Name, k.Flag, k.Env)
		}
		// Every field type must be settable from both TOML and text.
		v := reflect.New(f.Type).Elem()
		if err := setText(v, sampleText(f.Type)); err != nil {
			t.Errorf("key %s: %v", k.Name, err)
		}
	}
}

func sampleText(t reflect.Type) string {
	switch {
	case t == durationType:
		return "1s"
	case t.Kind() == reflect.Bool:
		return "true"
	case t.Kind() == reflect.Int:
		return "1"
	case t == paramsType:
		return `{"num_ctx":2048}`
	}
	return "x"
}

const fullConfig = `
# every key, none at its default
listen = "0.0.0.0:8443"
state_dir = "/srv/hearth"
admin_socket = "/run/hearth/admin.sock"
model = "llama3.2:1b"
model_gguf = "/srv/models/tiny.gguf"
model_template = "/srv/models/tiny.tmpl"
model_params = { num_ctx = 4096, temperature = 0.2, stop = ["<|im_end|>", "</s>"] }
ollama_url = "http://127.0.0.1:11500"
ollama_start = true
ollama_bin = "/usr/bin/ollama"
ollama_models_dir = "/srv/hearth/models"
runtime_timeout = "90s"
max_concurrent = 4
max_queue = 16
max_body_bytes = 1_048_576
read_timeout = "15s"
idle_timeout = "2m30s"
write_stall_timeout = "45s"
shutdown_timeout = "1m"
metrics_listen = "127.0.0.1:9999"
tls_cert = "/etc/hearth/tls/cert.pem"
tls_key = "/etc/hearth/tls/key.pem"
allow_plain_http = true
control_url = "https://control.example.com"
enrollment_token = "enr_secret"
node_chip = "M2 Ultra"
node_ram = 192
node_storage = 2000
firewall = true
ssh_user = "customer"
authorized_keys_file = "/home/customer/.ssh/authorized_keys"
desired_state_file = "/etc/hearth/desired.json"
log_level = "debug"
`

func TestLoadFileEveryKey(t *testing.T) {
	cfg := Defaults()
	if err := LoadFile(writeConfig(t, fullConfig), &cfg); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen:             "0.0.0.0:8443",
		StateDir:           "/srv/hearth",
		AdminSocket:        "/run/hearth/admin.sock",
		Model:              "llama3.2:1b",
		ModelGGUF:          "/srv/models/tiny.gguf",
		ModelTemplate:      "/srv/models/tiny.tmpl",
		ModelParams:        map[string]any{"num_ctx": int64(4096), "temperature": 0.2, "stop": []any{"<|im_end|>", "</s>"}},
		OllamaURL:          "http://127.0.0.1:11500",
		OllamaStart:        true,
		OllamaBin:          "/usr/bin/ollama",
		OllamaModelsDir:    "/srv/hearth/models",
		RuntimeTimeout:     90 * time.Second,
		MaxConcurrent:      4,
		MaxQueue:           16,
		MaxBodyBytes:       1 << 20,
		ReadTimeout:        15 * time.Second,
		IdleTimeout:        150 * time.Second,
		WriteStallTimeout:  45 * time.Second,
		ShutdownTimeout:    time.Minute,
		MetricsListen:      "127.0.0.1:9999",
		TLSCert:            "/etc/hearth/tls/cert.pem",
		TLSKey:             "/etc/hearth/tls/key.pem",
		AllowPlainHTTP:     true,
		ControlURL:         "https://control.example.com",
		EnrollmentToken:    "enr_secret",
		NodeChip:           "M2 Ultra",
		NodeRAM:            192,
		NodeStorage:        2000,
		Firewall:           true,
		SSHUser:            "customer",
		AuthorizedKeysFile: "/home/customer/.ssh/authorized_keys",
		DesiredStateFile:   "/etc/hearth/desired.json",
		LogLevel:           "debug",
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("loaded\n%+v\nwant\n%+v", cfg, want)
	}
	// The file above must exercise every key: each field moved off its
	// default, so a key that silently did nothing would show.
	def := reflect.ValueOf(Defaults())
	got := reflect.ValueOf(cfg)
	for _, k := range ConfigKeys() {
		if reflect.DeepEqual(def.FieldByName(k.Field).Interface(), got.FieldByName(k.Field).Interface()) {
			t.Errorf("key %s left at its default by the full config", k.Name)
		}
	}
	if err := validateAll(cfg); err != nil {
		t.Fatalf("full config invalid: %v", err)
	}
}

func TestLoadFileKeepsUnsetKeys(t *testing.T) {
	cfg := Defaults()
	cfg.NodeChip = "set before"
	if err := LoadFile(writeConfig(t, "max_queue = 0\nfirewall = false\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	want.NodeChip = "set before"
	want.MaxQueue = 0
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}
	// An empty file changes nothing.
	before := cfg
	if err := LoadFile(writeConfig(t, "# nothing\n"), &cfg); err != nil || !reflect.DeepEqual(cfg, before) {
		t.Fatalf("empty file: %v, %+v", err, cfg)
	}
}

func TestLoadFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string // substrings of the error
		notWant    string
	}{
		{"unknown key", "max_queue = 3\n\nmax_concurent = 2\n", []string{`line 3`, `unknown key "max_concurent"`}, ""},
		{"flag spelling", "max-concurrent = 2\n", []string{`line 1`, `unknown key "max-concurrent"`, "did you mean max_concurrent"}, ""},
		{"two unknown keys", "a = 1\nb = 2\n", []string{`line 1: unknown key "a"`, `line 2: unknown key "b"`}, ""},
		{"section", "model = \"m\"\n[limits]\nmax_concurrent = 2\n", []string{`unknown key "limits"`, "line 2", "no sections"}, ""},
		{"dotted key", "limits.max_concurrent = 2\n", []string{`unknown key "limits`}, ""},
		{"int as string", "listen = \"127.0.0.1:1\"\nmax_concurrent = \"8\"\n", []string{"config max_concurrent (", "line 2)", "want an integer, got a TOML string"}, ""},
		{"float for int", "max_body_bytes = 1.5\n", []string{"config max_body_bytes", "want an integer, got a TOML float"}, ""},
		{"bad duration", "read_timeout = \"30\"\n", []string{"config read_timeout", "line 1", "duration"}, ""},
		{"integer duration", "shutdown_timeout = 30\n", []string{"config shutdown_timeout", `want a duration string such as "30s", got a TOML integer`}, ""},
		{"bool as string", "firewall = \"yes\"\n", []string{"config firewall", "want true or false"}, ""},
		{"string as bool", "model = true\n", []string{"config model", "want a string, got a TOML boolean"}, ""},
		{"secret not echoed", "enrollment_token = [\"enr_topsecret\"]\n", []string{"config enrollment_token", "got a TOML array"}, "enr_topsecret"},
		{"two bad values", "max_queue = \"x\"\nidle_timeout = \"soon\"\n", []string{"config max_queue", "config idle_timeout"}, ""},
		{"syntax", "listen = \"127.0.0.1:8080\"\nmodel = \n", []string{"line 2"}, ""},
		{"duplicate key", "model = \"a\"\nmodel = \"b\"\n", []string{"model", "already defined"}, ""},
		{"params not a table", "model_params = \"num_ctx=4\"\n", []string{"config model_params", "want a table"}, ""},
		{"params nested table", "model_params = { a = { b = 1 } }\n", []string{"config model_params", "parameter a"}, ""},
		{"setting swallowed by params table", "model = \"m\"\n[model_params]\nnum_ctx = 4096\nmax_concurrent = 2\n", []string{"config model_params (", "line 2)", "max_concurrent is a hearthd setting"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			path := writeConfig(t, tc.body)
			err := LoadFile(path, &cfg)
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
				t.Errorf("error %q echoes %q", msg, tc.notWant)
			}
		})
	}
}

func TestLoadFileMissing(t *testing.T) {
	cfg := Defaults()
	path := filepath.Join(t.TempDir(), "absent.toml")
	err := LoadFile(path, &cfg)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Fatalf("missing file: %v", err)
	}
	if !reflect.DeepEqual(cfg, Defaults()) {
		t.Fatal("missing file changed the config")
	}
}

func TestApplyEnv(t *testing.T) {
	cfg := Defaults()
	unknown, err := ApplyEnv([]string{
		"PATH=/usr/bin",
		"HEARTH_MAX_CONCURRENT=12",
		"HEARTH_READ_TIMEOUT=1m30s",
		"HEARTH_FIREWALL=true",
		"HEARTH_METRICS_LISTEN=", // empty string: metrics off
		"HEARTH_CONTROL_URL=https://control.example.com/x=y",
		"HEARTH_CONFIG=/elsewhere.toml",
		"HEARTH_MAX_CONCURENT=3",
		"HEARTH_COLOR=blue",
	}, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"HEARTH_COLOR", "HEARTH_MAX_CONCURENT"}; !reflect.DeepEqual(unknown, want) {
		t.Errorf("unknown %v, want %v", unknown, want)
	}
	want := Defaults()
	want.MaxConcurrent = 12
	want.ReadTimeout = 90 * time.Second
	want.Firewall = true
	want.MetricsListen = ""
	want.ControlURL = "https://control.example.com/x=y"
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}

	_, err = ApplyEnv([]string{"HEARTH_MAX_QUEUE=many", "HEARTH_OLLAMA_START=", "HEARTH_IDLE_TIMEOUT=5"}, &cfg)
	for _, w := range []string{
		"config max_queue (environment HEARTH_MAX_QUEUE)",
		"config ollama_start (environment HEARTH_OLLAMA_START)",
		"config idle_timeout (environment HEARTH_IDLE_TIMEOUT)",
	} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
}

// serveFlags defines flags the way cmd/hearthd does, bound to a scratch
// Config, so only ApplyFlags decides what reaches the real one.
func serveFlags(scratch *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.String("config", DefaultConfigPath, "config file")
	fs.IntVar(&scratch.MaxConcurrent, "max-concurrent", scratch.MaxConcurrent, "")
	fs.IntVar(&scratch.MaxQueue, "max-queue", scratch.MaxQueue, "")
	fs.DurationVar(&scratch.ReadTimeout, "read-timeout", scratch.ReadTimeout, "")
	fs.DurationVar(&scratch.IdleTimeout, "idle-timeout", scratch.IdleTimeout, "")
	fs.BoolVar(&scratch.Firewall, "firewall", false, "")
	fs.BoolVar(&scratch.OllamaStart, "ollama-start", false, "")
	fs.StringVar(&scratch.Listen, "listen", scratch.Listen, "")
	fs.StringVar(&scratch.Model, "model", scratch.Model, "")
	fs.Func("model-param", "key=value", func(s string) error {
		k, v, _ := strings.Cut(s, "=")
		if scratch.ModelParams == nil {
			scratch.ModelParams = map[string]any{}
		}
		scratch.ModelParams[k] = v
		return nil
	})
	return fs
}

func TestPrecedence(t *testing.T) {
	// defaults < file < environment < flags, each layer only where set.
	path := writeConfig(t, `
max_concurrent = 8
max_queue = 9
read_timeout = "10s"
firewall = true
model = "from-file"
idle_timeout = "1m"
model_params = { num_ctx = 1024 }
`)
	scratch := Defaults()
	fs := serveFlags(&scratch)
	err := fs.Parse([]string{"--read-timeout=12s", "--config", path, "--ollama-start", "--model", "from-flag", "--model-param", "stop=</s>"})
	if err != nil {
		t.Fatal(err)
	}

	cfg := Defaults()
	if err := LoadFile(fs.Lookup("config").Value.String(), &cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := ApplyEnv([]string{"HEARTH_MAX_QUEUE=20", "HEARTH_READ_TIMEOUT=11s", "HEARTH_MODEL=from-env", "HEARTH_IDLE_TIMEOUT=3m"}, &cfg); err != nil {
		t.Fatal(err)
	}
	ApplyFlags(fs, scratch, &cfg)

	want := Defaults()
	want.MaxConcurrent = 8              // file
	want.MaxQueue = 20                  // env over file
	want.ReadTimeout = 12 * time.Second // flag over env over file
	want.IdleTimeout = 3 * time.Minute  // env over file; the flag was not given
	want.Firewall = true                // file; the flag's default false was not given
	want.OllamaStart = true             // flag
	want.Model = "from-flag"
	want.ModelParams = map[string]any{"stop": "</s>"} // a table is replaced whole
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}
}

func TestEnvModelParams(t *testing.T) {
	cfg := Defaults()
	if _, err := ApplyEnv([]string{`HEARTH_MODEL_PARAMS={"num_ctx":8192,"temperature":0.5,"stop":["a",1]}`}, &cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"num_ctx": int64(8192), "temperature": 0.5, "stop": []any{"a", int64(1)}}
	if !reflect.DeepEqual(cfg.ModelParams, want) {
		t.Fatalf("params %#v", cfg.ModelParams)
	}
	for _, bad := range []string{`num_ctx=1`, `{"a":{"b":1}}`, `[1]`} {
		_, err := ApplyEnv([]string{"HEARTH_MODEL_PARAMS=" + bad}, &cfg)
		if err == nil || !strings.Contains(err.Error(), "config model_params (environment HEARTH_MODEL_PARAMS)") {
			t.Errorf("%s: error %v", bad, err)
		}
	}
}

func TestInvalidConfigNamesKey(t *testing.T) {
	for _, tc := range []struct {
		name, body, key string
	}{
		{"zero concurrency", "max_concurrent = 0", "config max-concurrent:"},
		{"listen not host:port", `listen = "nope"`, "config listen:"},
		{"negative queue", "max_queue = -1", "config max-queue:"},
		{"zero timeout", `read_timeout = "0s"`, "config read-timeout:"},
		{"negative duration", `shutdown_timeout = "-5s"`, "config shutdown-timeout:"},
		{"ollama url", `ollama_url = "localhost:11434"`, "config ollama-url:"},
		{"cert without key", `tls_cert = "/etc/hearth/cert.pem"`, "config tls-key:"},
		{"key without cert", `tls_key = "/etc/hearth/key.pem"`, "config tls-cert:"},
		{"public plain http", `listen = "0.0.0.0:8080"`, "config listen:"},
		{"all interfaces plain http", `listen = ":8080"`, "config listen:"},
		{"hostname plain http", `listen = "example.com:80"`, "config listen:"},
		{"control url", `control_url = "control.example.com"`, "config control-url:"},
		{"control url scheme", `control_url = "ftp://control.example.com"`, "config control-url:"},
		{"negative ram", "node_ram = -1", "config node-ram:"},
		{"negative storage", "node_storage = -10", "config node-storage:"},
		{"log level", `log_level = "verbose"`, "config log-level:"},
		{"metrics listen", `metrics_listen = "9464"`, "config metrics-listen:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			if err := LoadFile(writeConfig(t, tc.body+"\n"), &cfg); err != nil {
				t.Fatal(err)
			}
			err := validateAll(cfg)
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %v, want it to name %q", err, tc.key)
			}
		})
	}
}

func TestValidConfigs(t *testing.T) {
	for _, body := range []string{
		"",
		`listen = "[::1]:8080"`,
		`listen = "localhost:8080"`,
		"listen = \"0.0.0.0:8443\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"",
		"listen = \"0.0.0.0:8080\"\nallow_plain_http = true",
		`metrics_listen = ""`,
		`log_level = "WARN"`,
		"control_url = \"http://127.0.0.1:7070\"\nnode_ram = 0",
	} {
		cfg := Defaults()
		if err := LoadFile(writeConfig(t, body+"\n"), &cfg); err != nil {
			t.Fatal(err)
		}
		if err := validateAll(cfg); err != nil {
			t.Errorf("%q: %v", body, err)
		}
	}
}

// TestConfigDoc keeps CONFIG.md in step with the code: every key has a row
// naming its env variable and flag, and the documented default is the real
// one.
func TestConfigDoc(t *testing.T) {
	doc, err := os.ReadFile("CONFIG.md")
	if err != nil {
		t.Fatal(err)
	}
	// | `key` | type | default | `HEARTH_KEY` | `--key` | what it does |
	row := regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\| ([a-z]+) \\| `([^`]*)` \\| `(HEARTH_[A-Z_]+)` \\| `--([a-z-]+)` \\|")
	rows := map[string][]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		rows[m[1]] = m
	}
	def := reflect.ValueOf(Defaults())
	for _, k := range ConfigKeys() {
		m, ok := rows[k.Name]
		if !ok {
			t.Errorf("CONFIG.md has no row for %s", k.Name)
			continue
		}
		delete(rows, k.Name)
		if m[4] != k.Env || m[5] != k.Flag {
			t.Errorf("%s: documented as %s / --%s, is %s / --%s", k.Name, m[4], m[5], k.Env, k.Flag)
		}
		// The default column is a TOML value: decode it as the key would
		// be and compare with Defaults().
		var fc map[string]any
		if err := toml.Unmarshal([]byte("v = "+m[3]), &fc); err != nil {
			t.Errorf("%s: default %s is not TOML: %v", k.Name, m[3], err)
			continue
		}
		var cfg Config
		field := reflect.ValueOf(&cfg).Elem().FieldByName(k.Field)
		if err := setTOML(field, fc["v"]); err != nil {
			t.Errorf("%s: documented default %s: %v", k.Name, m[3], err)
			continue
		}
		want := def.FieldByName(k.Field)
		if field.Kind() == reflect.Map && field.Len() == 0 && want.Len() == 0 {
			// {} documents an empty (nil) table
		} else if !reflect.DeepEqual(field.Interface(), want.Interface()) {
			t.Errorf("%s: documented default %s, real default %v", k.Name, m[3], want.Interface())
		}
		wantType := map[reflect.Kind]string{reflect.String: "string", reflect.Bool: "bool", reflect.Int: "integer", reflect.Map: "table"}[field.Kind()]
		if field.Type() == durationType {
			wantType = "duration"
		}
		if m[2] != wantType {
			t.Errorf("%s: documented type %s, is %s", k.Name, m[2], wantType)
		}
	}
	for name := range rows {
		t.Errorf("CONFIG.md documents %s, which is no key", name)
	}
}

// TestPackagedConfig checks the file installed as /etc/hearth/hearthd.toml:
// every commented-out `#key = value` line names a real key, with a value of
// the right type that is the key's default.
func TestPackagedConfig(t *testing.T) {
	const path = "../packaging/hearthd.toml"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc strings.Builder
	commented := regexp.MustCompile(`^#([a-z_]+ = .*)$`)
	for _, line := range strings.Split(string(data), "\n") {
		if m := commented.FindStringSubmatch(line); m != nil {
			doc.WriteString(m[1] + "\n")
		}
	}
	if doc.Len() == 0 {
		t.Fatal("no commented keys found")
	}
	// From the zero Config: every non-empty default must come from the file.
	var cfg Config
	if err := loadTOML(path, []byte(doc.String()), &cfg); err != nil {
		t.Fatal(err)
	}
	def := reflect.ValueOf(Defaults())
	got := reflect.ValueOf(cfg)
	var fc map[string]any
	if err := toml.Unmarshal([]byte(doc.String()), &fc); err != nil {
		t.Fatal(err)
	}
	for _, k := range ConfigKeys() {
		if _, shown := fc[k.Name]; !shown {
			continue
		}
		if g, d := got.FieldByName(k.Field).Interface(), def.FieldByName(k.Field).Interface(); !reflect.DeepEqual(g, d) {
			t.Errorf("%s shows %v, default is %v", k.Name, g, d)
		}
	}
}
