package daemon

import (
	"errors"
	"flag"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/config"
)

var update = flag.Bool("update", false, "rewrite the settings table of CONFIG.md")

// writeConfig writes a config file into a temp dir and returns its path.
func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "hearthd.toml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// load runs hearthd serve's loading onto cfg: flags args, environment
// environ, and only the file args or environ name (never the host's
// /etc/hearth/hearthd.toml).
func load(cfg *Config, args, environ []string) (config.Result, error) {
	ld := ConfigLoader(cfg)
	ld.DefaultPath = ""
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ld.AddFlags(fs)
	return ld.Load(fs, args, environ)
}

// loadFile loads the file at path onto cfg, nothing else.
func loadFile(cfg *Config, path string) error {
	_, err := load(cfg, []string{"--config", path}, nil)
	return err
}

// sample is a value of a setting's type that no default has.
func sample(typ string) string {
	return map[string]string{"string": "x-sample", "bool": "true", "integer": "7", "duration": "7s", "table": `{"a":1}`}[typ]
}

// TestSettingsCoverConfig checks the schema: every Config field is set by
// exactly one setting, spelled by the one rule.
func TestSettingsCoverConfig(t *testing.T) {
	var scratch Config
	settings := ConfigLoader(&scratch).Settings()
	ct := reflect.TypeFor[Config]()
	if len(settings) != ct.NumField() {
		t.Errorf("%d settings for %d Config fields", len(settings), ct.NumField())
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	setBy := map[string]string{}
	for _, s := range settings {
		if !snake.MatchString(s.Key) {
			t.Errorf("key %q is not snake_case", s.Key)
		}
		wantFlag := strings.ReplaceAll(s.Key, "_", "-")
		if s.Key == "model_params" {
			wantFlag = "model-param" // repeatable key=value
		}
		if s.Flag != wantFlag || s.Env != "HEARTH_"+strings.ToUpper(s.Key) {
			t.Errorf("key %s: flag %s env %s", s.Key, s.Flag, s.Env)
		}
		// Setting it must change exactly one field, one no other sets.
		cfg := Defaults()
		value := sample(s.Type)
		if s.Type == "bool" {
			// A switch is set by moving it off its default.
			value = strconv.FormatBool(!reflect.ValueOf(Defaults()).FieldByName(fieldOf(t, s.Key)).Bool())
		}
		if _, err := load(&cfg, nil, []string{s.Env + "=" + value}); err != nil {
			t.Errorf("key %s: %v", s.Key, err)
			continue
		}
		got, def := reflect.ValueOf(cfg), reflect.ValueOf(Defaults())
		var changed []string
		for i := range ct.NumField() {
			if !reflect.DeepEqual(got.Field(i).Interface(), def.Field(i).Interface()) {
				changed = append(changed, ct.Field(i).Name)
			}
		}
		if len(changed) != 1 {
			t.Errorf("key %s changes fields %v", s.Key, changed)
			continue
		}
		if other, dup := setBy[changed[0]]; dup {
			t.Errorf("Config field %s is set by %s and %s", changed[0], other, s.Key)
		}
		setBy[changed[0]] = s.Key
	}
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
wedge_timeout = "30s"
max_concurrent = 4
max_queue = 16
max_concurrent_per_key = 2
max_conns_per_source = 64
max_body_bytes = 1_048_576
max_output_tokens = 512
reasoning = false
read_timeout = "15s"
idle_timeout = "2m30s"
write_stall_timeout = "45s"
shutdown_timeout = "1m"
metrics_listen = "127.0.0.1:9999"
tls_cert = "/etc/hearth/tls/cert.pem"
tls_key = "/etc/hearth/tls/key.pem"
allow_plain_http = true
cors_allowed_origins = "https://app.example.com, http://localhost:5173"
control_url = "https://control.example.com"
enrollment_token = "enr_secret"
control_ca_file = "/etc/hearth/control-ca.pem"
control_cert_sha256 = "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89"
node_chip = "M2 Ultra"
node_ram = 192
node_storage = 2000
firewall = true
ssh_user = "customer"
authorized_keys_file = "/home/customer/.ssh/authorized_keys"
desired_state_file = "/etc/hearth/desired.json"
max_procs = 3
log_level = "debug"
`

func TestLoadFileEveryKey(t *testing.T) {
	cfg := Defaults()
	if err := loadFile(&cfg, writeConfig(t, fullConfig)); err != nil {
		t.Fatal(err)
	}
	want := Config{
		Listen:              "0.0.0.0:8443",
		StateDir:            "/srv/hearth",
		AdminSocket:         "/run/hearth/admin.sock",
		Model:               "llama3.2:1b",
		ModelGGUF:           "/srv/models/tiny.gguf",
		ModelTemplate:       "/srv/models/tiny.tmpl",
		ModelParams:         map[string]any{"num_ctx": int64(4096), "temperature": 0.2, "stop": []any{"<|im_end|>", "</s>"}},
		OllamaURL:           "http://127.0.0.1:11500",
		OllamaStart:         true,
		OllamaBin:           "/usr/bin/ollama",
		OllamaModelsDir:     "/srv/hearth/models",
		RuntimeTimeout:      90 * time.Second,
		WedgeTimeout:        30 * time.Second,
		MaxConcurrent:       4,
		MaxQueue:            16,
		MaxConcurrentPerKey: 2,
		MaxConnsPerSource:   64,
		MaxBodyBytes:        1 << 20,
		MaxOutputTokens:     512,
		Reasoning:           false,
		ReadTimeout:         15 * time.Second,
		IdleTimeout:         150 * time.Second,
		WriteStallTimeout:   45 * time.Second,
		ShutdownTimeout:     time.Minute,
		MetricsListen:       "127.0.0.1:9999",
		TLSCert:             "/etc/hearth/tls/cert.pem",
		TLSKey:              "/etc/hearth/tls/key.pem",
		AllowPlainHTTP:      true,
		CORSAllowedOrigins:  "https://app.example.com, http://localhost:5173",
		ControlURL:          "https://control.example.com",
		EnrollmentToken:     "enr_secret",
		ControlCAFile:       "/etc/hearth/control-ca.pem",
		ControlCertSHA256:   "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89",
		NodeChip:            "M2 Ultra",
		NodeRAM:             192,
		NodeStorage:         2000,
		Firewall:            true,
		SSHUser:             "customer",
		AuthorizedKeysFile:  "/home/customer/.ssh/authorized_keys",
		DesiredStateFile:    "/etc/hearth/desired.json",
		MaxProcs:            3,
		LogLevel:            "debug",
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("loaded\n%+v\nwant\n%+v", cfg, want)
	}
	// The file above must exercise every key: each field moved off its
	// default, so a key that silently did nothing would show.
	def := reflect.ValueOf(Defaults())
	got := reflect.ValueOf(cfg)
	for i := range got.NumField() {
		if reflect.DeepEqual(def.Field(i).Interface(), got.Field(i).Interface()) {
			t.Errorf("field %s left at its default by the full config", got.Type().Field(i).Name)
		}
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("full config invalid: %v", err)
	}
}

func TestLoadFileKeepsUnsetKeys(t *testing.T) {
	cfg := Defaults()
	cfg.NodeChip = "set before"
	if err := loadFile(&cfg, writeConfig(t, "max_queue = 0\nfirewall = false\n")); err != nil {
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
	if err := loadFile(&cfg, writeConfig(t, "# nothing\n")); err != nil || !reflect.DeepEqual(cfg, before) {
		t.Fatalf("empty file: %v, %+v", err, cfg)
	}
}

func TestLoadFileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string // substrings of the error
		notWant    string
	}{
		{"unknown key", "max_queue = 3\n\nmax_concurent = 2\n", []string{`line 3`, `unknown key "max_concurent"`, "did you mean max_concurrent"}, ""},
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
			err := loadFile(&cfg, path)
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
	path := filepath.Join(t.TempDir(), "absent.toml")
	for name, tc := range map[string]struct{ args, env []string }{
		"flag":        {args: []string{"--config", path}},
		"environment": {env: []string{ConfigEnv + "=" + path}},
	} {
		cfg := Defaults()
		_, err := load(&cfg, tc.args, tc.env)
		if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: missing file: %v", name, err)
		}
		if !reflect.DeepEqual(cfg, Defaults()) {
			t.Errorf("%s: missing file changed the config", name)
		}
	}
	// The default path may be absent.
	cfg := Defaults()
	ld := ConfigLoader(&cfg)
	ld.DefaultPath = path
	res, err := ld.Load(flag.NewFlagSet("serve", flag.ContinueOnError), nil, nil)
	if err != nil || res.File != "" {
		t.Fatalf("absent default file: %v, read %q", err, res.File)
	}
}

func TestEnv(t *testing.T) {
	cfg := Defaults()
	res, err := load(&cfg, nil, []string{
		"PATH=/usr/bin",
		"HEARTH_MAX_CONCURRENT=12",
		"HEARTH_READ_TIMEOUT=1m30s",
		"HEARTH_FIREWALL=true",
		"HEARTH_METRICS_LISTEN=", // empty string: metrics off
		"HEARTH_CONTROL_URL=https://control.example.com/x=y",
		"HEARTH_CONFIG=",
		"HEARTH_CONTROL_LISTEN=0.0.0.0:8400", // hearth-control's
		"HEARTH_MAX_CONCURENT=3",
		"HEARTH_COLOR=blue",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []config.UnknownEnv{{Name: "HEARTH_COLOR"}, {Name: "HEARTH_MAX_CONCURENT", DidYouMean: "HEARTH_MAX_CONCURRENT"}}
	if !reflect.DeepEqual(res.UnknownEnv, want) {
		t.Errorf("unknown %v, want %v", res.UnknownEnv, want)
	}
	wantCfg := Defaults()
	wantCfg.MaxConcurrent = 12
	wantCfg.ReadTimeout = 90 * time.Second
	wantCfg.Firewall = true
	wantCfg.MetricsListen = ""
	wantCfg.ControlURL = "https://control.example.com/x=y"
	if !reflect.DeepEqual(cfg, wantCfg) {
		t.Fatalf("got %+v\nwant %+v", cfg, wantCfg)
	}

	_, err = load(&cfg, nil, []string{"HEARTH_MAX_QUEUE=many", "HEARTH_OLLAMA_START=", "HEARTH_IDLE_TIMEOUT=5"})
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
	cfg := Defaults()
	_, err := load(&cfg,
		[]string{"--read-timeout=12s", "--config", path, "--ollama-start", "--model", "from-flag", "--model-param", "stop=</s>", "--model-param", "num_gpu=1"},
		[]string{"HEARTH_MAX_QUEUE=20", "HEARTH_READ_TIMEOUT=11s", "HEARTH_MODEL=from-env", "HEARTH_IDLE_TIMEOUT=3m"})
	if err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	want.MaxConcurrent = 8              // file
	want.MaxQueue = 20                  // env over file
	want.ReadTimeout = 12 * time.Second // flag over env over file
	want.IdleTimeout = 3 * time.Minute  // env over file; the flag was not given
	want.Firewall = true                // file; the flag's default false was not given
	want.OllamaStart = true             // flag
	want.Model = "from-flag"
	want.ModelParams = map[string]any{"stop": "</s>", "num_gpu": int64(1)} // a table is replaced whole
	if !reflect.DeepEqual(cfg, want) {
		t.Fatalf("got %+v\nwant %+v", cfg, want)
	}
}

// TestOverriddenValuesChecked: a bad value in the file or the environment
// is an error even where a flag overrides it; the file is broken either way.
func TestOverriddenValuesChecked(t *testing.T) {
	path := writeConfig(t, "read_timeout = \"30\"\n")
	cfg := Defaults()
	_, err := load(&cfg, []string{"--config", path, "--read-timeout=5s", "--max-queue=1"}, []string{"HEARTH_MAX_QUEUE=lots"})
	for _, w := range []string{"config read_timeout (" + path + " line 1)", "config max_queue (environment HEARTH_MAX_QUEUE)"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v lacks %q", err, w)
		}
	}
}

func TestEnvModelParams(t *testing.T) {
	cfg := Defaults()
	if _, err := load(&cfg, nil, []string{`HEARTH_MODEL_PARAMS={"num_ctx":8192,"temperature":0.5,"stop":["a",1]}`}); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"num_ctx": int64(8192), "temperature": 0.5, "stop": []any{"a", int64(1)}}
	if !reflect.DeepEqual(cfg.ModelParams, want) {
		t.Fatalf("params %#v", cfg.ModelParams)
	}
	for _, bad := range []string{`num_ctx=1`, `{"a":{"b":1}}`, `[1]`} {
		_, err := load(&cfg, nil, []string{"HEARTH_MODEL_PARAMS=" + bad})
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
		{"wedge timeout too short", `wedge_timeout = "100ms"`, "config wedge-timeout: must be 0 (never) or at least 1s"},
		{"listen not host:port", `listen = "nope"`, "config listen:"},
		{"negative queue", "max_queue = -1", "config max-queue:"},
		{"negative connection cap", "max_conns_per_source = -1", "config max-conns-per-source:"},
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
		{"credential over plain http", `control_url = "http://10.0.0.1:8400"`, "config control-url:"},
		{"credential over plain http by name", `control_url = "http://control.example.com"`, "config control-url:"},
		{"pin format", "control_url = \"https://c.example.com\"\ncontrol_cert_sha256 = \"abc\"", "config control-cert-sha256:"},
		{"pin over http", "control_url = \"http://127.0.0.1:8400\"\ncontrol_cert_sha256 = \"" + strings.Repeat("ab", 32) + "\"", "config control-cert-sha256:"},
		{"ca over http", "control_url = \"http://127.0.0.1:8400\"\ncontrol_ca_file = \"/ca.pem\"", "config control-ca-file:"},
		{"negative ram", "node_ram = -1", "config node-ram:"},
		{"negative storage", "node_storage = -10", "config node-storage:"},
		{"log level", `log_level = "verbose"`, "config log-level:"},
		{"metrics listen", `metrics_listen = "9464"`, "config metrics-listen:"},
		{"ollama bin", "ollama_start = true\nollama_bin = \"\"", "config ollama-bin:"},
		{"body limit", "max_body_bytes = 1000", "config max-body-bytes:"},
		{"negative procs", "max_procs = -1", "config max-procs:"},
		{"cors origin with a path", `cors_allowed_origins = "https://app.example.com/"`, "config cors-allowed-origins:"},
		{"cors origin without a scheme", `cors_allowed_origins = "*, app.example.com"`, "config cors-allowed-origins:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Defaults()
			if err := loadFile(&cfg, writeConfig(t, tc.body+"\n")); err != nil {
				t.Fatal(err)
			}
			err := cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Fatalf("error %v, want it to name %q", err, tc.key)
			}
		})
	}
}

// hearthd takes a quarter of the CPUs it may use unless told otherwise:
// by max_procs first, then by the GOMAXPROCS variable, which Go applied.
func TestProcs(t *testing.T) {
	for _, tc := range []struct {
		maxProcs, cpus int
		env            string
		want           int
	}{
		{0, 1, "", 1},
		{0, 2, "", 1},
		{0, 7, "", 1},
		{0, 8, "", 2},
		{0, 64, "", 16},
		{0, 64, "8", 0}, // the variable's choice stands
		{3, 64, "8", 3},
		{5, 2, "", 5},
	} {
		c := Defaults()
		c.MaxProcs = tc.maxProcs
		if got := c.Procs(tc.cpus, tc.env); got != tc.want {
			t.Errorf("max_procs %d, %d CPUs, GOMAXPROCS=%q: %d, want %d", tc.maxProcs, tc.cpus, tc.env, got, tc.want)
		}
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
		"control_url = \"http://localhost:7070\"",
		"control_url = \"https://10.0.0.1:8400\"\ncontrol_cert_sha256 = \"" + strings.Repeat("AB", 32) + ", " + strings.Repeat("cd:", 31) + "cd\"",
	} {
		cfg := Defaults()
		if err := loadFile(&cfg, writeConfig(t, body+"\n")); err != nil {
			t.Fatal(err)
		}
		if err := cfg.Validate(); err != nil {
			t.Errorf("%q: %v", body, err)
		}
	}
}

// TestConfigDoc keeps the settings table of CONFIG.md in step with the
// flags; go test ./daemon -run TestConfigDoc -update rewrites it.
func TestConfigDoc(t *testing.T) {
	cfg := Defaults()
	stale, err := config.UpdateDoc("CONFIG.md", ConfigLoader(&cfg).MarkdownTable(), *update)
	if err != nil {
		t.Fatal(err)
	}
	if stale && !*update {
		t.Error("CONFIG.md's settings table is out of date: go test ./daemon -run TestConfigDoc -update")
	}
}

// TestPackagedConfig checks the file installed as /etc/hearth/hearthd.toml:
// it loads as it is, and every commented-out `#key = value` line names a
// real key, with a value of the right type that is the key's default.
func TestPackagedConfig(t *testing.T) {
	const path = "../packaging/hearthd.toml"
	cfg := Defaults()
	if err := loadFile(&cfg, path); err != nil || !reflect.DeepEqual(cfg, Defaults()) {
		t.Fatalf("packaged file as shipped: %v, %+v", err, cfg)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	commented := config.Commented(data)
	if strings.Count(commented, "\n") < 10 {
		t.Fatalf("only these commented keys found:\n%s", commented)
	}
	// Every value shown must be the default: loaded over the defaults it
	// changes nothing.
	shown := Defaults()
	if err := loadFile(&shown, writeConfig(t, commented)); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(shown, Defaults()) {
		t.Errorf("commented keys are not the defaults:\n%+v\nwant\n%+v", shown, Defaults())
	}
}

// fieldOf is the Config field a key names: the key in CamelCase, with the
// few initialisms the Config spells in capitals.
func fieldOf(t *testing.T, key string) string {
	t.Helper()
	var b strings.Builder
	for _, part := range strings.Split(key, "_") {
		switch part {
		case "url", "tls", "ssh", "http", "ca", "ram", "cors":
			b.WriteString(strings.ToUpper(part))
		default:
			b.WriteString(strings.ToUpper(part[:1]) + part[1:])
		}
	}
	if _, ok := reflect.TypeFor[Config]().FieldByName(b.String()); !ok {
		t.Fatalf("key %s: no Config field %s", key, b.String())
	}
	return b.String()
}
