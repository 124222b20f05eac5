// Package command is the one dispatcher of hearth's two daemon binaries
// (hearthd and hearth-control): a command by name, help, version, usage on
// a mistake, and main's signal handling and exit code. The customer CLI
// (`hearth`) is cobra's.
package command

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Func runs one command with the arguments after its name.
type Func func(ctx context.Context, args []string, stdout, stderr io.Writer) error

// Program is a binary's commands and what it says about itself.
type Program struct {
	Name     string // prefixes errors: "hearthd: …"
	Usage    string // printed for help, and before a usage error
	Version  string
	Commands map[string]Func
}

// Run runs the command args name. help and version are every program's.
func (p Program) Run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, p.Usage)
		return errors.New("missing command")
	}
	switch args[0] {
	case "version":
		fmt.Fprintln(stdout, p.Version)
		return nil
	case "-h", "--help", "help":
		fmt.Fprint(stdout, p.Usage)
		return nil
	}
	if f, ok := p.Commands[args[0]]; ok {
		return f(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprint(stderr, p.Usage)
	return fmt.Errorf("unknown command %q", args[0])
}

// Main runs the command line until it ends or SIGINT/SIGTERM cancels its
// context, and exits 2 on an error (flag.ErrHelp: help was printed already).
func (p Program) Main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := p.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, p.Name+":", err)
		}
		os.Exit(2)
	}
}
