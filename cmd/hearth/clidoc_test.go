package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/internal/config"
)

var updateCLIDoc = flag.Bool("update-cli-doc", false, "rewrite the command reference in docs/cli.md")

const (
	cliDocBegin = "<!-- BEGIN commands: generated from the cobra commands, do not edit -->"
	cliDocEnd   = "<!-- END commands -->"
)

// TestCLIDoc keeps the command reference of docs/cli.md in step with the
// commands themselves: every command's purpose, usage and own flags.
func TestCLIDoc(t *testing.T) {
	a := &app{stdio: stdio{in: strings.NewReader(""), out: new(strings.Builder), err: new(strings.Builder),
		getenv: func(string) string { return "" }}, ctx: context.Background()}
	root := a.rootCommand()
	var b strings.Builder
	fmt.Fprintf(&b, "Flags of every command: `%s`.\n\n", strings.Join(flagNames(root.PersistentFlags().FlagUsages()), "`, `"))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" {
			return
		}
		if c != root && c.Runnable() && !c.HasSubCommands() {
			fmt.Fprintf(&b, "### `%s`\n\n%s\n\n```text\n%s\n", c.CommandPath(), c.Short, c.UseLine())
			if f := c.NonInheritedFlags().FlagUsages(); f != "" {
				b.WriteString(strings.TrimRight(f, "\n") + "\n")
			}
			b.WriteString("```\n\n")
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	stale, err := config.UpdateSection("../../docs/cli.md", cliDocBegin, cliDocEnd, b.String(), *updateCLIDoc)
	if err != nil {
		t.Fatal(err)
	}
	if stale {
		t.Error("docs/cli.md's command reference is out of date: go test ./cmd/hearth -run TestCLIDoc -update-cli-doc")
	}
}

// flagNames are the long names in a pflag usage listing.
func flagNames(usages string) []string {
	var names []string
	for _, line := range strings.Split(usages, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			names = append(names, strings.Fields(line[i:])[0])
		}
	}
	return names
}
