// Command hearthd is the hearth node daemon: `hearthd serve` runs the
// deployment API in front of the local model runtime; `hearthd keys` manages
// the deployment's API keys.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/daemon"
	"github.com/hearthd/hearth/internal/command"
	"github.com/hearthd/hearth/internal/config"
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

func main() { program().Main() }

func program() command.Program {
	return command.Program{Name: "hearthd", Usage: usage, Version: version, Commands: map[string]command.Func{
		"serve": func(ctx context.Context, args []string, _, stderr io.Writer) error { return serve(ctx, args, stderr) },
		"keys":  keys,
	}}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return program().Run(ctx, args, stdout, stderr)
}

func serve(ctx context.Context, args []string, stderr io.Writer) error {
	cfg := daemon.Defaults()
	ld := daemon.ConfigLoader(&cfg)
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
	// The one validation of hearthd's configuration: daemon.Run trusts it.
	if err := cfg.Validate(); err != nil {
		return err
	}
	lvl, _ := config.LogLevel(cfg.LogLevel) // checked by Validate
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	res.WarnUnknownEnv(log)
	cpus := runtime.GOMAXPROCS(0)
	if n := cfg.Procs(cpus, os.Getenv("GOMAXPROCS")); n > 0 {
		runtime.GOMAXPROCS(n)
	}
	log.Info("processors", "gomaxprocs", runtime.GOMAXPROCS(0), "cpus", runtime.NumCPU())
	return daemon.Run(ctx, cfg, version, log)
}

func keys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	// --config, --state-dir and --admin-socket may stand anywhere, before
	// or after the subcommand; the rest is the key CLI's own. The state
	// directory and socket come from the same file and environment as
	// hearthd serve's.
	mine, rest, err := takeFlags(args, "config", "state-dir", "admin-socket")
	if err != nil {
		return err
	}
	cfg := daemon.Defaults()
	ld := daemon.ConfigLoader(&cfg)
	fs := flag.NewFlagSet("keys", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ld.AddFlags(fs, "state-dir", "admin-socket")
	if _, err := ld.Load(fs, mine, os.Environ()); err != nil {
		return err
	}
	return apikeys.RunCLI(ctx, rest, stdout, stderr, cfg.AdminSocketPath(), filepath.Join(cfg.StateDir, "db"))
}

// takeFlags splits the named flags (-name v, --name v, --name=v) from
// args, as --name=v, from the rest.
func takeFlags(args []string, names ...string) (taken, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || !slices.Contains(names, name) {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, nil, fmt.Errorf("flag --%s needs a value", name)
			}
			i++
			val = args[i]
		}
		taken = append(taken, "--"+name+"="+val)
	}
	return taken, rest, nil
}
