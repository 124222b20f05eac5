package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/hearthd/hearth/client"
)

func (a *app) contextCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "context", Aliases: []string{"contexts"}, Short: "Manage named contexts: a control plane URL and your token there"}
	cmd.AddCommand(a.contextCreate(), a.contextUse(), a.contextList(), a.contextDelete())
	return cmd
}

func (a *app) contextCreate() *cobra.Command {
	var c contextConfig
	cmd := &cobra.Command{
		Use:   "create NAME --url URL [--ca-file FILE]",
		Short: "Create a context and make it current; the token is read from HEARTH_TOKEN or stdin",
		Long: `Create a context and make it the current one. The token is taken from
HEARTH_TOKEN if set, else prompted for on a terminal (without echo) or read
as one line from stdin. It is stored in the configuration file (mode 0600)
and never printed.`,
		Example: `  hearth context create prod --url https://control.example.com
  hearth-control tokens create --name laptop | hearth context create dev --url http://127.0.0.1:8400`,
		Args: cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if !contextNameRe.MatchString(name) {
				return usagef("a context name is 1 to 64 letters, digits, '.', '_' or '-'")
			}
			if c.CAFile != "" {
				abs, err := filepath.Abs(c.CAFile)
				if err != nil {
					return err
				}
				c.CAFile = abs
			}
			if _, err := c.client(); err != nil { // the URL and CA file are usable
				return usagef(err.Error())
			}
			cfg, path, err := a.config()
			if err != nil {
				return err
			}
			if _, ok := cfg.Contexts[name]; ok {
				return fmt.Errorf("context %q already exists: delete it first", name)
			}
			if c.Token, err = a.readToken(name); err != nil {
				return err
			}
			if cfg.Contexts == nil {
				cfg.Contexts = map[string]contextConfig{}
			}
			cfg.Contexts[name], cfg.CurrentContext = c, name
			if err := cfg.save(path); err != nil {
				return err
			}
			a.say("Context %s created and now current (%s).", name, path)
			return nil
		}),
	}
	cmd.Flags().StringVar(&c.URL, "url", "", "the control plane, e.g. https://control.example.com")
	cmd.Flags().StringVar(&c.CAFile, "ca-file", "", "trust the PEM certificates in this file for the control plane's TLS")
	cmd.Flags().BoolVar(&c.AllowPlainHTTP, "allow-plain-http", false, "allow plain HTTP to a host other than loopback (the token crosses the network in the clear)")
	must(cmd.MarkFlagRequired("url"))
	return cmd
}

// client returns a client with the context's settings.
func (c contextConfig) client(extra ...client.Option) (*client.Client, error) {
	opts := append([]client.Option{client.WithToken(c.Token)}, extra...)
	if c.CAFile != "" {
		opts = append(opts, client.WithCAFile(c.CAFile))
	}
	if c.AllowPlainHTTP {
		opts = append(opts, client.WithAllowPlainHTTP())
	}
	return client.New(c.URL, opts...)
}

// readToken takes the token from HEARTH_TOKEN, a prompt without echo on a
// terminal, or the first line of stdin.
func (a *app) readToken(name string) (string, error) {
	tok := a.getenv("HEARTH_TOKEN")
	if tok == "" {
		if f, ok := a.in.(*os.File); ok && a.inTTY {
			fmt.Fprintf(a.err, "Token for %s: ", name)
			b, err := term.ReadPassword(int(f.Fd()))
			fmt.Fprintln(a.err)
			if err != nil {
				return "", fmt.Errorf("read token: %w", err)
			}
			tok = string(b)
		} else {
			line, err := bufio.NewReader(io.LimitReader(a.in, 4096)).ReadString('\n')
			if err != nil && err != io.EOF {
				return "", fmt.Errorf("read token from stdin: %w", err)
			}
			tok = line
		}
	}
	tok = strings.TrimSpace(tok)
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", usagef("no token: set HEARTH_TOKEN or pass the token on stdin (hearth-control tokens create prints one)")
	}
	return tok, nil
}

func (a *app) contextUse() *cobra.Command {
	return &cobra.Command{
		Use:               "use NAME",
		Short:             "Make a context the current one",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeContexts,
		RunE: runE(func(_ *cobra.Command, args []string) error {
			return a.editContext(args[0], "Context %s is now current.", func(cfg *configFile) {
				cfg.CurrentContext = args[0]
			})
		}),
	}
}

// editContext changes the configuration of an existing context and saves
// it, then says done (format takes the name).
func (a *app) editContext(name, done string, edit func(*configFile)) error {
	cfg, path, err := a.config()
	if err != nil {
		return err
	}
	if _, ok := cfg.Contexts[name]; !ok {
		return notFoundError{msg: fmt.Sprintf("context %q not found", name)}
	}
	edit(&cfg)
	if err := cfg.save(path); err != nil {
		return err
	}
	a.say(done, name)
	return nil
}

// contextJSON is a context as list shows it: never its token.
type contextJSON struct {
	Name    string `json:"name"`
	URL     string `json:"url"`
	CAFile  string `json:"ca_file,omitempty"`
	Current bool   `json:"current"`
}

func (a *app) contextList() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List contexts (never their tokens)",
		Args:  cobra.NoArgs,
		RunE: runE(func(*cobra.Command, []string) error {
			cfg, _, err := a.config()
			if err != nil {
				return err
			}
			out := []contextJSON{}
			for _, n := range cfg.contextNames() {
				c := cfg.Contexts[n]
				out = append(out, contextJSON{Name: n, URL: c.URL, CAFile: c.CAFile, Current: n == cfg.CurrentContext})
			}
			if a.json() {
				return a.printJSON(out)
			}
			t := newTable(a.out, "CURRENT", "NAME", "URL", "CA FILE")
			for _, c := range out {
				cur := ""
				if c.Current {
					cur = "*"
				}
				t.row(cur, c.Name, c.URL, c.CAFile)
			}
			return t.flush()
		}),
	}
}

func (a *app) contextDelete() *cobra.Command {
	return &cobra.Command{
		Use:               "delete NAME",
		Short:             "Delete a context and its stored token",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeContexts,
		RunE: runE(func(_ *cobra.Command, args []string) error {
			return a.editContext(args[0], "Context %s deleted.", func(cfg *configFile) {
				delete(cfg.Contexts, args[0])
				if cfg.CurrentContext == args[0] {
					cfg.CurrentContext = ""
				}
			})
		}),
	}
}

func (a *app) completeContexts(*cobra.Command, []string, string) ([]cobra.Completion, cobra.ShellCompDirective) {
	cfg, _, err := a.config()
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	var out []cobra.Completion
	for _, n := range cfg.contextNames() {
		out = append(out, cobra.CompletionWithDesc(n, cfg.Contexts[n].URL))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}
