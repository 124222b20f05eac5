package daemon

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/hearthd/hearth/deployapi"
	"github.com/hearthd/hearth/internal/config"
	"github.com/hearthd/hearth/nodeapi"
)

// Config is everything hearthd serve needs: Defaults, then ConfigLoader
// (flags, HEARTH_* environment, the TOML file), then Validate.
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
	// WedgeTimeout is how long the runtime may answer nothing in flight,
	// and a probe nothing either, before it is taken for wedged (0: never).
	WedgeTimeout time.Duration
	// RuntimeTimeout bounds the wait for the runtime's first answer to a
	// chat request; past it the client gets 504.
	RuntimeTimeout time.Duration

	// MaxConcurrent generations run at once; MaxQueue more may wait.
	MaxConcurrent int
	MaxQueue      int
	// MaxConcurrentPerKey caps one API key's generations at once (0: no
	// cap beyond MaxConcurrent).
	MaxConcurrentPerKey int
	// MaxConnsPerSource caps the deployment API's connections open at
	// once from one IP address (0: no cap).
	MaxConnsPerSource int
	// MaxBodyBytes bounds a request body; larger ones get 413. 0 derives
	// it from the model's context length.
	MaxBodyBytes int
	// MaxOutputTokens caps max_tokens (400 above it) and every
	// generation's output; 0 is the model's context length.
	MaxOutputTokens int
	// Reasoning lets a reasoning model think before it answers (its
	// thinking sent apart, as reasoning_content); off, it is asked not to
	// and reasoning_effort other than "none" is a 400.
	Reasoning bool
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
	// CORSAllowedOrigins are the origins (comma-separated, or *) whose
	// browser pages may call the deployment API; empty: none.
	CORSAllowedOrigins string
	// AllowPlainHTTP permits plain HTTP on a non-loopback address. Off by
	// default: the deployment URL is public, so plain HTTP is loopback-only.
	AllowPlainHTTP bool

	// ControlURL and EnrollmentToken join the node to a control plane;
	// empty ControlURL means standalone.
	ControlURL      string
	EnrollmentToken string
	// ControlCAFile and ControlCertSHA256 say how the node verifies an
	// https control plane: a private CA, and/or pinned fingerprints of its
	// certificate (comma-separated; see nodeapi.TLS).
	ControlCAFile     string
	ControlCertSHA256 string
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

	// MaxProcs is how many processors run hearthd's Go code at once
	// (GOMAXPROCS); 0 chooses (Procs).
	MaxProcs int

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
		WedgeTimeout:      10 * time.Second,
		MaxConcurrent:     1,
		MaxQueue:          256,
		MaxConnsPerSource: 512,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		WriteStallTimeout: 30 * time.Second,
		ShutdownTimeout:   30 * time.Second,
		MetricsListen:     "127.0.0.1:9464",
		LogLevel:          "info",
		Reasoning:         true,
	}
}

// Procs is the GOMAXPROCS hearthd runs with, given the processors Go
// chose at start (cpus: the CPUs it may use, within its affinity and CPU
// quota) and the GOMAXPROCS environment variable: MaxProcs if set, else
// the variable's choice (0: leave it), else a quarter of cpus, at least 1.
// hearthd relays tokens; the model runtime beside it is what needs the
// cores, and Go's scheduler spread over idle processors costs a relay CPU
// per token in wake-ups and work stealing (docs/perf/gomaxprocs.md).
func (c Config) Procs(cpus int, env string) int {
	switch {
	case c.MaxProcs > 0:
		return c.MaxProcs
	case env != "":
		return 0
	}
	return max(1, cpus/4)
}

// AdminSocketPath is AdminSocket or its default under StateDir.
func (c Config) AdminSocketPath() string {
	if c.AdminSocket != "" {
		return c.AdminSocket
	}
	return filepath.Join(c.StateDir, "admin.sock")
}

// DefaultConfigPath is where hearthd looks for its configuration file.
const DefaultConfigPath = "/etc/hearth/hearthd.toml"

// ConfigEnv names the variable that points hearthd at another
// configuration file.
const ConfigEnv = "HEARTH_CONFIG"

// ConfigLoader returns the loader of hearthd's settings into c, whose
// values are the defaults (start from Defaults()). Its flags are the one
// schema of the settings: each flag's name, default, help text and type
// are also the file key, the HEARTH_ variable and the row of CONFIG.md.
// Keys in messages and in Validate are named by flag.
func ConfigLoader(c *Config) *config.Loader {
	fs := flag.NewFlagSet("hearthd", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", c.Listen, "Address (host:port) of the deployment API, /api/v1. Plain HTTP is only allowed on a loopback address unless allow_plain_http is set; anywhere else set tls_cert and tls_key.")
	fs.StringVar(&c.StateDir, "state-dir", c.StateDir, "Directory for hearthd's state: the Pebble database (API keys, usage) and, by default, the admin socket and a supervised runtime's models.")
	fs.StringVar(&c.AdminSocket, "admin-socket", c.AdminSocket, "Unix socket that hearthd keys talks to. Empty: admin.sock in state_dir.")

	fs.StringVar(&c.Model, "model", c.Model, "The deployment's one model: its name at the runtime and the model id clients send.")
	fs.StringVar(&c.ModelGGUF, "model-gguf", c.ModelGGUF, "A local GGUF file the model is created from when the runtime does not have it yet. Empty: the model is pulled by name.")
	fs.StringVar(&c.ModelTemplate, "model-template", c.ModelTemplate, "File holding the Ollama chat template used when creating the model from model_gguf (for a GGUF whose template Ollama cannot detect).")
	config.TableVar(fs, &c.ModelParams, "model-param", "model_params", "Ollama parameter `key=value` for the model created from model_gguf (num_ctx, stop, …); one flag per parameter. "+
		`In the file a table, e.g. { num_ctx = 4096, stop = ["<|im_end|>"] }; in the environment a JSON object, e.g. {"num_ctx":4096}. `+
		"Values are numbers, strings, booleans or arrays of them. Each source replaces the whole table.")

	fs.StringVar(&c.OllamaURL, "ollama-url", c.OllamaURL, "Base URL of the model runtime (Ollama).")
	fs.BoolVar(&c.OllamaStart, "ollama-start", c.OllamaStart, "Start and supervise ollama serve on ollama_url's host:port, instead of using one that is already running. It is started with OLLAMA_NUM_PARALLEL = max_concurrent + 1, and restarted when it exits and when it is found wedged (wedge_timeout).")
	fs.StringVar(&c.OllamaBin, "ollama-bin", c.OllamaBin, "The ollama binary started when ollama_start is on (looked up in PATH unless a path).")
	fs.StringVar(&c.OllamaModelsDir, "ollama-models-dir", c.OllamaModelsDir, "Models directory of the supervised runtime (OLLAMA_MODELS). Empty: models in state_dir.")
	fs.DurationVar(&c.RuntimeTimeout, "runtime-timeout", c.RuntimeTimeout, "Longest wait for the runtime's first answer to a chat request; past it the client gets 504. A request that arrives while the runtime restarts waits for it as long, then gets 503.")
	fs.DurationVar(&c.WedgeTimeout, "wedge-timeout", c.WedgeTimeout, "How long the model runtime may send nothing back for any request in flight, while a one-token probe gets no answer either, before it is taken for wedged: "+
		"a supervised runtime is then restarted (requests wait for it, and those it cut before their first token are sent again), another is reported degraded (/readyz 503) until it answers again. "+
		"A busy runtime is not wedged: it streams, or answers the probe on its spare slot (max_concurrent). Raise it where reading one batch of a prompt (512 tokens) takes the runtime more than half of it. 0: never (docs/runtime-wedge.md).")

	fs.IntVar(&c.MaxConcurrent, "max-concurrent", c.MaxConcurrent, "Generations that run at once: the model runtime's parallel slots hearthd uses, the rest of the requests waiting in hearthd's fair queue (max_queue). "+
		"A supervised Ollama is started with one slot more (OLLAMA_NUM_PARALLEL = max_concurrent + 1), the spare that the wedge probe uses; give an Ollama of your own that many too. Each slot holds a context of memory in the runtime. At least 1.")
	fs.IntVar(&c.MaxQueue, "max-queue", c.MaxQueue, "Requests that may wait for a generation slot; beyond that clients get 429. 0: no waiting.")
	fs.IntVar(&c.MaxConnsPerSource, "max-conns-per-source", c.MaxConnsPerSource, "Connections to the deployment API one IP address may hold open at once; more are closed at once, before anything is read. 0: no cap. "+
		"Clients behind one proxy or NAT count together: raise it (or set 0) for a proxy in front.")
	fs.IntVar(&c.MaxConcurrentPerKey, "max-concurrent-per-key", c.MaxConcurrentPerKey, "Generations one API key may run at once. 0: no cap beyond max_concurrent (slots are shared fairly across keys either way: a freed slot goes to the waiting key running the fewest).")
	fs.IntVar(&c.MaxBodyBytes, "max-body-bytes", c.MaxBodyBytes, "Largest request body in bytes; larger ones get 413. 0: 32 bytes per token of the model's context length, at least 1 MiB (a request with a bad API key may send none: it is refused before its body is read). Otherwise at least 1024.")
	fs.BoolVar(&c.Reasoning, "reasoning", c.Reasoning, "Let a reasoning model (one whose runtime lists the thinking capability) think before it answers: its thinking is sent apart from the answer, as reasoning_content, and counted as reasoning_tokens; reasoning_effort none turns it off per request. false: the model is asked not to think, and reasoning_effort other than none is a 400.")
	fs.IntVar(&c.MaxOutputTokens, "max-output-tokens", c.MaxOutputTokens, "Most tokens one generation may produce: a request asking for more (max_tokens or max_completion_tokens) gets 400 naming max_tokens, and one naming none is capped here too (the model's own num_predict applies when lower). 0: the model's context length. "+
		"Prompts certainly longer than the context (estimated at 8 bytes per token, an undercount) get 400 context_length_exceeded before the model sees them.")
	fs.DurationVar(&c.ReadTimeout, "read-timeout", c.ReadTimeout, "Time to read one request, including the TLS handshake: bounds slow clients.")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", c.IdleTimeout, "How long a keep-alive connection may sit idle between requests.")
	fs.DurationVar(&c.WriteStallTimeout, "write-stall-timeout", c.WriteStallTimeout, "Longest a single write to a client may block (a client that stopped reading); the generation is then stopped. Long streams are not cut.")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "On SIGTERM, how long in-flight requests may finish before they are ended.")

	fs.StringVar(&c.MetricsListen, "metrics-listen", c.MetricsListen, "Address of the Prometheus /metrics listener, separate from the public API port. Empty: no metrics.")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate chain (leaf first): the deployment API serves HTTPS (TLS 1.2+, AEAD cipher suites only; HTTP/1.1). Set together with tls_key. "+
		"The files are checked every few seconds and a renewed certificate is served to new connections without a restart; open connections are not dropped; a broken renewal is logged and the previous certificate kept.")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key for tls_cert.")
	fs.StringVar(&c.CORSAllowedOrigins, "cors-allowed-origins", c.CORSAllowedOrigins, "Origins whose browser pages may call the deployment API (CORS), comma-separated, each scheme://host[:port], or * for any; "+
		"preflights are answered and the answers readable, with X-Request-Id, Retry-After and the x-ratelimit-* headers exposed. Empty: none (a browser keeps every answer from other origins' pages).")
	fs.BoolVar(&c.AllowPlainHTTP, "allow-plain-http", c.AllowPlainHTTP, "Allow plain HTTP on a non-loopback listen address, e.g. behind a TLS-terminating proxy. Off: API keys never cross the network in the clear.")

	fs.StringVar(&c.ControlURL, "control-url", c.ControlURL, "Base URL (http or https) of the control plane this node joins, or a comma-separated list of its replicas' URLs (the node moves to the next when one cannot be reached). Empty: standalone node.")
	fs.StringVar(&c.EnrollmentToken, "enrollment-token", c.EnrollmentToken, "One-time secret the node enrolls with at control_url on first start. Never logged.")
	fs.StringVar(&c.ControlCAFile, "control-ca-file", c.ControlCAFile, "PEM file of the CA(s) that sign the control plane's certificate (a private CA), instead of the system's roots. Needs an https control_url.")
	fs.StringVar(&c.ControlCertSHA256, "control-cert-sha256", c.ControlCertSHA256, "Pinned SHA-256 fingerprint of the control plane's certificate (hex of its DER, colons allowed; several comma-separated, to roll over a renewal), as hearth-control enrollment-tokens create prints it. "+
		"Without control_ca_file a matching pin is the whole check (a self-signed certificate works); with it the CA check applies too. Needs an https control_url.")
	fs.StringVar(&c.NodeChip, "node-chip", c.NodeChip, "This node's chip, reported at enrollment.")
	fs.IntVar(&c.NodeRAM, "node-ram", c.NodeRAM, "This node's RAM in GB, reported at enrollment. Not negative.")
	fs.IntVar(&c.NodeStorage, "node-storage", c.NodeStorage, "This node's storage in GB, reported at enrollment. Not negative.")
	fs.BoolVar(&c.Firewall, "firewall", c.Firewall, "Enforce the deployment's firewall rules with nftables on this host. Off: the host firewall is never touched.")
	fs.StringVar(&c.SSHUser, "ssh-user", c.SSHUser, "Manage this user's ~/.ssh/authorized_keys from the deployment's SSH keys.")
	fs.StringVar(&c.AuthorizedKeysFile, "authorized-keys-file", c.AuthorizedKeysFile, "Manage this authorized_keys file instead of ssh_user's. Neither set: SSH keys are not managed.")
	fs.StringVar(&c.DesiredStateFile, "desired-state-file", c.DesiredStateFile, `Standalone mode (no control_url): enforce the firewall rules and SSH keys in this JSON file ({"firewall_rules":[…],"ssh_keys":[…]}), re-read when it changes; an invalid file leaves the last applied state in force.`)

	fs.IntVar(&c.MaxProcs, "max-procs", c.MaxProcs, "Processors that run hearthd's own code at once (Go's GOMAXPROCS). 0: a quarter of the CPUs hearthd may use, at least 1, unless the GOMAXPROCS environment variable says otherwise; the other CPUs are left to the model runtime. "+
		"A relay spread over more processors spends more CPU per token for the same streams; raise it when hearthd itself runs at max_procs cores busy.")

	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error (any case).")
	return &config.Loader{
		Program: "hearthd", Schema: fs,
		EnvPrefix: "HEARTH_", ConfigEnv: ConfigEnv, DefaultPath: DefaultConfigPath,
		// hearth-control's variables (hearthd's own HEARTH_CONTROL_URL is
		// matched as a setting first), the hearth CLI's, and those of the
		// build and test scripts (make run, ensure-ollama.sh, the test
		// matrix), which reach hearthd when it is started from them.
		ForeignEnv: []string{"HEARTH_CONTROL_", "HEARTH_URL", "HEARTH_TOKEN", "HEARTH_CONTEXT",
			"HEARTH_OLLAMA_BINS", "HEARTH_OLLAMA_CACHE", "HEARTH_PORT", "HEARTH_OLLAMA_PORT", "HEARTH_METRICS_PORT",
			"HEARTH_RUN_DIR", "HEARTH_BIN_DIR"},
	}
}

// corsPolicy is CORSAllowedOrigins parsed.
func (c Config) corsPolicy() (deployapi.CORSPolicy, error) {
	var list []string
	for o := range strings.SplitSeq(c.CORSAllowedOrigins, ",") {
		if o = strings.TrimSpace(o); o != "" {
			list = append(list, o)
		}
	}
	return deployapi.ParseCORSOrigins(list)
}

// Validate reports every invalid key, by its flag name.
func (c Config) Validate() error {
	var p config.Problems
	if p.HostPort("listen", c.Listen) {
		if host, _, _ := net.SplitHostPort(c.Listen); c.TLSCert == "" && !c.AllowPlainHTTP && !config.LoopbackHost(host) {
			p.Add("listen", "%q is not a loopback address, and plain HTTP there would carry API keys in the clear: set tls-cert and tls-key, or allow-plain-http (for example behind a TLS proxy)", c.Listen)
		}
	}
	if _, err := c.corsPolicy(); err != nil {
		p.Add("cors-allowed-origins", "%v", err)
	}
	if c.StateDir == "" {
		p.Add("state-dir", "must be set")
	}
	if c.Model == "" {
		p.Add("model", "must be set")
	}
	if !isHTTPURL(c.OllamaURL) {
		p.Add("ollama-url", "%q is not an http(s) URL", c.OllamaURL)
	}
	if c.OllamaStart && c.OllamaBin == "" {
		p.Add("ollama-bin", "must be set when ollama-start is on")
	}
	if c.MaxConcurrent < 1 {
		p.Add("max-concurrent", "must be at least 1, got %d", c.MaxConcurrent)
	}
	if c.WedgeTimeout != 0 && c.WedgeTimeout < time.Second {
		p.Add("wedge-timeout", "must be 0 (never) or at least 1s, got %s", c.WedgeTimeout)
	}
	if c.MaxQueue < 0 {
		p.Add("max-queue", "must not be negative, got %d", c.MaxQueue)
	}
	if c.MaxConnsPerSource < 0 {
		p.Add("max-conns-per-source", "must be 0 (no cap) or more, got %d", c.MaxConnsPerSource)
	}
	if c.MaxConcurrentPerKey < 0 {
		p.Add("max-concurrent-per-key", "must not be negative, got %d", c.MaxConcurrentPerKey)
	}
	if c.MaxBodyBytes != 0 && c.MaxBodyBytes < 1024 {
		p.Add("max-body-bytes", "must be 0 (from the context length) or at least 1024, got %d", c.MaxBodyBytes)
	}
	if c.MaxProcs < 0 {
		p.Add("max-procs", "must be 0 (chosen from the CPUs) or more, got %d", c.MaxProcs)
	}
	if c.MaxOutputTokens < 0 {
		p.Add("max-output-tokens", "must be 0 (the context length) or more, got %d", c.MaxOutputTokens)
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
			p.Add(d.key, "must be positive, got %s", d.v)
		}
	}
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		p.Add("tls-key", "must be set when tls-cert is")
	case c.TLSKey != "" && c.TLSCert == "":
		p.Add("tls-cert", "must be set when tls-key is")
	}
	if c.MetricsListen != "" { // "" disables metrics
		p.HostPort("metrics-listen", c.MetricsListen)
	}
	c.validateControl(&p)
	for _, n := range []struct {
		key string
		v   int
	}{{"node-ram", c.NodeRAM}, {"node-storage", c.NodeStorage}} {
		if n.v < 0 {
			p.Add(n.key, "must not be negative, got %d", n.v)
		}
	}
	p.LogLevel("log-level", c.LogLevel)
	return p.Err()
}

// validateControl checks the control plane link: an https URL, or plain
// http to loopback only, since the node sends its enrollment token and
// credential there; its certificate checks only with https.
func (c Config) validateControl(p *config.Problems) {
	if _, err := nodeapi.ParsePins(c.ControlCertSHA256); err != nil {
		p.Add("control-cert-sha256", "%v", err)
	}
	if c.ControlURL == "" {
		return
	}
	urls := nodeapi.SplitURLs(c.ControlURL)
	if len(urls) == 0 {
		p.Add("control-url", "%q names no URL", c.ControlURL)
		return
	}
	for _, one := range urls {
		if !isHTTPURL(one) {
			p.Add("control-url", "%q is not an http(s) URL", one)
			return
		}
	}
	if err := nodeapi.CheckURL(c.ControlURL); err != nil {
		p.Add("control-url", "%v", err)
	}
	for _, one := range urls {
		if u, _ := url.Parse(one); u.Scheme != "https" {
			for _, f := range [][2]string{{"control-ca-file", c.ControlCAFile}, {"control-cert-sha256", c.ControlCertSHA256}} {
				if f[1] != "" {
					p.Add(f[0], "needs an https control-url, got %q", one)
				}
			}
		}
	}
}

func isHTTPURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
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
