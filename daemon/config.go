package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"time"
)

// Config is everything hearthd serve needs. Zero values are filled by
// Defaults; Validate names the first bad key.
type Config struct {
	// Listen is the deployment API address (host:port).
	Listen string
	// StateDir holds the Pebble state (API keys, usage) and the admin socket.
	StateDir string
	// AdminSocket is the local unix socket for `hearthd keys`; default
	// StateDir/admin.sock.
	AdminSocket string

	// Model is the deployment's one model: its name at the runtime and the
	// id clients pass as `model`.
	Model string
	// ModelGGUF, if set, is a local GGUF file the model is created from when
	// the runtime does not have it yet; otherwise it is pulled by name.
	ModelGGUF string
	// ModelTemplate is a file holding the Ollama chat template to create
	// the model from ModelGGUF with; ModelParams are its Ollama parameters
	// (num_predict, num_ctx, stop, …). A GGUF whose template Ollama cannot
	// detect needs them.
	ModelTemplate string
	ModelParams   map[string]any

	// OllamaURL is the runtime's base URL.
	OllamaURL string
	// OllamaStart makes hearthd start and supervise `ollama serve` itself,
	// listening on OllamaURL's host:port.
	OllamaStart bool
	// OllamaBin is the ollama binary used when OllamaStart is set.
	OllamaBin string
	// OllamaModelsDir is the private models directory for a supervised
	// runtime (OLLAMA_MODELS).
	OllamaModelsDir string
	// RuntimeTimeout bounds the wait for the runtime's first answer to a
	// chat request; past it the client gets 504.
	RuntimeTimeout time.Duration

	// MaxConcurrent generations run at once; MaxQueue more may wait.
	MaxConcurrent int
	MaxQueue      int
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes int
	// ReadTimeout bounds reading one request (slow clients);
	// IdleTimeout bounds a keep-alive connection between requests;
	// WriteStallTimeout bounds one write to a client that stopped reading.
	ReadTimeout       time.Duration
	IdleTimeout       time.Duration
	WriteStallTimeout time.Duration
	// ShutdownTimeout is how long in-flight requests may finish after
	// SIGTERM before they are ended.
	ShutdownTimeout time.Duration

	// MetricsListen serves Prometheus metrics on its own listener (default
	// loopback) so the public API port does not expose them; "" disables.
	MetricsListen string
	// TLSCert and TLSKey make the deployment API serve HTTPS; the files are
	// re-read when they change (certificate renewal without a restart).
	TLSCert string
	TLSKey  string
	// AllowPlainHTTP permits plain HTTP on a non-loopback address. Off by
	// default: the deployment URL is public, so plain HTTP is loopback-only.
	AllowPlainHTTP bool

	// ControlURL and EnrollmentToken join the node to a control plane;
	// empty ControlURL means standalone.
	ControlURL      string
	EnrollmentToken string
	// NodeChip, NodeRAM and NodeStorage describe this node's hardware when
	// it enrolls (RAM and storage in GB).
	NodeChip    string
	NodeRAM     int
	NodeStorage int
	// Firewall enables nftables enforcement on this host. Off in dev modes
	// (make run): the host's firewall is never touched unless enabled.
	Firewall bool
	// SSHUser is the user whose ~/.ssh/authorized_keys hearthd manages;
	// AuthorizedKeysFile overrides the path (tests, dev). Neither set: SSH
	// keys are not managed.
	SSHUser            string
	AuthorizedKeysFile string
	// DesiredStateFile, without a control plane, is a local JSON file of
	// firewall rules and SSH keys to enforce (standalone mode).
	DesiredStateFile string

	// LogLevel is debug, info, warn or error.
	LogLevel string
}

// Defaults returns a Config with every default filled in.
func Defaults() Config {
	return Config{
		Listen:            "127.0.0.1:8080",
		StateDir:          "/var/lib/hearth",
		Model:             "hearth-tiny",
		OllamaURL:         "http://127.0.0.1:11434",
		OllamaBin:         "ollama",
		RuntimeTimeout:    60 * time.Second,
		MaxConcurrent:     64,
		MaxQueue:          256,
		MaxBodyBytes:      4 << 20,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		WriteStallTimeout: 30 * time.Second,
		ShutdownTimeout:   30 * time.Second,
		MetricsListen:     "127.0.0.1:9464",
		LogLevel:          "info",
	}
}

// AdminSocketPath is AdminSocket or its default under StateDir.
func (c Config) AdminSocketPath() string {
	if c.AdminSocket != "" {
		return c.AdminSocket
	}
	return filepath.Join(c.StateDir, "admin.sock")
}

// Validate reports the first invalid key, by its flag name.
func (c Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("config %s: %s", key, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%q is not host:port: %v", c.Listen, err)
	}
	if c.StateDir == "" {
		bad("state-dir", "must be set")
	}
	if c.Model == "" {
		bad("model", "must be set")
	}
	if u, err := url.Parse(c.OllamaURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("ollama-url", "%q is not an http(s) URL", c.OllamaURL)
	}
	if c.OllamaStart && c.OllamaBin == "" {
		bad("ollama-bin", "must be set when ollama-start is on")
	}
	if c.MaxConcurrent < 1 {
		bad("max-concurrent", "must be at least 1, got %d", c.MaxConcurrent)
	}
	if c.MaxQueue < 0 {
		bad("max-queue", "must not be negative, got %d", c.MaxQueue)
	}
	if c.MaxBodyBytes < 1024 {
		bad("max-body-bytes", "must be at least 1024, got %d", c.MaxBodyBytes)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{
		{"runtime-timeout", c.RuntimeTimeout}, {"read-timeout", c.ReadTimeout},
		{"idle-timeout", c.IdleTimeout}, {"write-stall-timeout", c.WriteStallTimeout},
		{"shutdown-timeout", c.ShutdownTimeout},
	} {
		if d.v <= 0 {
			bad(d.key, "must be positive, got %s", d.v)
		}
	}
	errs = append(errs, c.validateExtra()...)
	return errors.Join(errs...)
}

// hostPort extracts host:port from a base URL, adding the scheme's default
// port when the URL has none.
func hostPort(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("config ollama-url: %w", err)
	}
	if u.Port() != "" {
		return u.Host, nil
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port), nil
}
