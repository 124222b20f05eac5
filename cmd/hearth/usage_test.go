package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestUnknownCommandsAndArgumentsAreUsageErrors walks every command: an
// unknown subcommand of a group, or arguments a command does not take,
// exit 2 with the usage error on stderr and nothing on stdout, before
// anything is sent (no control plane is configured). A group alone, and
// help on a known command, still show the help and exit 0.
func TestUnknownCommandsAndArgumentsAreUsageErrors(t *testing.T) {
	home := t.TempDir()
	env := map[string]string{"HOME": home, "XDG_CONFIG_HOME": filepath.Join(home, "config")}
	cli := func(args ...string) result {
		var out, errb strings.Builder
		code := run(context.Background(), args, stdio{in: strings.NewReader(""), out: &out, err: &errb,
			getenv: func(k string) string { return env[k] }})
		return result{out: out.String(), err: errb.String(), code: code}
	}
	// refused runs args and wants exit 2 and an error on stderr naming
	// unknown (in JSON when cobra refuses it before reading -o).
	refused := func(unknown string, args ...string) {
		t.Helper()
		r := cli(append(args, "-o", "table")...)
		if r.code != exitUsage || r.out != "" || !strings.Contains(r.err, unknown) {
			t.Errorf("hearth %s: want exit 2, the error naming %q on stderr and nothing on stdout; got %v",
				strings.Join(args, " "), unknown, r)
		}
	}

	var walk func(c *cobra.Command, path []string) int
	walk = func(c *cobra.Command, path []string) int {
		n := 0
		for _, sub := range c.Commands() {
			if sub.Hidden {
				continue
			}
			p := append(append([]string(nil), path...), sub.Name())
			if sub.HasSubCommands() {
				refused("reboot", append(p, "reboot", "demo")...)
				if r := cli(p...); r.code != exitOK || !strings.Contains(r.out, "Available Commands") {
					t.Errorf("hearth %s: want its help and exit 0, got %v", strings.Join(p, " "), r)
				}
				n += walk(sub, p)
			} else {
				refused("Error: ", append(p, "one", "two", "three")...) // unknown command "one", or accepts 1 arg(s)
			}
			n++
		}
		return n
	}
	a := &app{}
	if n := walk(a.rootCommand(), nil); n < 25 {
		t.Fatalf("only %d commands walked", n)
	}

	refused("reboot", "reboot", "demo")
	refused("reboot", "server", "reboot", "demo")
	refused("reboot", "help", "reboot")
	refused("server reboot", "help", "server", "reboot")
	for _, topic := range [][]string{{"help", "server"}, {"help", "server", "list"}, {"server", "list", "--help"}} {
		if r := cli(topic...); r.code != exitOK || !strings.Contains(r.out, "Usage:") {
			t.Errorf("hearth %s: want the help and exit 0, got %v", strings.Join(topic, " "), r)
		}
	}
	if r := cli("server", "lsit", "-o", "table"); !strings.Contains(r.err, "Did you mean this?\n\tlist") {
		t.Errorf("a near miss is not named:\n%s", r.err)
	}
}
