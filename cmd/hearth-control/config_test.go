package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/daemon"
	"github.com/hearthd/hearth/internal/config"
)

var update = flag.Bool("update", false, "rewrite the settings table of control/CONFIG.md")

// load runs hearth-control serve's loading: flags args, environment
// environ, and only the file they name (never the host's).
func load(args, environ []string) (settings, config.Result, error) {
	s := defaults()
	ld := loader(&s)
	ld.DefaultPath = ""
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ld.AddFlags(fs)
	res, err := ld.Load(fs, args, environ)
	return s, res, err
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadEverySource(t *testing.T) {
	path := writeFile(t, "control.toml", `
listen = "0.0.0.0:8400"
allow_plain_http = true
public_deployment_url_template = "https://{name}.example.com/api/v1"
rate_limit = 50
rate_burst = 100
provision_timeout = "15m"
node_timeout = "2m"
log_level = "debug"
`)
	got, res, err := load([]string{"--config", path, "--rate-burst", "7", "--delete-timeout", "90s"}, []string{
		"HEARTH_CONTROL_RATE_LIMIT=2.5",
		"HEARTH_CONTROL_METRICS_LISTEN=",
		"HEARTH_LISTEN=127.0.0.1:1",               // hearthd's: no effect here
		"HEARTH_CONTROL_URL=http://control.test/", // hearthd's control_url: not reported
		"HEARTH_CONTROL_CERT_SHA256=ab",           // hearthd's too
		"HEARTH_CONTROL_RATE_LIMT=3",
	})
	if err != nil {
		t.Fatal(err)
	}
	want := defaults()
	want.Listen = "0.0.0.0:8400"
	want.AllowPlainHTTP = true
	want.DeploymentURLTemplate = "https://{name}.example.com/api/v1"
	want.RateLimit = 2.5 // environment over file
	want.RateBurst = 7   // flag over file
	want.ProvisionTimeout = 15 * time.Minute
	want.NodeTimeout = 2 * time.Minute
	want.DeleteTimeout = 90 * time.Second // flag
	want.LogLevel = "debug"
	want.MetricsListen = ""
	if got != want {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	wantUnknown := []config.UnknownEnv{{Name: "HEARTH_CONTROL_RATE_LIMT", DidYouMean: "HEARTH_CONTROL_RATE_LIMIT"}}
	if !reflect.DeepEqual(res.UnknownEnv, wantUnknown) || res.File != path {
		t.Errorf("result %+v", res)
	}
	if err := got.Validate(); err != nil {
		t.Error(err)
	}
}

func TestLoadErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		env        []string
		want       []string
	}{
		{"flag spelling", "rate-limit = 5\n", nil, []string{"line 1", `unknown key "rate-limit"`, "did you mean rate_limit"}},
		{"typo", "\nstate_dri = \"/srv\"\n", nil, []string{"line 2", "did you mean state_dir"}},
		{"integer for duration", "provision_timeout = 600\n", nil, []string{"config provision_timeout (", "line 1)", "want a duration string"}},
		{"string for float", "rate_limit = \"fast\"\n", nil, []string{"config rate_limit", "want a number, got a TOML string"}},
		{"float for integer", "rate_burst = 1.5\n", nil, []string{"config rate_burst", "want an integer, got a TOML float"}},
		{"bad environment", "", []string{"HEARTH_CONTROL_RATE_BURST=lots"}, []string{"config rate_burst (environment HEARTH_CONTROL_RATE_BURST)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := load([]string{"--config", writeFile(t, "control.toml", tc.body)}, tc.env)
			for _, w := range tc.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v lacks %q", err, w)
				}
			}
		})
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		env []string
		key string
	}{
		{[]string{"HEARTH_CONTROL_LISTEN=8400"}, "config listen:"},
		{[]string{"HEARTH_CONTROL_LISTEN=0.0.0.0:8400"}, "config listen:"},
		{[]string{"HEARTH_CONTROL_LISTEN=:8400"}, "config listen:"},
		{[]string{"HEARTH_CONTROL_LISTEN=control.example.com:8400"}, "config listen:"},
		{[]string{"HEARTH_CONTROL_TLS_CERT=/c.pem"}, "config tls-key:"},
		{[]string{"HEARTH_CONTROL_TLS_KEY=/k.pem"}, "config tls-cert:"},
		{[]string{"HEARTH_CONTROL_STATE_DIR="}, "config state-dir:"},
		{[]string{"HEARTH_CONTROL_PUBLIC_DEPLOYMENT_URL_TEMPLATE="}, "config public-deployment-url-template:"},
		{[]string{"HEARTH_CONTROL_PROVISION_TIMEOUT=0s"}, "config provision-timeout:"},
		{[]string{"HEARTH_CONTROL_NODE_TIMEOUT=0s"}, "config node-timeout:"},
		{[]string{"HEARTH_CONTROL_DELETE_TIMEOUT=-1m"}, "config delete-timeout:"},
		{[]string{"HEARTH_CONTROL_RATE_LIMIT=0"}, "config rate-limit:"},
		{[]string{"HEARTH_CONTROL_RATE_LIMIT=NaN"}, "config rate-limit:"},
		{[]string{"HEARTH_CONTROL_RATE_BURST=0"}, "config rate-burst:"},
		{[]string{"HEARTH_CONTROL_METRICS_LISTEN=9465"}, "config metrics-listen:"},
		{[]string{"HEARTH_CONTROL_LOG_LEVEL=loud"}, "config log-level:"},
	} {
		s, _, err := load(nil, tc.env)
		if err != nil {
			t.Fatalf("%v: %v", tc.env, err)
		}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), tc.key) {
			t.Errorf("%v: error %v, want %q", tc.env, err, tc.key)
		}
	}
	if err := defaults().Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	for _, env := range [][]string{
		{"HEARTH_CONTROL_LISTEN=[::1]:8400"},
		{"HEARTH_CONTROL_LISTEN=localhost:8400"},
		{"HEARTH_CONTROL_LISTEN=0.0.0.0:8400", "HEARTH_CONTROL_ALLOW_PLAIN_HTTP=true"},
		{"HEARTH_CONTROL_LISTEN=0.0.0.0:8400", "HEARTH_CONTROL_TLS_CERT=/c.pem", "HEARTH_CONTROL_TLS_KEY=/k.pem"},
	} {
		s, _, err := load(nil, env)
		if err == nil {
			err = s.Validate()
		}
		if err != nil {
			t.Errorf("%v: %v", env, err)
		}
	}
}

// TestEnvPrefixes keeps the two programs' variables apart on a shared
// host: no variable is a setting of both, hearthd ignores every
// hearth-control variable, and hearth-control ignores hearthd's
// HEARTH_CONTROL_URL.
func TestEnvPrefixes(t *testing.T) {
	var c settings
	var d daemon.Config
	ctl, node := loader(&c), daemon.ConfigLoader(&d)
	nodeEnv := map[string]bool{}
	for _, s := range node.Settings() {
		nodeEnv[s.Env] = true
		if strings.HasPrefix(s.Env, ctl.EnvPrefix) && !slicesHasPrefix(ctl.ForeignEnv, s.Env) {
			t.Errorf("hearthd's %s would be reported as unknown by hearth-control", s.Env)
		}
	}
	for _, s := range append(ctl.Settings(), config.Setting{Env: ctl.ConfigEnv}) {
		if nodeEnv[s.Env] || s.Env == node.ConfigEnv {
			t.Errorf("%s is a variable of both programs", s.Env)
		}
		if !slicesHasPrefix(node.ForeignEnv, s.Env) {
			t.Errorf("hearth-control's %s would be reported as unknown by hearthd", s.Env)
		}
		if slicesHasPrefix(ctl.ForeignEnv, s.Env) {
			t.Errorf("hearth-control ignores its own %s", s.Env)
		}
	}
}

func slicesHasPrefix(prefixes []string, s string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// TestAdminCommandsUseConfig: the operator commands find the state
// directory where the configuration file puts it.
func TestAdminCommandsUseConfig(t *testing.T) {
	dir := t.TempDir()
	path := writeFile(t, "control.toml", "state_dir = \""+dir+"\"\nrate_limit = 5\n")
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"tokens", "create", "--config", path, "--project", "default", "--name", "ops"}, &out, &errOut)
	if err != nil {
		t.Fatalf("tokens create: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(errOut.String(), "(ops, read_write) created") || strings.TrimSpace(out.String()) == "" {
		t.Fatalf("output %q / %q", out.String(), errOut.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "db")); err != nil {
		t.Fatalf("state not in the configured directory: %v", err)
	}
	// The same through the environment; a serve flag is no operator flag.
	t.Setenv("HEARTH_CONTROL_STATE_DIR", dir)
	out.Reset()
	if err := run(context.Background(), []string{"nodes", "list"}, &out, io.Discard); err != nil || strings.TrimSpace(out.String()) != "[]" {
		t.Fatalf("nodes list: %v, %q", err, out.String())
	}
	if err := run(context.Background(), []string{"nodes", "list", "--rate-limit", "5"}, io.Discard, io.Discard); err == nil {
		t.Fatal("nodes list took --rate-limit")
	}
}

// TestConfigDoc keeps the settings table of control/CONFIG.md in step with
// the flags; go test ./cmd/hearth-control -run TestConfigDoc -update
// rewrites it.
func TestConfigDoc(t *testing.T) {
	s := defaults()
	stale, err := config.UpdateDoc("../../control/CONFIG.md", loader(&s).MarkdownTable(), *update)
	if err != nil {
		t.Fatal(err)
	}
	if stale && !*update {
		t.Error("control/CONFIG.md's settings table is out of date: go test ./cmd/hearth-control -run TestConfigDoc -update")
	}
}

// TestPackagedConfig checks the file installed as /etc/hearth/control.toml:
// it loads as it is, and its commented-out `#key = value` lines are real
// keys shown with their defaults.
func TestPackagedConfig(t *testing.T) {
	const path = "../../packaging/control.toml"
	if s, _, err := load([]string{"--config", path}, nil); err != nil || s != defaults() {
		t.Fatalf("packaged file as shipped: %v, %+v", err, s)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	commented := config.Commented(data)
	if strings.Count(commented, "\n") < 3 {
		t.Fatalf("only these commented keys found:\n%s", commented)
	}
	shown, _, err := load([]string{"--config", writeFile(t, "shown.toml", commented)}, nil)
	if err != nil || shown != defaults() {
		t.Fatalf("commented keys: %v\n%+v\nwant the defaults\n%+v", err, shown, defaults())
	}
}
