package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

func (a *app) serverCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "server", Aliases: []string{"servers"}, Short: "Rent, inspect, change and delete servers"}
	cmd.AddCommand(a.serverCreate(), a.serverList(), a.serverGet(), a.serverUpdate(), a.serverDelete())
	return cmd
}

func (a *app) serverCreate() *cobra.Command {
	var (
		req     client.CreateServerRequest
		stack   string
		sshKeys []string
		idem    string
		w       waitFlags
	)
	cmd := &cobra.Command{
		Use:   "create --name NAME --chip CHIP --ram GB --storage GB [--model MODEL] [--ssh-key KEY]...",
		Short: "Rent a server on a free node",
		Example: `  hearth server create --name web --chip cpu --ram 8 --storage 40 --model llama3.2:1b --ssh-key laptop --wait
  hearth server create --name build --chip cpu --ram 4 --storage 20 --stack bare`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			req.Stack = client.Stack(stack)
			if req.Stack == client.StackDeployment && req.Model == "" {
				return usagef("--model is required for the deployment stack (or use --stack bare)")
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			for _, k := range sshKeys {
				id, err := sshKeyID(ctx, c, k)
				if err != nil {
					return err
				}
				req.SSHKeyIDs = append(req.SSHKeyIDs, id)
			}
			srv, err := c.CreateServer(a.withIdempotency(ctx, idem), req)
			if err != nil {
				return err
			}
			return a.finishServer(ctx, c, w, srv)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "server name: lowercase letters, digits and '-' (a DNS label), unique")
	f.StringVar(&req.Chip, "chip", "", "node chip family, e.g. cpu or m4")
	f.IntVar(&req.RAM, "ram", 0, "RAM in GB")
	f.IntVar(&req.Storage, "storage", 0, "storage in GB")
	f.StringVar(&stack, "stack", string(client.StackDeployment), "deployment (serves --model) or bare")
	f.StringVar(&req.Model, "model", "", "the model the deployment serves, e.g. llama3.2:1b")
	f.StringVar(&req.Billing, "billing", client.BillingMonthly, "billing plan")
	f.StringArrayVar(&sshKeys, "ssh-key", nil, "SSH key ID or name to install (repeatable)")
	idempotencyFlag(cmd, &idem)
	w.add(cmd, "running")
	for _, name := range []string{"name", "chip", "ram", "storage"} {
		must(cmd.MarkFlagRequired(name))
	}
	must(cmd.RegisterFlagCompletionFunc("stack", enumCompletion(client.Stacks())))
	must(cmd.RegisterFlagCompletionFunc("ssh-key", a.completeSSHKeys))
	return cmd
}

// finishServer shows a created or changed server, first waiting for it to
// run with --wait. A server that failed is shown too, then the error.
func (a *app) finishServer(ctx context.Context, c *client.Client, w waitFlags, srv client.Server) error {
	if !w.wait || srv.Status == client.StatusRunning {
		return show(a, srv, renderServer)
	}
	srv, err := a.waitRunning(ctx, c, w, srv.ID, srv.Action)
	if err == nil || errors.Is(err, client.ErrServerFailed) {
		if serr := show(a, srv, renderServer); err == nil {
			err = serr
		}
	}
	return err
}

func (a *app) serverList() *cobra.Command {
	var (
		l      listFlags
		status string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List servers, newest first (IP addresses masked)",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			p := client.ListServersParams{Status: client.ServerStatus(status)}
			items, more, err := collect(l,
				func(lp client.ListParams) (client.List[client.Server], error) {
					p.ListParams = lp
					return c.ListServers(ctx, p)
				},
				func(lp client.ListParams) iterSeq[client.Server] {
					p.ListParams = lp
					return c.AllServers(ctx, p)
				})
			if err != nil {
				return err
			}
			return showList(a, "servers", items, more, renderServers)
		}),
	}
	l.add(cmd)
	cmd.Flags().StringVar(&status, "status", "", "only servers with this status")
	must(cmd.RegisterFlagCompletionFunc("status", enumCompletion(client.ServerStatuses())))
	return cmd
}

func (a *app) serverGet() *cobra.Command {
	return &cobra.Command{
		Use:               "get SERVER",
		Aliases:           []string{"describe"},
		Short:             "Show a server (ID or name): status, model, address, enforcement",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeServers,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			c, id, err := a.connectServer(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			srv, err := c.GetServer(cmd.Context(), id)
			if err != nil {
				return err
			}
			return show(a, srv, renderServer)
		}),
	}
}

func (a *app) serverUpdate() *cobra.Command {
	var (
		req client.UpdateServerRequest
		w   waitFlags
	)
	cmd := &cobra.Command{
		Use:   "update SERVER [--name NAME] [--model MODEL]",
		Short: "Rename a server or switch its model (updating until the node serves it)",
		Example: `  hearth server update web --model llama3.2:3b --wait
  hearth server update web --name web-eu`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeServers,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			if req == (client.UpdateServerRequest{}) {
				return usagef("nothing to change: give --name and/or --model")
			}
			ctx := cmd.Context()
			c, id, err := a.connectServer(ctx, args[0])
			if err != nil {
				return err
			}
			srv, err := c.UpdateServer(ctx, id, req)
			if err != nil {
				return err
			}
			return a.finishServer(ctx, c, w, srv)
		}),
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "new name")
	cmd.Flags().StringVar(&req.Model, "model", "", "new model (deployment stack only)")
	w.add(cmd, "running (serving the new model)")
	return cmd
}

func (a *app) serverDelete() *cobra.Command {
	var w waitFlags
	cmd := &cobra.Command{
		Use:               "delete SERVER",
		Short:             "Delete a server: its node wipes everything of it and returns to the pool",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeServers,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			c, id, err := a.connectServer(ctx, args[0])
			if err != nil {
				return err
			}
			if err := c.DeleteServer(ctx, id); err != nil {
				return err
			}
			if !w.wait {
				a.say("Server %s is being deleted.", id)
				return nil
			}
			if err := a.waitGone(ctx, c, w, id); err != nil {
				return err
			}
			a.say("Server %s deleted.", id)
			return nil
		}),
	}
	w.add(cmd, "gone (its node has wiped it)")
	return cmd
}

// enumCompletion completes a flag from an enum's values.
func enumCompletion[T ~string](values []T) cobra.CompletionFunc {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return cobra.FixedCompletions(s, cobra.ShellCompDirectiveNoFileComp)
}

// completeServers completes a server argument with the IDs and names of
// the servers.
func (a *app) completeServers(cmd *cobra.Command, args []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return a.serverCompletions(cmd.Context())
}

func (a *app) serverCompletions(ctx context.Context) ([]cobra.Completion, cobra.ShellCompDirective) {
	return completions(a, func(c *client.Client) iterSeq[client.Server] {
		return c.AllServers(ctx, client.ListServersParams{})
	}, func(s client.Server) []cobra.Completion {
		return []cobra.Completion{cobra.CompletionWithDesc(s.ID, fmt.Sprintf("%s, %s", s.Status, s.Name)),
			cobra.CompletionWithDesc(s.Name, fmt.Sprintf("%s, %s", s.Status, s.ID))}
	})
}

// completions lists what a shell may complete from every item of a list;
// any error completes nothing.
func completions[T any](a *app, all func(*client.Client) iterSeq[T], of func(T) []cobra.Completion) ([]cobra.Completion, cobra.ShellCompDirective) {
	fail := cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	c, err := a.client()
	if err != nil {
		return nil, fail
	}
	var out []cobra.Completion
	for item, err := range all(c) {
		if err != nil {
			return nil, fail
		}
		out = append(out, of(item)...)
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeServerFlag completes --server.
func (a *app) completeServerFlag(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return a.serverCompletions(cmd.Context())
}
