// Command hearth-control is hearth's control plane: `hearth-control serve`
// runs the management API and the node protocol; `tokens create` and
// `enrollment-tokens create` issue credentials (printed once, stored
// hashed), through the running server's admin socket or, when it is down,
// directly in the state directory.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pelletier/go-toml/v2"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/systemd"
)

var version = "dev"

const usage = `hearth-control — the hearth control plane

Usage:
  hearth-control serve [flags]                                  serve the management API and node protocol
  hearth-control tokens create [--name N]                       issue a management API token (printed once)
  hearth-control enrollment-tokens create [--uses N] [--ttl D]  issue a node enrollment token (printed once)
  hearth-control nodes list                                     list enrolled nodes (JSON)
  hearth-control version                                        print the version
Every command takes --state-dir (default /var/lib/hearth-control).
`

const defaultStateDir = "/var/lib/hearth-control"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "hearth-control:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("missing command")
	}
	switch args[0] {
	case "serve":
		return serve(ctx, args[1:], stderr)
	case "tokens", "enrollment-tokens", "nodes":
		want := "create"
		if args[0] == "nodes" {
			want = "list"
		}
		if len(args) < 2 || args[1] != want {
			fmt.Fprint(stderr, usage)
			return fmt.Errorf("usage: hearth-control %s %s", args[0], want)
		}
		return admin(ctx, args[0], args[2:], stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, version)
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprint(stderr, usage)
	return fmt.Errorf("unknown command %q", args[0])
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8400", "management API and node protocol address (host:port)")
	stateDir := fs.String("state-dir", defaultStateDir, "state directory (Pebble database, admin socket)")
	adminSocket := fs.String("admin-socket", "", "admin unix socket (default STATE_DIR/admin.sock)")
	urlTemplate := fs.String("public-deployment-url-template", "https://{name}.hearth.local/api/v1",
		"public URL of a deployment; {id} and {name} are replaced")
	provisionTimeout := fs.Duration("provision-timeout", 10*time.Minute, "time a server may stay provisioning before it is failed")
	rateLimit := fs.Float64("rate-limit", 20, "requests per second per API token (token bucket refill)")
	rateBurst := fs.Int("rate-burst", 40, "token bucket size per API token")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	metricsListen := fs.String("metrics-listen", metrics.DefaultControlAddr, "Prometheus metrics address (\"\" disables)")
	configPath := fs.String("config", "", "TOML config file; its keys are the flag names with _ for - (flags win)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *configPath != "" {
		if err := applyConfigFile(fs, *configPath); err != nil {
			return err
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := os.MkdirAll(*stateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	st, err := store.Open(filepath.Join(*stateDir, "db"), store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	srv, err := control.New(control.Config{
		Store: st, DeploymentURLTemplate: *urlTemplate, ProvisionTimeout: *provisionTimeout,
		RateLimit: *rateLimit, RateBurst: *rateBurst, Logger: logger,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", *listen, err)
	}
	sock := *adminSocket
	if sock == "" {
		sock = filepath.Join(*stateDir, "admin.sock")
	}
	aln, err := control.ListenAdmin(sock)
	if err != nil {
		ln.Close()
		return err
	}
	defer os.Remove(sock)

	mc := metrics.NewControl(version)
	mc.RegisterNodesConnected(srv.NodesConnected)
	mc.RegisterServers(srv.ServersByStatus)
	if *metricsListen != "" {
		mln, err := net.Listen("tcp", *metricsListen)
		if err != nil {
			ln.Close()
			aln.Close()
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		go func() {
			if err := metrics.ServeListener(ctx, mln, mc.Handler(), logger); err != nil {
				logger.Error("metrics listener stopped", "err", err)
			}
		}()
	}
	api := &http.Server{Handler: mc.Middleware(srv.Handler()), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	adm := &http.Server{Handler: srv.AdminHandler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	go func() { errc <- api.Serve(ln) }()
	go func() { errc <- adm.Serve(aln) }()
	go func() { errc <- srv.Run(ctx) }()
	logger.Info("control plane serving", "listen", ln.Addr().String(), "admin_socket", sock, "version", version)
	notifier := systemd.SdNotifier{}
	_ = notifier.Ready()
	_ = notifier.Status("serving the management API on " + ln.Addr().String())
	go func() {
		probe := systemd.HTTPProbe("http://" + systemd.LoopbackAddr(ln.Addr()) + "/v1/openapi.json")
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

// admin runs a credential or inspection command: through the running
// server's admin socket if there is one, otherwise on the store directly
// (Pebble allows one process, so one of the two is always the only writer).
func admin(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	stateDir := fs.String("state-dir", defaultStateDir, "state directory of the control plane")
	adminSocket := fs.String("admin-socket", "", "admin unix socket (default STATE_DIR/admin.sock)")
	name := fs.String("name", "default", "token name (tokens create)")
	uses := fs.Int("uses", 1, "how many nodes may enroll with the token (enrollment-tokens create)")
	ttl := fs.Duration("ttl", 24*time.Hour, "lifetime of the token (enrollment-tokens create)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sock := *adminSocket
	if sock == "" {
		sock = filepath.Join(*stateDir, "admin.sock")
	}
	var (
		out    any
		method = http.MethodPost
		path   string
		body   any
	)
	switch cmd {
	case "tokens":
		path, body, out = "/admin/tokens", control.AdminTokenRequest{Name: *name}, &control.NewAPIToken{}
	case "enrollment-tokens":
		path, body, out = "/admin/enrollment-tokens", control.AdminEnrollmentRequest{Uses: *uses, TTLSeconds: ttl.Seconds()}, &control.NewEnrollmentToken{}
	case "nodes":
		method, path, out = http.MethodGet, "/admin/nodes", &[]control.NodeInfo{}
	}
	err := control.AdminCall(ctx, sock, method, path, body, out)
	if errors.Is(err, control.ErrAdminUnavailable) {
		err = offline(cmd, *stateDir, *name, *uses, *ttl, out)
	}
	if err != nil {
		return err
	}
	switch v := out.(type) {
	case *control.NewAPIToken:
		fmt.Fprintf(stderr, "API token %s (%s) created; it is shown only once:\n", v.ID, v.Name)
		fmt.Fprintln(stdout, v.Token)
	case *control.NewEnrollmentToken:
		fmt.Fprintf(stderr, "enrollment token %s created for %d node(s), valid until %s; it is shown only once:\n",
			v.ID, v.Uses, v.ExpiresAt.Format(time.RFC3339))
		fmt.Fprintln(stdout, v.Token)
	default:
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return nil
}

func offline(cmd, stateDir, name string, uses int, ttl time.Duration, out any) error {
	st, err := store.Open(filepath.Join(stateDir, "db"), store.Options{})
	if err != nil {
		return fmt.Errorf("control plane not running and its state is unavailable: %w", err)
	}
	defer st.Close()
	now := time.Now()
	switch cmd {
	case "tokens":
		t, err := control.CreateAPIToken(st, name, now)
		*out.(*control.NewAPIToken) = t
		return err
	case "enrollment-tokens":
		t, err := control.CreateEnrollmentToken(st, uses, ttl, now)
		*out.(*control.NewEnrollmentToken) = t
		return err
	default:
		nodes, err := control.ListNodes(st)
		*out.(*[]control.NodeInfo) = nodes
		return err
	}
}

// applyConfigFile sets every flag not given on the command line from the
// TOML file at path, whose keys are the flag names with "_" for "-". An
// unknown key is an error naming it.
func applyConfigFile(fs *flag.FlagSet, path string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("config file: %w", err)
	}
	var kv map[string]any
	if err := toml.Unmarshal(data, &kv); err != nil {
		return fmt.Errorf("config file %s: %w", path, err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for key, v := range kv {
		name := strings.ReplaceAll(key, "_", "-")
		if fs.Lookup(name) == nil || name == "config" {
			return fmt.Errorf("config file %s: unknown key %q", path, key)
		}
		if given[name] {
			continue
		}
		if err := fs.Set(name, fmt.Sprint(v)); err != nil {
			return fmt.Errorf("config %s: %w", key, err)
		}
	}
	return nil
}
