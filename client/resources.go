package client

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// segment escapes one ID for a path, refusing what would name another
// path ("", ".", "..").
func segment(id string) (string, error) {
	if id == "" || id == "." || id == ".." {
		return "", fmt.Errorf("invalid ID %q", id)
	}
	return url.PathEscape(id), nil
}

// path joins the escaped segments of a path under /v1.
func path(format string, ids ...string) (string, error) {
	args := make([]any, len(ids))
	for i, id := range ids {
		s, err := segment(id)
		if err != nil {
			return "", err
		}
		args[i] = s
	}
	return fmt.Sprintf(format, args...), nil
}

func (p ListParams) values() url.Values {
	q := url.Values{}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.Cursor != "" {
		q.Set("cursor", p.Cursor)
	}
	return q
}

func (p ListServersParams) values() url.Values {
	q := p.ListParams.values()
	if p.Status != "" {
		q.Set("status", string(p.Status))
	}
	return q
}

func get[T any](ctx context.Context, c *Client, p string, err error) (T, error) {
	return getQuery[T](ctx, c, p, err, nil)
}

func getQuery[T any](ctx context.Context, c *Client, p string, err error, q url.Values) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	_, err = c.do(ctx, request{method: http.MethodGet, path: p, query: q}, &out)
	return out, err
}

func (p ListActionsParams) values() url.Values {
	q := p.ListParams.values()
	if p.Status != "" {
		q.Set("status", string(p.Status))
	}
	return q
}

func (p UsageParams) values() url.Values {
	q := url.Values{"start": {p.Start.UTC().Format(time.RFC3339)}}
	if !p.End.IsZero() {
		q.Set("end", p.End.UTC().Format(time.RFC3339))
	}
	if p.Granularity != "" {
		q.Set("granularity", string(p.Granularity))
	}
	if p.GroupBy != "" {
		q.Set("group_by", string(p.GroupBy))
	}
	return q
}

func (p ListAuditLogParams) values() url.Values {
	q := p.ListParams.values()
	for name, t := range map[string]time.Time{"start": p.Start, "end": p.End} {
		if !t.IsZero() {
			q.Set(name, t.UTC().Format(time.RFC3339Nano))
		}
	}
	if p.TokenID != "" {
		q.Set("token_id", p.TokenID)
	}
	if p.ResourceID != "" {
		q.Set("resource_id", p.ResourceID)
	}
	return q
}

func create[T any](ctx context.Context, c *Client, p string, err error, body any) (T, error) {
	var out T
	if err != nil {
		return out, err
	}
	_, err = c.do(ctx, request{method: http.MethodPost, path: p, body: body}, &out)
	return out, err
}

func (c *Client) remove(ctx context.Context, p string, err error) error {
	if err != nil {
		return err
	}
	_, err = c.do(ctx, request{method: http.MethodDelete, path: p}, nil)
	return err
}

func list[T any](ctx context.Context, c *Client, p string, err error, q url.Values) (List[T], error) {
	var out List[T]
	if err != nil {
		return out, err
	}
	_, err = c.do(ctx, request{method: http.MethodGet, path: p, query: q}, &out)
	return out, err
}

// all walks a list page by page from the cursor in q, following
// next_cursor, and yields every item; an error is yielded once and ends
// the walk. Pages hold q's limit, or 100 (the most the API serves) if it
// sets none. Breaking out of the loop stops fetching.
func all[T any](ctx context.Context, c *Client, p string, err error, first url.Values) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		q := maps.Clone(first) // each walk starts over
		if err != nil {
			yield(zero, err)
			return
		}
		if !q.Has("limit") {
			q.Set("limit", "100")
		}
		for {
			page, err := list[T](ctx, c, p, nil, q)
			if err != nil {
				yield(zero, err)
				return
			}
			for _, item := range page.Data {
				if !yield(item, nil) {
					return
				}
			}
			if !page.HasMore || page.NextCursor == nil {
				return
			}
			q.Set("cursor", *page.NextCursor)
		}
	}
}

// CreateServer rents a server on a free node; it starts provisioning (see
// WaitServerRunning).
func (c *Client) CreateServer(ctx context.Context, req CreateServerRequest) (Server, error) {
	return create[Server](ctx, c, "/v1/servers", nil, req)
}

// ListServers returns one page of servers, newest first, their IP
// addresses masked.
func (c *Client) ListServers(ctx context.Context, p ListServersParams) (List[Server], error) {
	return list[Server](ctx, c, "/v1/servers", nil, p.values())
}

// AllServers yields every server from p's cursor on, newest first.
func (c *Client) AllServers(ctx context.Context, p ListServersParams) iter.Seq2[Server, error] {
	return all[Server](ctx, c, "/v1/servers", nil, p.values())
}

// GetServer returns a server, its IP address in full.
func (c *Client) GetServer(ctx context.Context, id string) (Server, error) {
	p, err := path("/v1/servers/%s", id)
	return get[Server](ctx, c, p, err)
}

// UpdateServer renames a server and/or orders another model; a new model
// makes the server updating until its node serves it.
func (c *Client) UpdateServer(ctx context.Context, id string, req UpdateServerRequest) (Server, error) {
	p, err := path("/v1/servers/%s", id)
	if err != nil {
		return Server{}, err
	}
	var out Server
	_, err = c.do(ctx, request{method: http.MethodPatch, path: p, body: req}, &out)
	return out, err
}

// DeleteServer deletes a server: it shows as deleting until its node has
// wiped it (see WaitServerGone).
func (c *Client) DeleteServer(ctx context.Context, id string) error {
	p, err := path("/v1/servers/%s", id)
	return c.remove(ctx, p, err)
}

// CreateSSHKey registers an SSH public key.
func (c *Client) CreateSSHKey(ctx context.Context, req CreateSSHKeyRequest) (SSHKey, error) {
	return create[SSHKey](ctx, c, "/v1/ssh-keys", nil, req)
}

// ListSSHKeys returns one page of SSH keys, newest first.
func (c *Client) ListSSHKeys(ctx context.Context, p ListParams) (List[SSHKey], error) {
	return list[SSHKey](ctx, c, "/v1/ssh-keys", nil, p.values())
}

// AllSSHKeys yields every SSH key from p's cursor on, newest first.
func (c *Client) AllSSHKeys(ctx context.Context, p ListParams) iter.Seq2[SSHKey, error] {
	return all[SSHKey](ctx, c, "/v1/ssh-keys", nil, p.values())
}

// GetSSHKey returns an SSH key.
func (c *Client) GetSSHKey(ctx context.Context, id string) (SSHKey, error) {
	p, err := path("/v1/ssh-keys/%s", id)
	return get[SSHKey](ctx, c, p, err)
}

// DeleteSSHKey deletes an SSH key and removes it from every server.
func (c *Client) DeleteSSHKey(ctx context.Context, id string) error {
	p, err := path("/v1/ssh-keys/%s", id)
	return c.remove(ctx, p, err)
}

// CreateFirewallRule adds a rule to a server.
func (c *Client) CreateFirewallRule(ctx context.Context, serverID string, req CreateFirewallRuleRequest) (FirewallRule, error) {
	p, err := path("/v1/servers/%s/firewall-rules", serverID)
	return create[FirewallRule](ctx, c, p, err, req)
}

// ListFirewallRules returns one page of a server's rules, newest first.
func (c *Client) ListFirewallRules(ctx context.Context, serverID string, lp ListParams) (List[FirewallRule], error) {
	p, err := path("/v1/servers/%s/firewall-rules", serverID)
	return list[FirewallRule](ctx, c, p, err, lp.values())
}

// AllFirewallRules yields every rule of a server from lp's cursor on.
func (c *Client) AllFirewallRules(ctx context.Context, serverID string, lp ListParams) iter.Seq2[FirewallRule, error] {
	p, err := path("/v1/servers/%s/firewall-rules", serverID)
	return all[FirewallRule](ctx, c, p, err, lp.values())
}

// GetFirewallRule returns one rule of a server.
func (c *Client) GetFirewallRule(ctx context.Context, serverID, ruleID string) (FirewallRule, error) {
	p, err := path("/v1/servers/%s/firewall-rules/%s", serverID, ruleID)
	return get[FirewallRule](ctx, c, p, err)
}

// DeleteFirewallRule deletes one rule of a server.
func (c *Client) DeleteFirewallRule(ctx context.Context, serverID, ruleID string) error {
	p, err := path("/v1/servers/%s/firewall-rules/%s", serverID, ruleID)
	return c.remove(ctx, p, err)
}

// CreateAPIKey issues a deployment API key for a deployment server. The
// answer is the only one that carries the secret (Key).
func (c *Client) CreateAPIKey(ctx context.Context, serverID string, req CreateAPIKeyRequest) (CreatedAPIKey, error) {
	p, err := path("/v1/servers/%s/api-keys", serverID)
	return create[CreatedAPIKey](ctx, c, p, err, req)
}

// ListAPIKeys returns one page of a server's API keys with their usage,
// newest first.
func (c *Client) ListAPIKeys(ctx context.Context, serverID string, lp ListParams) (List[APIKey], error) {
	p, err := path("/v1/servers/%s/api-keys", serverID)
	return list[APIKey](ctx, c, p, err, lp.values())
}

// AllAPIKeys yields every API key of a server from lp's cursor on.
func (c *Client) AllAPIKeys(ctx context.Context, serverID string, lp ListParams) iter.Seq2[APIKey, error] {
	p, err := path("/v1/servers/%s/api-keys", serverID)
	return all[APIKey](ctx, c, p, err, lp.values())
}

// GetAPIKey returns one API key of a server with its usage.
func (c *Client) GetAPIKey(ctx context.Context, serverID, keyID string) (APIKey, error) {
	p, err := path("/v1/servers/%s/api-keys/%s", serverID, keyID)
	return get[APIKey](ctx, c, p, err)
}

// DeleteAPIKey revokes an API key; its node refuses it within a second.
func (c *Client) DeleteAPIKey(ctx context.Context, serverID, keyID string) error {
	p, err := path("/v1/servers/%s/api-keys/%s", serverID, keyID)
	return c.remove(ctx, p, err)
}

// GetUsage returns the project's usage over p's window, bucket by bucket,
// ungrouped or grouped by server or API key.
func (c *Client) GetUsage(ctx context.Context, p UsageParams) (Usage, error) {
	return getQuery[Usage](ctx, c, "/v1/usage", nil, p.values())
}

// GetServerUsage returns a server's usage over p's window, ungrouped or by
// API key.
func (c *Client) GetServerUsage(ctx context.Context, id string, p UsageParams) (Usage, error) {
	path, err := path("/v1/servers/%s/usage", id)
	return getQuery[Usage](ctx, c, path, err, p.values())
}

// ListActions returns one page of the project's actions, newest first.
func (c *Client) ListActions(ctx context.Context, p ListActionsParams) (List[ServerAction], error) {
	return list[ServerAction](ctx, c, "/v1/actions", nil, p.values())
}

// AllActions yields every action of the project from p's cursor on.
func (c *Client) AllActions(ctx context.Context, p ListActionsParams) iter.Seq2[ServerAction, error] {
	return all[ServerAction](ctx, c, "/v1/actions", nil, p.values())
}

// ListServerActions returns one page of a server's actions, newest first.
func (c *Client) ListServerActions(ctx context.Context, id string, lp ListParams) (List[ServerAction], error) {
	p, err := path("/v1/servers/%s/actions", id)
	return list[ServerAction](ctx, c, p, err, lp.values())
}

// AllServerActions yields every action of a server from lp's cursor on.
func (c *Client) AllServerActions(ctx context.Context, id string, lp ListParams) iter.Seq2[ServerAction, error] {
	p, err := path("/v1/servers/%s/actions", id)
	return all[ServerAction](ctx, c, p, err, lp.values())
}

// GetAction returns an action.
func (c *Client) GetAction(ctx context.Context, id string) (ServerAction, error) {
	p, err := path("/v1/actions/%s", id)
	return get[ServerAction](ctx, c, p, err)
}

// ListAuditLog returns one page of the project's audit log, newest first.
func (c *Client) ListAuditLog(ctx context.Context, p ListAuditLogParams) (List[AuditLogEntry], error) {
	return list[AuditLogEntry](ctx, c, "/v1/audit-log", nil, p.values())
}

// AllAuditLog yields every entry of the audit log from p's cursor on.
func (c *Client) AllAuditLog(ctx context.Context, p ListAuditLogParams) iter.Seq2[AuditLogEntry, error] {
	return all[AuditLogEntry](ctx, c, "/v1/audit-log", nil, p.values())
}

// GetOpenAPI returns the API's OpenAPI document (no token needed).
func (c *Client) GetOpenAPI(ctx context.Context) ([]byte, error) {
	var raw json.RawMessage
	_, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/openapi.json"}, &raw)
	return raw, err
}
