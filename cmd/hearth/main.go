// Command hearth is the customer's command line for hearth's management
// API: servers, SSH keys, firewall rules and deployment API keys, in the
// style of hcloud and doctl. See the README's "Manage your deployments".
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], stdio{
		in: os.Stdin, out: os.Stdout, err: os.Stderr, getenv: os.Getenv,
		inTTY:  term.IsTerminal(int(os.Stdin.Fd())),
		outTTY: term.IsTerminal(int(os.Stdout.Fd())),
		errTTY: term.IsTerminal(int(os.Stderr.Fd())),
	})
	stop()
	os.Exit(code)
}
