package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	root.SetIn(s.in)
	root.SetOut(s.out)
	root.SetErr(s.err)
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
	return root
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
