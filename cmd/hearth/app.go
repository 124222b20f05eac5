package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

// stdio is the process's surroundings, passed in so that tests run the CLI
// in-process.
type stdio struct {
	in             io.Reader
	out, err       io.Writer
	getenv         func(string) string
	inTTY          bool // stdin is a terminal: a token can be prompted for without echo
	outTTY, errTTY bool // tables by default; a progress line redrawn in place
}

// app is one run of the CLI: its surroundings and global flags.
type app struct {
	stdio
	ctx context.Context
	now func() time.Time

	output      string // --output
	contextName string // --context
	configFlag  string // --config
}

// run executes the command line args and returns the exit code.
func run(ctx context.Context, args []string, s stdio) int {
	a := &app{stdio: s, ctx: ctx, now: time.Now}
	root := a.rootCommand()
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	code := exitCode(err)
	if err != nil {
		a.printError(err, code)
	}
	return code
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "hearth",
		Short: "Manage your hearth deployments: servers, SSH keys, firewall rules, API keys, usage, actions, audit log",
		Long: `hearth manages the servers you rent from a hearth control plane.

It connects with HEARTH_URL and HEARTH_TOKEN, or with a context of its
configuration file (hearth context create). Output is a table on a terminal
and JSON otherwise (--output). Exit codes: 0 ok, 1 error, 2 usage, 3 not
found, 4 unauthorized or forbidden, 5 conflict, 6 rate limited or
unavailable, 7 the server failed (--wait), 8 --wait-timeout passed.`,
		Version:       version,
		SilenceErrors: true,
		SilenceUsage:  true,
	}
	// Before the completion command is added: it takes its output then.
	root.SetIn(a.in)
	root.SetOut(a.out)
	root.SetErr(a.err)
	pf := root.PersistentFlags()
	pf.StringVarP(&a.output, "output", "o", "", "output format: table or json (default: table on a terminal, else json)")
	pf.StringVar(&a.contextName, "context", "", "use this context of the configuration file (default: HEARTH_CONTEXT, HEARTH_URL/HEARTH_TOKEN, or the current context)")
	pf.StringVar(&a.configFlag, "config", "", "configuration file (default: HEARTH_CONFIG, or $XDG_CONFIG_HOME/hearth/config.toml)")
	must(root.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"table", "json"}, cobra.ShellCompDirectiveNoFileComp)))
	must(root.RegisterFlagCompletionFunc("context", a.completeContexts))
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if a.output != "" && a.output != "table" && a.output != "json" {
			return usagef(fmt.Sprintf("--output must be table or json, not %q", a.output))
		}
		return nil
	}
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usagef(err.Error() + "\nRun '" + c.CommandPath() + " --help' for usage.")
	})
	root.AddCommand(a.serverCommand(), a.sshKeyCommand(), a.firewallRuleCommand(), a.apiKeyCommand(), a.usageCommand(),
		a.actionCommand(), a.auditLogCommand(), a.contextCommand())
	// Added now rather than when the command line runs, so that
	// refuseUnknown covers them.
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	refuseUnknown(root)
	return root
}

// refuseUnknown makes every command below root refuse what it does not
// know, a usage error (exit 2): cobra checks the root's subcommands only,
// and shows the help of a group (hearth server) and exits 0 whatever
// follows it, and so does its help command for an unknown topic.
func refuseUnknown(root *cobra.Command) {
	for _, c := range root.Commands() {
		refuseUnknown(c)
		switch {
		case c.Name() == "help" && c.Run != nil:
			help := c.Run
			c.Run = nil
			c.RunE = func(c *cobra.Command, args []string) error {
				if target, rest, err := c.Root().Find(args); err != nil || target == nil || len(rest) > 0 {
					return usagef(fmt.Sprintf("unknown help topic %q\nRun '%s --help' for usage.", strings.Join(args, " "), c.Root().Name()))
				}
				help(c, args)
				return nil
			}
		case c.HasSubCommands() && !c.Runnable():
			c.Args = unknownSubcommand
			c.SuggestionsMinimumDistance = 2 // cobra's default for the root
			c.RunE = func(c *cobra.Command, _ []string) error { return c.Help() }
		}
	}
}

// unknownSubcommand refuses any argument to a group of commands, naming
// the nearest subcommands.
func unknownSubcommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
	if near := c.SuggestionsFor(args[0]); len(near) > 0 {
		msg += "\n\nDid you mean this?\n\t" + strings.Join(near, "\n\t")
	}
	return usagef(msg + "\nRun '" + c.CommandPath() + " --help' for usage.")
}

func must(err error) {
	if err != nil {
		panic(err) // a flag name typo: a bug, found by any test
	}
}

// runE wraps a command's own code: its errors are the command's, not the
// command line's (see exitCode).
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		if err := f(cmd, args); err != nil {
			return runError{err: err}
		}
		return nil
	}
}

// json reports whether output is JSON.
func (a *app) json() bool {
	if a.output == "" {
		return !a.outTTY
	}
	return a.output == "json"
}

// printJSON writes v as indented JSON.
func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *app) warn(msg string) { fmt.Fprintln(a.err, "hearth: warning:", msg) }

// config loads the configuration file.
func (a *app) config() (configFile, string, error) {
	path, err := configPath(a.configFlag, a.getenv)
	if err != nil {
		return configFile{}, "", err
	}
	cfg, err := loadConfig(path, a.warn)
	return cfg, path, err
}

// client connects to the control plane the flags, environment and
// configuration name.
func (a *app) client() (*client.Client, error) {
	cfg, _, err := a.config()
	if err != nil {
		return nil, err
	}
	conn, err := resolveConnection(cfg, a.contextName, a.getenv)
	if err != nil {
		return nil, err
	}
	c, err := conn.client(client.WithUserAgent("hearth-cli/" + version))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", conn.source, err)
	}
	return c, nil
}

// printError writes the error a command ended with to stderr: the API's
// message, code, param and request ID; as JSON with --output json.
func (a *app) printError(err error, code int) {
	var api client.APIError
	isAPI := errors.As(err, &api)
	if a.json() {
		e := map[string]any{"message": err.Error(), "exit_code": code}
		if isAPI {
			e["message"], e["status"], e["code"], e["request_id"] = api.Message, api.StatusCode, api.Code, api.RequestID
			e["param"] = nil
			if api.Param != "" {
				e["param"] = api.Param
			}
		}
		enc := json.NewEncoder(a.err)
		_ = enc.Encode(map[string]any{"error": e})
		return
	}
	if !isAPI {
		fmt.Fprintln(a.err, "Error:", err)
		return
	}
	fmt.Fprintln(a.err, "Error:", api.Message)
	detail := fmt.Sprintf("  HTTP %d", api.StatusCode)
	if api.Code != "" {
		detail += " " + api.Code
	}
	if api.Param != "" {
		detail += ", param: " + api.Param
	}
	if api.RequestID != "" {
		detail += ", request id: " + api.RequestID
	}
	fmt.Fprintln(a.err, detail)
}
