package apikeys

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/hearthd/hearth/internal/adminsock"
	"github.com/hearthd/hearth/store"
)

const cliUsage = `usage: hearthd keys <command>

commands:
  create [--name NAME]   create a key and print its secret (shown only once)
  list                   list keys (local and managed) with their usage
  revoke ID              revoke a local key; requests with it fail at once
                         (managed keys, dk_…, change only through the management API)`

// keyOps is what the CLI does, either through the daemon or on the state.
type keyOps interface {
	Create(ctx context.Context, name string) (string, Key, error)
	List(ctx context.Context) ([]Key, error)
	Revoke(ctx context.Context, id string) error
}

// localOps runs keyOps on a Keyring the CLI opened itself.
type localOps struct{ k *Keyring }

func (l localOps) Create(_ context.Context, name string) (string, Key, error) {
	return l.k.Create(name)
}
func (l localOps) List(context.Context) ([]Key, error)       { return l.k.List(), nil }
func (l localOps) Revoke(_ context.Context, id string) error { return l.k.Revoke(id) }

// RunCLI runs "hearthd keys <args…>". It goes through the daemon's admin
// socket at socketPath when a daemon answers there, and otherwise opens the
// state in stateDir itself (saying so on stderr). The secret from create is
// the only thing written to stdout, so it can be captured by a script; notes
// go to stderr.
func RunCLI(ctx context.Context, args []string, stdout, stderr io.Writer, socketPath, stateDir string) error {
	if len(args) == 0 {
		fmt.Fprintln(stderr, cliUsage)
		return errors.New("keys: missing command")
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("hearthd keys "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var name string
	switch cmd {
	case "create":
		fs.StringVar(&name, "name", "default", "a name to recognise the key by (1-64 printable characters)")
	case "list", "revoke":
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, cliUsage)
		return nil
	default:
		fmt.Fprintln(stderr, cliUsage)
		return fmt.Errorf("keys: unknown command %q", cmd)
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	var id string
	switch cmd {
	case "revoke":
		if fs.NArg() != 1 {
			return errors.New("keys revoke: want exactly one key ID")
		}
		id = fs.Arg(0)
	default:
		if fs.NArg() != 0 {
			return fmt.Errorf("keys %s: unexpected arguments %q", cmd, fs.Args())
		}
	}
	if cmd == "create" {
		// Fail before touching the daemon or the state.
		if err := ValidateName(name); err != nil {
			return fmt.Errorf("keys create: %w", err)
		}
	}

	ops, done, err := connect(ctx, stderr, socketPath, stateDir)
	if err != nil {
		return err
	}
	err = runOp(ctx, ops, cmd, name, id, stdout, stderr)
	if derr := done(); err == nil {
		err = derr
	}
	return err
}

func runOp(ctx context.Context, ops keyOps, cmd, name, id string, stdout, stderr io.Writer) error {
	switch cmd {
	case "create":
		secret, k, err := ops.Create(ctx, name)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintln(stdout, secret); err != nil {
			return fmt.Errorf("print key: %w", err)
		}
		fmt.Fprintf(stderr, "Created key %s (%s). Copy it now: it cannot be shown again.\n", k.ID, k.Name)
		return nil
	case "list":
		keys, err := ops.List(ctx)
		if err != nil {
			return err
		}
		return printKeys(stdout, keys)
	case "revoke":
		if err := ops.Revoke(ctx, id); err != nil {
			return err
		}
		_, err := fmt.Fprintf(stdout, "Revoked %s.\n", id)
		return err
	}
	return fmt.Errorf("keys: unknown command %q", cmd)
}

// connect picks the daemon when one answers on socketPath, else the state.
func connect(ctx context.Context, stderr io.Writer, socketPath, stateDir string) (keyOps, func() error, error) {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	conn, err := adminsock.Dial(dctx, socketPath)
	cancel()
	if err == nil {
		conn.Close()
		return NewAdminClient(socketPath), func() error { return nil }, nil
	}
	if !errors.Is(err, adminsock.ErrNotRunning) {
		return nil, nil, fmt.Errorf("connect to hearthd at %s (run as root?): %w", socketPath, err)
	}
	fmt.Fprintf(stderr, "hearthd is not running (no answer on %s); using the state in %s directly.\n", socketPath, stateDir)
	st, err := store.Open(stateDir, store.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("keys: %w (is hearthd running with a different admin socket?)", err)
	}
	k, err := Open(st, nil)
	if err != nil {
		st.Close()
		return nil, nil, err
	}
	return localOps{k}, func() error {
		return errors.Join(k.Close(), st.Close())
	}, nil
}

func printKeys(w io.Writer, keys []Key) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSOURCE\tHINT\tCREATED\tREVOKED\tEXPIRES\tREQUESTS\tTOKENS_IN\tTOKENS_OUT")
	for _, k := range keys {
		hint := k.Hint
		if hint == "" {
			hint = "-" // managed keys: the node never saw the secret
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n",
			k.ID, k.Name, k.Source, hint, formatTime(k.CreatedAt), optTime(k.RevokedAt), optTime(k.ExpiresAt),
			k.Usage.Requests, k.Usage.PromptTokens, k.Usage.CompletionTokens)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("print keys: %w", err)
	}
	return nil
}

func formatTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05Z") }

func optTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return formatTime(*t)
}
