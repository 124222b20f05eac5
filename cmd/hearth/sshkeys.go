package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

func (a *app) sshKeyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "ssh-key", Aliases: []string{"ssh-keys"}, Short: "Register SSH public keys to install on servers"}
	cmd.AddCommand(a.sshKeyAdd(), a.sshKeyList(), a.sshKeyDelete())
	return cmd
}

// maxPublicKeyFile bounds what is read of a public key file: one line of
// the largest key types is far below it, a private key or a log is not.
const maxPublicKeyFile = 64 << 10

func (a *app) sshKeyAdd() *cobra.Command {
	var (
		req  client.CreateSSHKeyRequest
		file string
		idem string
	)
	cmd := &cobra.Command{
		Use:   "add --name NAME (--public-key-from-file FILE | --public-key KEY)",
		Short: "Register an SSH public key",
		Example: `  hearth ssh-key add --name laptop --public-key-from-file ~/.ssh/id_ed25519.pub
  cat key.pub | hearth ssh-key add --name ci --public-key-from-file -`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			if file != "" {
				line, err := a.readPublicKey(file)
				if err != nil {
					return err
				}
				req.PublicKey = line
			}
			if req.Name == "" {
				req.Name = defaultKeyName(req.PublicKey)
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			key, err := c.CreateSSHKey(a.withIdempotency(cmd.Context(), idem), req)
			if err != nil {
				return err
			}
			return show(a, key, renderSSHKey)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "a name for the key (default: the key's comment)")
	f.StringVar(&file, "public-key-from-file", "", "read the public key from this file (- for stdin), e.g. ~/.ssh/id_ed25519.pub")
	f.StringVar(&req.PublicKey, "public-key", "", "the public key: one authorized_keys line")
	idempotencyFlag(cmd, &idem)
	cmd.MarkFlagsOneRequired("public-key-from-file", "public-key")
	cmd.MarkFlagsMutuallyExclusive("public-key-from-file", "public-key")
	must(cmd.MarkFlagFilename("public-key-from-file", "pub"))
	return cmd
}

// readPublicKey reads a public key file; a private key is refused before
// anything is sent.
func (a *app) readPublicKey(file string) (string, error) {
	var r io.Reader = a.in
	if file != "-" {
		f, err := os.Open(expandHome(file, a.getenv))
		if err != nil {
			return "", err
		}
		defer f.Close()
		r = f
	}
	raw, err := io.ReadAll(io.LimitReader(r, maxPublicKeyFile+1))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", file, err)
	}
	text := strings.TrimSpace(string(raw))
	if strings.Contains(text, "PRIVATE KEY") {
		return "", usagef(file + " is a private key: give the public one (usually the same path with .pub)")
	}
	if len(raw) > maxPublicKeyFile || strings.Count(text, "\n") > 0 {
		return "", usagef(file + " is not one public key line")
	}
	return text, nil
}

// expandHome expands a leading ~/ (a flag's value is not expanded by the
// shell when written --flag=~/…).
func expandHome(path string, getenv func(string) string) string {
	if rest, ok := strings.CutPrefix(path, "~/"); ok && getenv("HOME") != "" {
		return filepath.Join(getenv("HOME"), rest)
	}
	return path
}

// defaultKeyName is the key's comment (user@host, usually), or "ssh-key".
func defaultKeyName(publicKey string) string {
	fields := strings.Fields(publicKey)
	if len(fields) >= 3 {
		name := strings.Join(fields[2:], " ")
		if len(name) <= 100 {
			return name
		}
	}
	return "ssh-key"
}

func (a *app) sshKeyList() *cobra.Command {
	var l listFlags
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List SSH keys, newest first",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			items, more, err := collect(l,
				func(p client.ListParams) (client.List[client.SSHKey], error) { return c.ListSSHKeys(ctx, p) },
				func(p client.ListParams) iterSeq[client.SSHKey] { return c.AllSSHKeys(ctx, p) })
			if err != nil {
				return err
			}
			return showList(a, "SSH keys", items, more, renderSSHKeys)
		}),
	}
	l.add(cmd)
	return cmd
}

func (a *app) sshKeyDelete() *cobra.Command {
	return &cobra.Command{
		Use:               "delete KEY",
		Short:             "Delete an SSH key (ID or name): it leaves every server's authorized_keys",
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeSSHKeys,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			id, err := sshKeyID(cmd.Context(), c, args[0])
			if err != nil {
				return err
			}
			if err := c.DeleteSSHKey(cmd.Context(), id); err != nil {
				return err
			}
			a.say("SSH key %s deleted.", id)
			return nil
		}),
	}
}

func renderSSHKey(w io.Writer, k client.SSHKey, now time.Time) error {
	_, err := fmt.Fprintf(w, "ID:          %s\nName:        %s\nType:        %s (%d bits)\nFingerprint: %s\nCreated:     %s\n",
		k.ID, k.Name, k.Type, k.Bits, k.Fingerprint, when(k.CreatedAt, now))
	return err
}

func (a *app) completeSSHKeys(cmd *cobra.Command, _ []string, _ string) ([]cobra.Completion, cobra.ShellCompDirective) {
	return completions(a, func(c *client.Client) iterSeq[client.SSHKey] {
		return c.AllSSHKeys(cmd.Context(), client.ListParams{})
	}, func(k client.SSHKey) []cobra.Completion {
		return []cobra.Completion{cobra.CompletionWithDesc(k.ID, k.Name+", "+k.Fingerprint)}
	})
}
