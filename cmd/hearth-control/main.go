// Command hearth-control is hearth's control plane: `hearth-control serve`
// runs the management API and the node protocol (over HTTPS with
// --tls-cert); the operator commands manage projects, management API
// tokens (printed once, stored hashed) and enrollment tokens, and list
// nodes, through the running server's admin socket or, when it is down,
// directly in the state directory.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hearthd/hearth/console"
	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/adminsock"
	"github.com/hearthd/hearth/internal/certreload"
	"github.com/hearthd/hearth/internal/command"
	"github.com/hearthd/hearth/internal/config"
	"github.com/hearthd/hearth/internal/connlimit"
	"github.com/hearthd/hearth/internal/statedir"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/systemd"
)

var version = "dev"

const usage = `hearth-control — the hearth control plane

Usage:
  hearth-control serve [flags]                                  serve the management API and node protocol
  hearth-control projects create --name N                       make a project; prints its ID
  hearth-control projects list [--json]                         list projects
  hearth-control tokens create --project P [--read-only] [--name N]
                                                                issue a management API token for project P (ID or name; printed once)
  hearth-control tokens list [--project P] [--json]             list tokens: ID, name, project, scope, created, last used (never secrets)
  hearth-control tokens revoke ID                               revoke a token; its next request is refused
  hearth-control enrollment-tokens create [--uses N] [--ttl D]  issue a node enrollment token (printed once)
  hearth-control nodes list                                     list enrolled nodes (JSON)
  hearth-control audit-log [--project P] [--since T] [--until T] [--limit N] [--json]
                                                                every project's (or P's) audit log, newest first (T: RFC 3339 or a duration ago, e.g. 24h)
  hearth-control migrate-store --database-url URL               copy the Pebble state (stopped control plane) into an empty PostgreSQL database
  hearth-control version                                        print the version
Every command takes --config (default /etc/hearth/control.toml if present), --state-dir, --admin-socket and --database-url
(with a database, the operator commands work on it directly).
A fresh state has one project, "default", which also holds everything made before projects existed.
`

func main() { program().Main() }

func program() command.Program {
	cmds := map[string]command.Func{
		"serve":         func(ctx context.Context, args []string, _, stderr io.Writer) error { return serve(ctx, args, stderr) },
		"migrate-store": migrateStore,
		"audit-log": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			return operate(ctx, "audit-log", auditLog, args, stdout, stderr)
		},
	}
	for noun, verbs := range operatorCommands {
		cmds[noun] = func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
			if len(args) == 0 || verbs[args[0]] == nil {
				fmt.Fprint(stderr, usage)
				return fmt.Errorf("usage: hearth-control %s %s", noun, strings.Join(slices.Sorted(maps.Keys(verbs)), "|"))
			}
			return operate(ctx, noun+" "+args[0], verbs[args[0]], args[1:], stdout, stderr)
		}
	}
	return command.Program{Name: "hearth-control", Usage: usage, Version: version, Commands: cmds}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return program().Run(ctx, args, stdout, stderr)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	cfg := defaults()
	ld := loader(&cfg)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ld.AddFlags(fs)
	res, err := ld.Load(fs, args, os.Environ())
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	level, _ := config.LogLevel(cfg.LogLevel) // checked by Validate
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	res.WarnUnknownEnv(logger)
	if tightened, err := statedir.Ensure(cfg.StateDir); err != nil {
		return err
	} else if tightened {
		logger.Warn("state dir was open to other users: tightened to 0700", "dir", cfg.StateDir)
	}
	st, err := openStore(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer st.Close()
	srv, err := control.New(control.Config{
		Store: st, DeploymentURLTemplate: cfg.DeploymentURLTemplate, ProvisionTimeout: cfg.ProvisionTimeout,
		NodeTimeout: cfg.NodeTimeout, DeleteTimeout: cfg.DeleteTimeout,
		UsageHourRetention: cfg.UsageHourRetention, UsageDayRetention: cfg.UsageDayRetention,
		RateLimit: cfg.RateLimit, RateBurst: cfg.RateBurst, NodeRateLimit: cfg.NodeRateLimit, NodeRateBurst: cfg.NodeRateBurst,
		Logger: logger,
	})
	if err != nil {
		return err
	}
	l, err := listenAPI(cfg, logger)
	if err != nil {
		return err
	}
	// Bounded connections: a flood of clients (or trickling bodies) cannot
	// take every descriptor of the process.
	l.ln = connlimit.New(l.ln, cfg.MaxConns, cfg.MaxConnsPerSource)
	ln := l.ln
	sock := cfg.adminSocketPath()
	aln, err := adminsock.Listen(sock)
	if err != nil {
		ln.Close()
		return err
	}

	mc, err := serveMetrics(ctx, cfg.MetricsListen, srv, logger)
	if err != nil {
		ln.Close()
		aln.Close()
		return err
	}
	apiHandler := mc.Middleware(srv.Handler())
	con, err := newConsole(srv, apiHandler, logger)
	if err != nil {
		ln.Close()
		aln.Close()
		return err
	}
	root := http.NewServeMux()
	root.Handle("/console/", con.Handler())
	root.Handle("/", apiHandler)
	admRoot := http.NewServeMux()
	admRoot.Handle("/console/", con.AdminHandler())
	admRoot.Handle("/", srv.AdminHandler())
	// The long-poll extends its own write deadline (control.Server).
	api := &http.Server{Handler: root, ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout: cfg.ReadTimeout, WriteTimeout: cfg.WriteTimeout, IdleTimeout: cfg.IdleTimeout,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	adm := &http.Server{Handler: admRoot, ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	go func() { errc <- l.serve(ctx, api) }()
	go func() { errc <- adm.Serve(aln) }()
	go func() { errc <- srv.Run(ctx) }()
	logger.Info("control plane serving", "listen", ln.Addr().String(), "url", l.scheme()+"://"+ln.Addr().String(),
		"console", l.scheme()+"://"+ln.Addr().String()+"/console/",
		"socket_activated", l.activated, "admin_socket", sock, "version", version)
	notifier := systemd.SdNotifier{}
	_ = notifier.Ready()
	_ = notifier.Status("serving the management API on " + ln.Addr().String())
	go func() {
		probe := systemd.HTTPProbe(l.scheme() + "://" + systemd.LoopbackAddr(ln.Addr()) + "/v1/openapi.json")
		if err := systemd.Watchdog(ctx, notifier, probe, logger); err != nil {
			logger.Error("watchdog stopped", "err", err)
		}
	}()

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	cancel()
	shutdownCtx, done := context.WithTimeout(context.Background(), 5*time.Second)
	defer done()
	// Long-polls end with their request contexts once Shutdown closes the
	// listeners; give in-flight changes time to commit.
	_ = adm.Shutdown(shutdownCtx)
	if err := api.Shutdown(shutdownCtx); err != nil {
		_ = api.Close()
	}
	logger.Info("control plane stopped")
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", serveErr)
	}
	return nil
}

// newConsole is the web console over the management API's handler: it
// signs users in with their tokens (authenticated as the API does) and
// acts through the API with them.
func newConsole(srv *control.Server, api http.Handler, logger *slog.Logger) (*console.Console, error) {
	return console.New(console.Config{API: api, Logger: logger.With("component", "console"),
		Identify: func(token string) (console.Identity, error) {
			id, err := srv.TokenIdentity(token)
			if errors.Is(err, control.ErrInvalidToken) {
				return console.Identity{}, console.ErrInvalidToken
			}
			if err != nil {
				return console.Identity{}, err
			}
			return console.Identity{Project: id.Project, ProjectName: id.ProjectName, ReadOnly: id.Scope == control.ScopeReadOnly}, nil
		}})
}

// serveMetrics registers the control plane's metrics and serves them on
// their own listener until ctx ends ("" addr: not served).
func serveMetrics(ctx context.Context, addr string, srv *control.Server, logger *slog.Logger) (*metrics.Control, error) {
	mc := metrics.NewControl(version)
	mc.RegisterNodesConnected(srv.NodesConnected)
	mc.RegisterServers(srv.ServersByStatus)
	mc.RegisterNodes(srv.NodesByState)
	srv.OnPropagation(mc.ObservePropagation)
	if addr == "" {
		return mc, nil
	}
	mln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	go func() {
		if err := metrics.ServeListener(ctx, mln, mc.Handler(), logger); err != nil {
			logger.Error("metrics listener stopped", "err", err)
		}
	}()
	return mc, nil
}

// apiListener is where the management API and node protocol are served,
// with the certificate when they are served over HTTPS.
type apiListener struct {
	ln        net.Listener
	activated bool
	certs     *certreload.Reloader // nil: plain HTTP
}

// listenAPI returns the management API's listener: the socket systemd
// passed (hearth-control.socket, FileDescriptorName=api) when
// socket-activated, else a listener of its own on cfg.Listen. The
// certificate is loaded first, so a bad one fails the start. Plain HTTP is
// refused on an address that is not loopback, whether configured or passed
// by systemd, unless allowed.
func listenAPI(cfg settings, logger *slog.Logger) (apiListener, error) {
	var l apiListener
	if cfg.TLSCert != "" {
		certs, err := certreload.New(cfg.TLSCert, cfg.TLSKey, logger)
		if err != nil {
			return l, fmt.Errorf("config tls-cert: %w", err)
		}
		l.certs = certs
		logger.Info("nodes may pin this certificate", "control_cert_sha256", nodeapi.CertSHA256(certs.Certificate().Raw))
	}
	socks, err := systemd.PassedSockets()
	if err != nil {
		return l, fmt.Errorf("socket activation: %w", err)
	}
	defer socks.Close()
	l.ln, l.activated, err = socks.Listen("api", cfg.Listen)
	if err != nil {
		return l, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	host, _, _ := net.SplitHostPort(l.ln.Addr().String())
	if l.certs == nil && !cfg.AllowPlainHTTP && !config.LoopbackHost(host) {
		l.ln.Close()
		return l, fmt.Errorf("config listen: the API socket %s is not on a loopback address, and plain HTTP there would carry API tokens and node credentials in the clear: set tls-cert and tls-key, or allow-plain-http", l.ln.Addr())
	}
	return l, nil
}

func (l apiListener) scheme() string {
	if l.certs != nil {
		return "https"
	}
	return "http"
}

// serve serves api on the listener until it is shut down; over TLS it
// picks up a renewed certificate until ctx ends.
func (l apiListener) serve(ctx context.Context, api *http.Server) error {
	if l.certs == nil {
		return api.Serve(l.ln)
	}
	go l.certs.Run(ctx, 0)
	api.TLSConfig = l.certs.TLSConfig("h2", "http/1.1")
	return api.ServeTLS(l.ln, "", "")
}
