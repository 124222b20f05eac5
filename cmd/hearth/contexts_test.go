package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestContexts: contexts hold a URL and a token, the file is private,
// the token is never printed, and the precedence is --context,
// HEARTH_CONTEXT, HEARTH_URL/HEARTH_TOKEN, then the current context.
func TestContexts(t *testing.T) {
	h := newHarness(t)
	good, url := h.ctl.Token, h.ctl.URL
	bad := "hct_NotAValidTokenAtAll0000000000"
	// Without HEARTH_URL and HEARTH_TOKEN, only contexts are left.
	h.env["HEARTH_URL"], h.env["HEARTH_TOKEN"] = "", ""
	var outputs []string
	keep := func(r result) result { outputs = append(outputs, r.out, r.err); return r }

	h.fails(exitUsage, "server", "list")
	// The token comes on stdin (as a pipe from `hearth-control tokens create`).
	r := keep(h.startWith(good+"\n", "context", "create", "prod", "--url", url, "-o", "table").wait(t))
	if r.code != 0 || !strings.Contains(r.out, "Context prod created and now current") {
		t.Fatalf("context create: %v", r)
	}
	path := filepath.Join(h.env["XDG_CONFIG_HOME"], "hearth", "config.toml")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("config file %s: %v, mode %v; want 0600", path, err, fi.Mode().Perm())
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o700 {
		t.Fatalf("config directory mode %v, want 0700", di.Mode().Perm())
	}
	raw, _ := os.ReadFile(path)
	if !strings.Contains(string(raw), good) || !strings.Contains(string(raw), `current_context = 'prod'`) {
		t.Fatalf("config file:\n%s", raw)
	}
	keep(h.ok("server", "list")) // through the current context

	// The token can come from HEARTH_TOKEN too; a context with a bad one.
	h.env["HEARTH_TOKEN"] = bad
	keep(h.ok("context", "create", "dev", "--url", url))
	h.env["HEARTH_TOKEN"] = ""
	keep(h.fails(exitAuth, "server", "list"))         // dev is current now
	keep(h.ok("server", "list", "--context", "prod")) // the flag wins
	h.env["HEARTH_CONTEXT"] = "prod"
	keep(h.ok("server", "list"))                                  // so does HEARTH_CONTEXT
	keep(h.fails(exitAuth, "server", "list", "--context", "dev")) // over which the flag wins
	h.env["HEARTH_CONTEXT"] = ""
	h.env["HEARTH_URL"], h.env["HEARTH_TOKEN"] = url, good
	keep(h.ok("server", "list"))                                  // the environment over the current context
	keep(h.fails(exitAuth, "server", "list", "--context", "dev")) // but not over a named one
	h.env["HEARTH_URL"], h.env["HEARTH_TOKEN"] = "", ""

	var list []contextJSON
	keep(h.json(&list, "context", "list"))
	if len(list) != 2 || list[0].Name != "dev" || !list[0].Current || list[1].Name != "prod" || list[1].Current || list[1].URL != url {
		t.Fatalf("context list: %+v", list)
	}
	table := keep(h.ok("context", "list", "-o", "table")).out
	rows := tableRows(t, table, "CURRENT", "NAME", "URL", "CA FILE")
	if len(rows) != 2 || rows[0]["CURRENT"] != "*" || rows[1]["CURRENT"] != "-" || rows[1]["URL"] != url {
		t.Fatalf("context list table: %v\n%s", rows, table)
	}
	keep(h.ok("context", "use", "prod"))
	keep(h.ok("server", "list"))
	keep(h.fails(exitNotFound, "context", "use", "staging"))
	keep(h.fails(exitNotFound, "server", "list", "--context", "staging"))
	keep(h.fails(exitError, "context", "create", "prod", "--url", url))               // exists
	keep(h.fails(exitUsage, "context", "create", "bad name", "--url", url))           // name
	keep(h.fails(exitUsage, "context", "create", "x", "--url", "ftp://x"))            // URL
	keep(h.fails(exitUsage, "context", "create", "x", "--url", "http://example.com")) // token in the clear
	keep(h.fails(exitUsage, "context", "create", "x", "--url", url))                  // no token on stdin
	keep(h.ok("context", "delete", "prod"))
	keep(h.fails(exitNotFound, "context", "delete", "prod"))
	keep(h.fails(exitUsage, "server", "list")) // no current context left
	keep(h.ok("context", "delete", "dev"))

	for _, out := range outputs {
		if strings.Contains(out, good) || strings.Contains(out, bad) {
			t.Fatalf("a token was printed:\n%s", out)
		}
	}
}

// TestConfigFile: unknown keys and broken references are refused; a file
// readable by others is used with a warning.
func TestConfigFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "config.toml")
	var warnings []string
	warn := func(s string) { warnings = append(warnings, s) }
	if cfg, err := loadConfig(path, warn); err != nil || len(cfg.Contexts) != 0 {
		t.Fatalf("missing file: %+v %v", cfg, err)
	}
	for _, bad := range []string{
		"current_context = 'x'\n",
		"[contexts.a]\nurl = 'http://127.0.0.1'\ntokn = 'typo'\n",
		"[contexts.a]\ntoken = 'no url'\n",
		"[contexts.'bad name']\nurl = 'http://127.0.0.1'\n",
		"not toml",
	} {
		os.WriteFile(path, []byte(bad), 0o600)
		if _, err := loadConfig(path, warn); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
	os.Remove(path) // WriteFile keeps an existing file's mode
	os.WriteFile(path, []byte("current_context = 'a'\n[contexts.a]\nurl = 'http://127.0.0.1'\ntoken = 't'\n"), 0o644)
	cfg, err := loadConfig(path, warn)
	if err != nil || cfg.Contexts["a"].Token != "t" || len(warnings) != 1 || !strings.Contains(warnings[0], "chmod 600") {
		t.Fatalf("world-readable file: %+v %v %v", cfg, err, warnings)
	}
	// save writes 0600 whatever was there, and round-trips.
	if err := cfg.save(path); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after save %v", fi.Mode().Perm())
	}
	again, err := loadConfig(path, warn)
	if b1, _ := json.Marshal(cfg); err != nil || string(b1) != mustJSON(again) {
		t.Fatalf("round trip: %+v %v", again, err)
	}

	env := map[string]string{"HOME": "/home/u"}
	getenv := func(k string) string { return env[k] }
	for _, tc := range []struct {
		flag string
		env  map[string]string
		want string
	}{
		{"", map[string]string{"HOME": "/home/u"}, "/home/u/.config/hearth/config.toml"},
		{"", map[string]string{"HOME": "/home/u", "XDG_CONFIG_HOME": "/xdg"}, "/xdg/hearth/config.toml"},
		{"", map[string]string{"HOME": "/home/u", "XDG_CONFIG_HOME": "/xdg", "HEARTH_CONFIG": "/etc/h.toml"}, "/etc/h.toml"},
		{"/f.toml", map[string]string{"HEARTH_CONFIG": "/etc/h.toml"}, "/f.toml"},
	} {
		env = tc.env
		if got, err := configPath(tc.flag, getenv); err != nil || got != tc.want {
			t.Errorf("configPath(%q, %v) = %q, %v; want %q", tc.flag, tc.env, got, err, tc.want)
		}
	}
	env = map[string]string{}
	if _, err := configPath("", getenv); err == nil {
		t.Error("no HOME: want an error")
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}
