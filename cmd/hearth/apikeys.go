package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

func (a *app) apiKeyCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "api-key", Aliases: []string{"api-keys"}, Short: "Issue and revoke a deployment's API keys"}
	cmd.AddCommand(a.apiKeyCreate(), a.apiKeyList(), a.apiKeyGet(), a.apiKeyDelete())
	return cmd
}

// errSecretLost: the create's answer was lost and its retry replayed: the
// key exists, but the API never shows its secret again.
var errSecretLost = errors.New("the answer with the key's secret was lost in transit, and the API shows a secret only once")

func (a *app) apiKeyCreate() *cobra.Command {
	var (
		server    string
		req       client.CreateAPIKeyRequest
		expiresIn time.Duration
		expiresAt string
		idem      string
	)
	cmd := &cobra.Command{
		Use:   "create --server SERVER --name NAME [--expires-in DURATION] [--requests-per-minute N] [--tokens-per-minute N]",
		Short: "Issue an API key for a deployment: its secret is shown only now",
		Example: `  hearth api-key create --server web --name my-app
  hearth api-key create --server web --name ci --expires-in 720h --requests-per-minute 60 -o json | jq -r .key`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			switch {
			case expiresIn != 0 && expiresAt != "":
				return usagef("give --expires-in or --expires-at, not both")
			case expiresIn < 0:
				return usagef("--expires-in must be positive")
			case expiresIn > 0:
				at := a.now().Add(expiresIn).UTC().Truncate(time.Second)
				req.ExpiresAt = &at
			case expiresAt != "":
				at, err := time.Parse(time.RFC3339, expiresAt)
				if err != nil {
					return usagef("--expires-at must be an RFC 3339 time, e.g. 2027-01-31T00:00:00Z")
				}
				req.ExpiresAt = &at
			}
			c, id, err := a.connectServer(cmd.Context(), server)
			if err != nil {
				return err
			}
			key, err := c.CreateAPIKey(a.withIdempotency(cmd.Context(), idem), id, req)
			if err != nil {
				return err
			}
			if key.Key == nil {
				return fmt.Errorf("API key %s was created, but %w: delete it (hearth api-key delete %s --server %s) and create another",
					key.ID, errSecretLost, key.ID, id)
			}
			if a.json() {
				return a.printJSON(key)
			}
			return renderCreatedAPIKey(a.out, key)
		}),
	}
	a.serverFlag(cmd, &server)
	f := cmd.Flags()
	f.StringVar(&req.Name, "name", "", "a name for the key (need not be unique)")
	f.DurationVar(&expiresIn, "expires-in", 0, "the key expires after this long, e.g. 720h (default: never)")
	f.StringVar(&expiresAt, "expires-at", "", "the key expires at this RFC 3339 time")
	f.IntVar(&req.RequestsPerMinute, "requests-per-minute", 0, "requests per minute the key may make (0: unlimited)")
	f.IntVar(&req.TokensPerMinute, "tokens-per-minute", 0, "tokens per minute the key may use (0: unlimited)")
	idempotencyFlag(cmd, &idem)
	must(cmd.MarkFlagRequired("name"))
	return cmd
}

func (a *app) apiKeyList() *cobra.Command {
	return subList(a, "List a deployment's API keys with their usage (never their secrets)", "API keys",
		(*client.Client).ListAPIKeys, (*client.Client).AllAPIKeys, renderAPIKeys)
}

func (a *app) apiKeyGet() *cobra.Command {
	return subGet(a, "KEY", "Show an API key (dk_…) with its usage (never its secret)", (*client.Client).GetAPIKey, renderAPIKeys)
}

func (a *app) apiKeyDelete() *cobra.Command {
	return subDelete(a, "KEY", "Revoke an API key (dk_…): the deployment refuses it within a second", "API key", (*client.Client).DeleteAPIKey)
}
