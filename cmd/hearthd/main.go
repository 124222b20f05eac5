// Command hearthd is the hearth node daemon: `hearthd serve` runs the
// deployment API in front of the local model runtime; `hearthd keys` manages
// the deployment's API keys.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/daemon"
)

// version is stamped at build time with -ldflags "-X main.version=…".
var version = "dev"

const usage = `hearthd — the hearth node daemon

Usage:
  hearthd serve [flags]                 serve the deployment API (see hearthd serve -h)
  hearthd keys create [--name N]        issue an API key (printed once)
  hearthd keys list                     list API keys and their usage
  hearthd keys revoke KEY_ID            revoke an API key at once
  hearthd version                       print the version
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "hearthd:", err)
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
	case "keys":
		return keys(ctx, args[1:], stdout, stderr)
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
	// Flags bind to a scratch Config; only those given on the command line
	// are applied, last: defaults < config file < HEARTH_* env < flags.
	flags := daemon.Defaults()
	cfg := &flags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	configPath := fs.String("config", "", "config file (default $HEARTH_CONFIG or "+daemon.DefaultConfigPath+" if present)")
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "deployment API address (host:port)")
	fs.StringVar(&cfg.StateDir, "state-dir", cfg.StateDir, "state directory (Pebble, admin socket)")
	fs.StringVar(&cfg.AdminSocket, "admin-socket", "", "admin unix socket (default STATE_DIR/admin.sock)")
	fs.StringVar(&cfg.Model, "model", cfg.Model, "the deployment's model (runtime name and API id)")
	fs.StringVar(&cfg.ModelGGUF, "model-gguf", "", "create the model from this local GGUF file if the runtime lacks it")
	fs.StringVar(&cfg.ModelTemplate, "model-template", "", "Ollama chat template file for --model-gguf")
	fs.Func("model-param", "Ollama parameter `key=value` for --model-gguf (repeatable)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want key=value, got %q", s)
		}
		if cfg.ModelParams == nil {
			cfg.ModelParams = map[string]any{}
		}
		cfg.ModelParams[k] = paramValue(v)
		return nil
	})
	fs.StringVar(&cfg.OllamaURL, "ollama-url", cfg.OllamaURL, "model runtime (Ollama) base URL")
	fs.BoolVar(&cfg.OllamaStart, "ollama-start", false, "start and supervise `ollama serve` on --ollama-url's address")
	fs.StringVar(&cfg.OllamaBin, "ollama-bin", cfg.OllamaBin, "ollama binary for --ollama-start")
	fs.StringVar(&cfg.OllamaModelsDir, "ollama-models-dir", "", "models directory for --ollama-start (default STATE_DIR/models)")
	fs.DurationVar(&cfg.RuntimeTimeout, "runtime-timeout", cfg.RuntimeTimeout, "wait for the runtime's first answer before 504")
	fs.IntVar(&cfg.MaxConcurrent, "max-concurrent", cfg.MaxConcurrent, "generations at once")
	fs.IntVar(&cfg.MaxQueue, "max-queue", cfg.MaxQueue, "requests that may wait for a generation slot (beyond: 429)")
	fs.IntVar(&cfg.MaxBodyBytes, "max-body-bytes", cfg.MaxBodyBytes, "largest request body (beyond: 413)")
	fs.DurationVar(&cfg.ReadTimeout, "read-timeout", cfg.ReadTimeout, "time to read one request")
	fs.DurationVar(&cfg.IdleTimeout, "idle-timeout", cfg.IdleTimeout, "keep-alive idle time")
	fs.DurationVar(&cfg.WriteStallTimeout, "write-stall-timeout", cfg.WriteStallTimeout, "longest a client may stall one write")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "drain time on SIGTERM")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "Prometheus metrics address (\"\" disables)")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM; re-read when renewed)")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "private key for --tls-cert")
	fs.BoolVar(&cfg.AllowPlainHTTP, "allow-plain-http", false, "allow plain HTTP on a non-loopback --listen")
	fs.StringVar(&cfg.ControlURL, "control-url", "", "control plane base URL (empty: standalone)")
	fs.StringVar(&cfg.EnrollmentToken, "enrollment-token", "", "token to enroll with the control plane (first start)")
	fs.StringVar(&cfg.NodeChip, "node-chip", "", "this node's chip, reported at enrollment")
	fs.IntVar(&cfg.NodeRAM, "node-ram", 0, "this node's RAM in GB, reported at enrollment")
	fs.IntVar(&cfg.NodeStorage, "node-storage", 0, "this node's storage in GB, reported at enrollment")
	fs.BoolVar(&cfg.Firewall, "firewall", false, "enforce firewall rules with nftables on this host")
	fs.StringVar(&cfg.SSHUser, "ssh-user", "", "manage this user's ~/.ssh/authorized_keys")
	fs.StringVar(&cfg.AuthorizedKeysFile, "authorized-keys-file", "", "manage this authorized_keys file instead")
	fs.StringVar(&cfg.DesiredStateFile, "desired-state-file", "", "standalone: enforce firewall rules and SSH keys from this JSON file")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("serve: unexpected argument %q", fs.Arg(0))
	}
	final := daemon.Defaults()
	path, explicit := *configPath, true
	if path == "" {
		path = os.Getenv(daemon.ConfigEnv)
	}
	if path == "" {
		path, explicit = daemon.DefaultConfigPath, false
	}
	if err := daemon.LoadFile(path, &final); err != nil && (explicit || !errors.Is(err, iofs.ErrNotExist)) {
		return err
	}
	unknownEnv, err := daemon.ApplyEnv(os.Environ(), &final)
	if err != nil {
		return err
	}
	daemon.ApplyFlags(fs, flags, &final)

	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(strings.ToLower(final.LogLevel))); err != nil {
		return fmt.Errorf("config log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	for _, name := range unknownEnv {
		log.Warn("unknown HEARTH_ environment variable ignored", "name", name)
	}
	return daemon.Run(ctx, final, version, log)
}

// paramValue types an Ollama parameter value: integer, float, bool or text.
func paramValue(v string) any {
	if i, err := strconv.ParseInt(v, 10, 64); err == nil {
		return i
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return f
	}
	if b, err := strconv.ParseBool(v); err == nil {
		return b
	}
	return v
}

func keys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// --state-dir and --admin-socket may stand anywhere, before or after
	// the subcommand; the rest is the key CLI's own.
	cfg := daemon.Defaults()
	rest, err := takeFlags(args, map[string]*string{"state-dir": &cfg.StateDir, "admin-socket": &cfg.AdminSocket})
	if err != nil {
		return err
	}
	return apikeys.RunCLI(ctx, rest, stdout, stderr, cfg.AdminSocketPath(), filepath.Join(cfg.StateDir, "db"))
}

// takeFlags removes the named string flags (-name v, --name v, --name=v)
// from args, storing their values.
func takeFlags(args []string, flags map[string]*string) ([]string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		dst, ok := flags[name]
		if !ok || !strings.HasPrefix(a, "-") {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			val = args[i]
		}
		*dst = val
	}
	return rest, nil
}
