package main

import (
	"flag"
	"net"
	"path/filepath"
	"time"

	"github.com/hearthd/hearth/internal/config"
	"github.com/hearthd/hearth/metrics"
)

// defaultConfigPath is where hearth-control looks for its configuration
// file.
const defaultConfigPath = "/etc/hearth/control.toml"

// settings is everything hearth-control reads from its flags, its
// HEARTH_CONTROL_* environment and its TOML file (see control/CONFIG.md).
type settings struct {
	Listen                string
	StateDir              string
	DatabaseURL           string
	AdminSocket           string
	DeploymentURLTemplate string
	ProvisionTimeout      time.Duration
	NodeTimeout           time.Duration
	DeleteTimeout         time.Duration
	UsageHourRetention    time.Duration
	UsageDayRetention     time.Duration
	RateLimit             float64
	RateBurst             int
	NodeRateLimit         float64
	NodeRateBurst         int
	ReadTimeout           time.Duration
	WriteTimeout          time.Duration
	IdleTimeout           time.Duration
	MaxConns              int
	MaxConnsPerSource     int
	MetricsListen         string
	TLSCert               string
	TLSKey                string
	AllowPlainHTTP        bool
	LogLevel              string
}

func defaults() settings {
	return settings{
		Listen:                "127.0.0.1:8400",
		StateDir:              "/var/lib/hearth-control",
		DeploymentURLTemplate: "https://{name}.hearth.local/api/v1",
		ProvisionTimeout:      10 * time.Minute,
		NodeTimeout:           90 * time.Second,
		DeleteTimeout:         5 * time.Minute,
		UsageHourRetention:    14 * 24 * time.Hour,
		UsageDayRetention:     400 * 24 * time.Hour,
		RateLimit:             20,
		RateBurst:             40,
		NodeRateLimit:         10,
		NodeRateBurst:         40,
		ReadTimeout:           30 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           2 * time.Minute,
		MaxConns:              10000,
		MaxConnsPerSource:     256,
		MetricsListen:         metrics.DefaultControlAddr,
		LogLevel:              "info",
	}
}

// loader returns the loader of hearth-control's settings into s, whose
// values are the defaults. Its variables are HEARTH_CONTROL_*, not
// HEARTH_*: hearthd may run on the same host, and HEARTH_LISTEN meant for
// it must not move the control plane.
func loader(s *settings) *config.Loader {
	fs := flag.NewFlagSet("hearth-control", flag.ContinueOnError)
	fs.StringVar(&s.Listen, "listen", s.Listen, "Address (host:port) of the management API (/v1) and the node protocol. Plain HTTP is only allowed on a loopback address unless allow_plain_http is set; anywhere else set tls_cert and tls_key.")
	fs.StringVar(&s.StateDir, "state-dir", s.StateDir, "Directory of the control plane's state: the Pebble database (servers, SSH keys, firewall rules, tokens) and, by default, the admin socket.")
	fs.StringVar(&s.DatabaseURL, "database-url", s.DatabaseURL, "PostgreSQL database to keep the state in instead of the embedded Pebble one (postgres://user:password@host:port/db?sslmode=verify-full); every replica of the control plane names the same one. "+
		"The operator commands then work on the database directly. Give it in the config file or the environment, not on a command line other users can read.")
	fs.StringVar(&s.AdminSocket, "admin-socket", s.AdminSocket, "Unix socket the tokens, enrollment-tokens and nodes commands talk to. Empty: admin.sock in state_dir.")
	fs.StringVar(&s.DeploymentURLTemplate, "public-deployment-url-template", s.DeploymentURLTemplate, "Public URL of a deployment, reported to customers; {id}, {name} and {project} are replaced by the server's ID, name and project name. "+
		"Server names are unique per project only: with several projects use {id} or {project} too, or two projects' servers of one name share a URL.")
	fs.DurationVar(&s.ProvisionTimeout, "provision-timeout", s.ProvisionTimeout, "Time a server may stay provisioning, or updating after a model change, before it is marked failed.")
	fs.DurationVar(&s.NodeTimeout, "node-timeout", s.NodeTimeout, "Time a node may stay silent before its server shows as unreachable.")
	fs.DurationVar(&s.DeleteTimeout, "delete-timeout", s.DeleteTimeout, "Time a server stays deleting when its node does not report the wipe; then the server is removed and the node stays out of the pool until it reports the wipe.")
	fs.DurationVar(&s.UsageHourRetention, "usage-hour-retention", s.UsageHourRetention, "How long usage is kept by the hour (GET /v1/usage?granularity=hour); older hours are deleted.")
	fs.DurationVar(&s.UsageDayRetention, "usage-day-retention", s.UsageDayRetention, "How long usage is kept by the day; older days are deleted. At least usage_hour_retention.")
	fs.Float64Var(&s.RateLimit, "rate-limit", s.RateLimit, "Management API requests per second per API token (token bucket refill); beyond it clients get 429. Positive.")
	fs.IntVar(&s.RateBurst, "rate-burst", s.RateBurst, "Token bucket size per API token: requests that may come at once. At least 1.")
	fs.Float64Var(&s.NodeRateLimit, "node-rate-limit", s.NodeRateLimit, "Node protocol requests (long-polls and reports) per second per node; beyond it the node gets 429 and backs off. Those a change of the node's desired state causes are not counted. Positive.")
	fs.IntVar(&s.NodeRateBurst, "node-rate-burst", s.NodeRateBurst, "Token bucket size per node. At least 1.")
	fs.DurationVar(&s.ReadTimeout, "read-timeout", s.ReadTimeout, "Time a client has to send a whole request, headers and body; a slower one is cut off.")
	fs.DurationVar(&s.WriteTimeout, "write-timeout", s.WriteTimeout, "Time to write an answer; a node's long-poll gets its wait on top.")
	fs.DurationVar(&s.IdleTimeout, "idle-timeout", s.IdleTimeout, "Time an idle keep-alive connection stays open.")
	fs.IntVar(&s.MaxConns, "max-conns", s.MaxConns, "Connections open at once in all; beyond it new ones wait to be accepted. 0: no cap.")
	fs.IntVar(&s.MaxConnsPerSource, "max-conns-per-source", s.MaxConnsPerSource, "Connections open at once from one IP address; more are closed at once. 0: no cap. Nodes behind one NAT count together.")
	fs.StringVar(&s.MetricsListen, "metrics-listen", s.MetricsListen, "Address of the Prometheus /metrics listener. Empty: no metrics.")
	fs.StringVar(&s.TLSCert, "tls-cert", s.TLSCert, "PEM certificate chain (leaf first): the management API and node protocol are served over HTTPS (TLS 1.2+, AEAD cipher suites only; HTTP/2 and HTTP/1.1). Set together with tls_key. "+
		"The files are checked every few seconds and a renewed certificate is served to new connections without a restart; a broken renewal is logged and the previous certificate kept. Nodes verify it with control_ca_file or control_cert_sha256.")
	fs.StringVar(&s.TLSKey, "tls-key", s.TLSKey, "PEM private key for tls_cert.")
	fs.BoolVar(&s.AllowPlainHTTP, "allow-plain-http", s.AllowPlainHTTP, "Allow plain HTTP on a non-loopback address, e.g. behind a TLS-terminating proxy. Off: API tokens and node credentials never cross the network in the clear.")
	fs.StringVar(&s.LogLevel, "log-level", s.LogLevel, "debug, info, warn or error (any case).")
	return &config.Loader{
		Program: "hearth-control", Schema: fs,
		EnvPrefix: "HEARTH_CONTROL_", ConfigEnv: "HEARTH_CONTROL_CONFIG", DefaultPath: defaultConfigPath,
		// hearthd's control_url, control_ca_file and control_cert_sha256.
		ForeignEnv: []string{"HEARTH_CONTROL_URL", "HEARTH_CONTROL_CA_FILE", "HEARTH_CONTROL_CERT_SHA256"},
	}
}

// Validate reports every invalid key, by its flag name.
func (s settings) Validate() error {
	var p config.Problems
	if p.HostPort("listen", s.Listen) {
		if host, _, _ := net.SplitHostPort(s.Listen); s.TLSCert == "" && !s.AllowPlainHTTP && !config.LoopbackHost(host) {
			p.Add("listen", "%q is not a loopback address, and plain HTTP there would carry API tokens and node credentials in the clear: set tls-cert and tls-key, or allow-plain-http (for example behind a TLS proxy)", s.Listen)
		}
	}
	switch {
	case s.TLSCert != "" && s.TLSKey == "":
		p.Add("tls-key", "must be set when tls-cert is")
	case s.TLSKey != "" && s.TLSCert == "":
		p.Add("tls-cert", "must be set when tls-key is")
	}
	if s.StateDir == "" {
		p.Add("state-dir", "must be set")
	}
	if s.DeploymentURLTemplate == "" {
		p.Add("public-deployment-url-template", "must be set")
	}
	if s.ProvisionTimeout <= 0 {
		p.Add("provision-timeout", "must be positive, got %s", s.ProvisionTimeout)
	}
	if s.NodeTimeout <= 0 {
		p.Add("node-timeout", "must be positive, got %s", s.NodeTimeout)
	}
	if s.DeleteTimeout <= 0 {
		p.Add("delete-timeout", "must be positive, got %s", s.DeleteTimeout)
	}
	if s.UsageHourRetention < time.Hour {
		p.Add("usage-hour-retention", "must be at least 1h, got %s", s.UsageHourRetention)
	}
	if s.UsageDayRetention < 24*time.Hour || s.UsageDayRetention < s.UsageHourRetention {
		p.Add("usage-day-retention", "must be at least 24h and at least usage-hour-retention, got %s", s.UsageDayRetention)
	}
	if !(s.RateLimit > 0) { // also NaN
		p.Add("rate-limit", "must be positive, got %v", s.RateLimit)
	}
	if s.RateBurst < 1 {
		p.Add("rate-burst", "must be at least 1, got %d", s.RateBurst)
	}
	if !(s.NodeRateLimit > 0) {
		p.Add("node-rate-limit", "must be positive, got %v", s.NodeRateLimit)
	}
	if s.NodeRateBurst < 1 {
		p.Add("node-rate-burst", "must be at least 1, got %d", s.NodeRateBurst)
	}
	for name, d := range map[string]time.Duration{"read-timeout": s.ReadTimeout, "write-timeout": s.WriteTimeout, "idle-timeout": s.IdleTimeout} {
		if d <= 0 {
			p.Add(name, "must be positive, got %s", d)
		}
	}
	if s.MaxConns < 0 {
		p.Add("max-conns", "must be 0 (no cap) or more, got %d", s.MaxConns)
	}
	if s.MaxConnsPerSource < 0 {
		p.Add("max-conns-per-source", "must be 0 (no cap) or more, got %d", s.MaxConnsPerSource)
	}
	if s.MetricsListen != "" { // "" disables metrics
		p.HostPort("metrics-listen", s.MetricsListen)
	}
	p.LogLevel("log-level", s.LogLevel)
	return p.Err()
}

// adminSocketPath is AdminSocket or its default under StateDir.
func (s settings) adminSocketPath() string {
	if s.AdminSocket != "" {
		return s.AdminSocket
	}
	return filepath.Join(s.StateDir, "admin.sock")
}
