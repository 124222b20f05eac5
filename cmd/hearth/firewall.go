package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

func (a *app) firewallRuleCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "firewall-rule", Aliases: []string{"firewall-rules"}, Short: "Manage a server's firewall rules"}
	cmd.AddCommand(a.ruleAdd(), a.ruleList(), a.ruleGet(), a.ruleDelete())
	return cmd
}

// serverFlag adds the required --server flag of the sub-resource commands.
func (a *app) serverFlag(cmd *cobra.Command, server *string) {
	cmd.Flags().StringVar(server, "server", "", "the server (ID or name)")
	must(cmd.MarkFlagRequired("server"))
	must(cmd.RegisterFlagCompletionFunc("server", a.completeServerFlag))
}

// connectServer connects and resolves --server.
func (a *app) connectServer(ctx context.Context, server string) (*client.Client, string, error) {
	c, err := a.client()
	if err != nil {
		return nil, "", err
	}
	id, err := serverID(ctx, c, server)
	return c, id, err
}

func (a *app) ruleAdd() *cobra.Command {
	var (
		server                string
		req                   client.CreateFirewallRuleRequest
		direction, proto, act string
		idem                  string
	)
	cmd := &cobra.Command{
		Use:   "add --server SERVER --protocol tcp|udp|icmp [--port PORTS] [--source CIDR | --destination CIDR] [--action allow|deny]",
		Short: "Add a firewall rule to a server (applied by its node within a second)",
		Example: `  hearth firewall-rule add --server web --protocol tcp --port 22 --source 198.51.100.0/24 --description ssh
  hearth firewall-rule add --server web --direction outbound --protocol udp --port 53 --destination 192.0.2.53`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			req.Direction, req.Protocol, req.Action = client.Direction(direction), client.Protocol(proto), client.Action(act)
			c, id, err := a.connectServer(cmd.Context(), server)
			if err != nil {
				return err
			}
			rule, err := c.CreateFirewallRule(a.withIdempotency(cmd.Context(), idem), id, req)
			if err != nil {
				return err
			}
			return show(a, rule, renderRule)
		}),
	}
	a.serverFlag(cmd, &server)
	f := cmd.Flags()
	f.StringVar(&direction, "direction", string(client.Inbound), "inbound or outbound")
	f.StringVar(&proto, "protocol", "", "tcp, udp or icmp")
	f.StringVar(&req.PortRange, "port", "", `port or range, e.g. 22 or 8000-9000 (default: all; not for icmp)`)
	f.StringVar(&req.Source, "source", "", "inbound: source address or CIDR (default: any)")
	f.StringVar(&req.Destination, "destination", "", "outbound: destination address or CIDR (default: any)")
	f.StringVar(&act, "action", string(client.Allow), "allow or deny")
	f.StringVar(&req.Description, "description", "", "what the rule is for")
	idempotencyFlag(cmd, &idem)
	must(cmd.MarkFlagRequired("protocol"))
	cmd.MarkFlagsMutuallyExclusive("source", "destination")
	must(cmd.RegisterFlagCompletionFunc("direction", enumCompletion(client.Directions())))
	must(cmd.RegisterFlagCompletionFunc("protocol", enumCompletion(client.Protocols())))
	must(cmd.RegisterFlagCompletionFunc("action", enumCompletion(client.Actions())))
	return cmd
}

func (a *app) ruleList() *cobra.Command {
	return subList(a, "List a server's firewall rules, newest first", "firewall rules",
		(*client.Client).ListFirewallRules, (*client.Client).AllFirewallRules, renderRules)
}

func (a *app) ruleGet() *cobra.Command {
	return subGet(a, "RULE", "Show a firewall rule (fw_…) of a server", (*client.Client).GetFirewallRule, renderRules)
}

func (a *app) ruleDelete() *cobra.Command {
	return subDelete(a, "RULE", "Delete a firewall rule (fw_…) of a server", "Firewall rule", (*client.Client).DeleteFirewallRule)
}

// subList builds the `list --server SERVER` command of a server's
// sub-resource (firewall rules, API keys).
func subList[T any](a *app, short, what string,
	page func(*client.Client, context.Context, string, client.ListParams) (client.List[T], error),
	all func(*client.Client, context.Context, string, client.ListParams) iterSeq[T],
	render func(io.Writer, []T, time.Time) error) *cobra.Command {
	var (
		l      listFlags
		server string
	)
	cmd := &cobra.Command{
		Use:   "list --server SERVER",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, id, err := a.connectServer(ctx, server)
			if err != nil {
				return err
			}
			items, more, err := collect(l,
				func(p client.ListParams) (client.List[T], error) { return page(c, ctx, id, p) },
				func(p client.ListParams) iterSeq[T] { return all(c, ctx, id, p) })
			if err != nil {
				return err
			}
			return showList(a, what, items, more, render)
		}),
	}
	a.serverFlag(cmd, &server)
	l.add(cmd)
	return cmd
}

// subGet builds the `get ID --server SERVER` command of a server's
// sub-resource: one item, as its list shows it.
func subGet[T any](a *app, arg, short string, get func(*client.Client, context.Context, string, string) (T, error),
	render func(io.Writer, []T, time.Time) error) *cobra.Command {
	return subItem(a, "get", arg, short, func(ctx context.Context, c *client.Client, server, id string) error {
		item, err := get(c, ctx, server, id)
		if err != nil {
			return err
		}
		if a.json() {
			return a.printJSON(item)
		}
		return render(a.out, []T{item}, a.now())
	})
}

// subDelete builds the `delete ID --server SERVER` command of a server's
// sub-resource; what names it in the message ("API key").
func subDelete(a *app, arg, short, what string, del func(*client.Client, context.Context, string, string) error) *cobra.Command {
	return subItem(a, "delete", arg, short, func(ctx context.Context, c *client.Client, server, id string) error {
		if err := del(c, ctx, server, id); err != nil {
			return err
		}
		a.say("%s %s deleted.", what, id)
		return nil
	})
}

// subItem builds `VERB ID --server SERVER` for one item of a server's
// sub-resource: run gets the server's ID and the item's.
func subItem(a *app, verb, arg, short string, run func(ctx context.Context, c *client.Client, server, id string) error) *cobra.Command {
	var server string
	cmd := &cobra.Command{
		Use:   verb + " " + arg + " --server SERVER",
		Short: short,
		Args:  cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			c, id, err := a.connectServer(cmd.Context(), server)
			if err != nil {
				return err
			}
			return run(cmd.Context(), c, id, args[0])
		}),
	}
	a.serverFlag(cmd, &server)
	return cmd
}

func renderRule(w io.Writer, r client.FirewallRule, now time.Time) error {
	if err := renderRules(w, []client.FirewallRule{r}, now); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "Server: %s\n", r.ServerID)
	return err
}
