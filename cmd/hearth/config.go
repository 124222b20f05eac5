package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/pelletier/go-toml/v2"
)

// configFile is the CLI's configuration: named contexts, each a control
// plane URL with the token to use there, and the one in use. It lives in
// $XDG_CONFIG_HOME/hearth/config.toml (~/.config/hearth/config.toml), mode
// 0600, since it holds tokens:
//
//	current_context = "prod"
//
//	[contexts.prod]
//	url = "https://control.example.com"
//	token = "hct_…"
//	ca_file = "/etc/ssl/private-ca.pem"   # optional
type configFile struct {
	CurrentContext string                   `toml:"current_context,omitempty"`
	Contexts       map[string]contextConfig `toml:"contexts,omitempty"`
}

// contextConfig is one control plane and the token to use there.
type contextConfig struct {
	URL    string `toml:"url"`
	Token  string `toml:"token"`
	CAFile string `toml:"ca_file,omitempty"`
	// AllowPlainHTTP lets the token travel over plain HTTP to a host
	// other than loopback.
	AllowPlainHTTP bool `toml:"allow_plain_http,omitempty"`
}

var contextNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// configPath is where the configuration file is: --config, else
// HEARTH_CONFIG, else under XDG_CONFIG_HOME, else under ~/.config.
func configPath(flag string, getenv func(string) string) (string, error) {
	switch {
	case flag != "":
		return flag, nil
	case getenv("HEARTH_CONFIG") != "":
		return getenv("HEARTH_CONFIG"), nil
	case getenv("XDG_CONFIG_HOME") != "":
		return filepath.Join(getenv("XDG_CONFIG_HOME"), "hearth", "config.toml"), nil
	case getenv("HOME") != "":
		return filepath.Join(getenv("HOME"), ".config", "hearth", "config.toml"), nil
	}
	return "", errors.New("no configuration file: set HOME or XDG_CONFIG_HOME (or use HEARTH_URL and HEARTH_TOKEN)")
}

// loadConfig reads the configuration; a missing file is an empty one.
// warn is told if the file is readable by others.
func loadConfig(path string, warn func(string)) (configFile, error) {
	var cfg configFile
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("read configuration: %w", err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		warn(fmt.Sprintf("%s holds tokens but is readable by others (mode %04o); chmod 600 it", path, fi.Mode().Perm()))
	}
	dec := toml.NewDecoder(bytes.NewReader(raw)).DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("configuration %s: %w", path, err)
	}
	for name, c := range cfg.Contexts {
		if !contextNameRe.MatchString(name) || c.URL == "" {
			return cfg, fmt.Errorf("configuration %s: context %q needs a name of letters, digits, '.', '_' or '-' and a url", path, name)
		}
	}
	if cfg.CurrentContext != "" {
		if _, ok := cfg.Contexts[cfg.CurrentContext]; !ok {
			return cfg, fmt.Errorf("configuration %s: current_context %q is not a context", path, cfg.CurrentContext)
		}
	}
	return cfg, nil
}

// save writes the configuration atomically (a new file renamed over the
// old), mode 0600 in a directory of mode 0700: a crash leaves the old file
// or the new one, never half of one, and no other user can read a token.
func (cfg configFile) save(path string) error {
	raw, err := toml.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("encode configuration: %w", err)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create configuration directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".config-*.toml")
	if err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing there
	_, err = tmp.Write(raw)
	if err == nil {
		err = tmp.Chmod(0o600)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write configuration: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync() // the rename itself reaches the disk
		d.Close()
	}
	return nil
}

// contextNames returns the names of the contexts, sorted.
func (cfg configFile) contextNames() []string {
	names := make([]string, 0, len(cfg.Contexts))
	for n := range cfg.Contexts {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// connection is what a command connects with: the URL, the token and how
// to trust the URL's certificate, and where they came from.
type connection struct {
	contextConfig
	source string // "context NAME" or "environment"
}

// resolveConnection picks the connection. A token always comes with the
// URL it was given for, never with another's:
//
//  1. a context named by --context or HEARTH_CONTEXT;
//  2. else HEARTH_URL and HEARTH_TOKEN (and HEARTH_CA_FILE), if set;
//  3. else the configuration's current context.
func resolveConnection(cfg configFile, flagContext string, getenv func(string) string) (connection, error) {
	name := flagContext
	if name == "" {
		name = getenv("HEARTH_CONTEXT")
	}
	if name == "" && (getenv("HEARTH_URL") != "" || getenv("HEARTH_TOKEN") != "") {
		c := connection{source: "environment", contextConfig: contextConfig{URL: getenv("HEARTH_URL"),
			Token: getenv("HEARTH_TOKEN"), CAFile: getenv("HEARTH_CA_FILE"),
			AllowPlainHTTP: getenv("HEARTH_ALLOW_PLAIN_HTTP") == "1"}}
		if c.URL == "" || c.Token == "" {
			return c, usagef("HEARTH_URL and HEARTH_TOKEN must be set together")
		}
		return c, nil
	}
	if name == "" {
		name = cfg.CurrentContext
	}
	if name == "" {
		return connection{}, usagef("no control plane to talk to: set HEARTH_URL and HEARTH_TOKEN, or create a context with `hearth context create NAME --url URL`")
	}
	c, ok := cfg.Contexts[name]
	if !ok {
		return connection{}, notFoundError{msg: fmt.Sprintf("context %q not found (contexts: %s)", name, strings.Join(cfg.contextNames(), ", "))}
	}
	if c.Token == "" {
		return connection{}, usagef(fmt.Sprintf("context %q has no token", name))
	}
	return connection{contextConfig: c, source: "context " + name}, nil
}
