package main

import (
	"context"
	"fmt"
	"io"
	"iter"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/ids"
)

// listFlags are every list command's: the page size and whether to follow
// the cursors to the end.
type listFlags struct {
	limit int
	all   bool
}

func (l *listFlags) add(cmd *cobra.Command) {
	cmd.Flags().IntVar(&l.limit, "limit", 20, "items per page, 1 to 100; without --all, the one page shown")
	cmd.Flags().BoolVar(&l.all, "all", false, "list everything, following the cursors page by page")
}

// collect runs a list: one page, or with --all every page. more is true
// when items were left unshown.
func collect[T any](l listFlags, page func(client.ListParams) (client.List[T], error),
	all func(client.ListParams) iter.Seq2[T, error]) (items []T, more bool, err error) {
	if l.limit < 1 || l.limit > 100 {
		return nil, false, usagef(fmt.Sprintf("--limit must be 1 to 100, not %d", l.limit))
	}
	p := client.ListParams{Limit: l.limit}
	if !l.all {
		pg, err := page(p)
		if err != nil {
			return nil, false, err
		}
		return pg.Data, pg.HasMore, nil
	}
	items = []T{}
	for it, err := range all(p) {
		if err != nil {
			return nil, false, err
		}
		items = append(items, it)
	}
	return items, false, nil
}

// showList prints a list as JSON (an array) or with its table renderer,
// and says on stderr when there is more.
func showList[T any](a *app, what string, items []T, more bool, render func(io.Writer, []T, time.Time) error) error {
	if items == nil {
		items = []T{}
	}
	var err error
	if a.json() {
		err = a.printJSON(items)
	} else {
		err = render(a.out, items, a.now())
	}
	if more {
		fmt.Fprintf(a.err, "More %s than shown: use --all to list them all.\n", what)
	}
	return err
}

// show prints one item as JSON or with its table renderer.
func show[T any](a *app, item T, render func(io.Writer, T, time.Time) error) error {
	if a.json() {
		return a.printJSON(item)
	}
	return render(a.out, item, a.now())
}

// say prints a message for people: on stdout with table output; with JSON
// output stdout stays for JSON, so it goes to stderr.
func (a *app) say(format string, args ...any) {
	w := a.out
	if a.json() {
		w = a.err
	}
	fmt.Fprintf(w, format+"\n", args...)
}

// serverID resolves a server given by ID or by name. A name costs a walk
// of the server list: the API has no lookup by name.
func serverID(ctx context.Context, c *client.Client, arg string) (string, error) {
	if ids.Valid(arg, "srv_", 24) {
		return arg, nil
	}
	for s, err := range c.AllServers(ctx, client.ListServersParams{}) {
		if err != nil {
			return "", err
		}
		if s.Name == arg {
			return s.ID, nil
		}
	}
	return "", notFoundError{msg: fmt.Sprintf("no server with the ID or name %q", arg)}
}

// sshKeyID resolves an SSH key given by ID or by name; a name two keys
// share is refused.
func sshKeyID(ctx context.Context, c *client.Client, arg string) (string, error) {
	if ids.Valid(arg, "sk_", 24) {
		return arg, nil
	}
	var found []string
	for k, err := range c.AllSSHKeys(ctx, client.ListParams{}) {
		if err != nil {
			return "", err
		}
		if k.Name == arg {
			found = append(found, k.ID)
		}
	}
	switch len(found) {
	case 0:
		return "", notFoundError{msg: fmt.Sprintf("no SSH key with the ID or name %q", arg)}
	case 1:
		return found[0], nil
	}
	return "", usagef(fmt.Sprintf("%d SSH keys are named %q (%v): give an ID", len(found), arg, found))
}

// idempotencyFlag adds --idempotency-key to a create command.
func idempotencyFlag(cmd *cobra.Command, key *string) {
	cmd.Flags().StringVar(key, "idempotency-key", "", "send this Idempotency-Key (default: a new one per run; the same key again within 24 h returns the first result instead of creating again)")
}

func (a *app) withIdempotency(ctx context.Context, key string) context.Context {
	if key == "" {
		return ctx
	}
	return client.WithIdempotencyKey(ctx, key)
}

// iterSeq is what the client's All… methods return.
type iterSeq[T any] = iter.Seq2[T, error]
