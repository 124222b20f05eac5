package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

var bins controltest.Binaries

func TestMain(m *testing.M) { os.Exit(controltest.Main(m, &bins)) }

func startControl(t *testing.T, args ...string) *controltest.Control {
	t.Helper()
	return controltest.Start(t, &bins, args...)
}

func connect(t *testing.T, ctl *controltest.Control, token string) *client.Client {
	t.Helper()
	c, err := client.New(ctl.URL, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

const testPub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL client@test"

// TestClientAgainstControlPlane drives every resource through a real
// hearth-control with a fake node: the types decode what the API answers,
// waits end as the lifecycle says, iterators walk real cursors, and errors
// carry what the API sent.
func TestClientAgainstControlPlane(t *testing.T) {
	ctl := startControl(t, "--rate-limit", "1000", "--rate-burst", "1000")
	node := ctl.StartNode(controltest.NodeOptions{})
	c := connect(t, ctl, ctl.Token)
	ctx := context.Background()
	fast := client.WaitOptions{Interval: 50 * time.Millisecond}
	if _, ok := c.RateLimit(); ok {
		t.Fatal("a rate limit before any answer")
	}

	key, err := c.CreateSSHKey(ctx, client.CreateSSHKeyRequest{Name: "laptop", PublicKey: testPub})
	// Every answer carries the token's budget: a bucket of 1000, one used.
	if rl, ok := c.RateLimit(); !ok || rl.Limit != 1000 || rl.Remaining != 999 || rl.At.IsZero() {
		t.Fatalf("rate limit after one request: %+v %v", rl, ok)
	}
	if err != nil || !strings.HasPrefix(key.Fingerprint, "SHA256:") || key.Type != "ssh-ed25519" || key.CreatedAt.IsZero() {
		t.Fatalf("create SSH key: %+v %v", key, err)
	}
	_, err = c.CreateSSHKey(ctx, client.CreateSSHKeyRequest{Name: "again", PublicKey: testPub})
	var apiErr client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 409 || apiErr.Code != client.CodeConflict ||
		!strings.Contains(apiErr.Message, key.ID) || !strings.HasPrefix(apiErr.RequestID, "req_") {
		t.Fatalf("duplicate key: %#v", err)
	}

	req := client.CreateServerRequest{Name: "web", Chip: "cpu", RAM: 8, Storage: 40, Stack: client.StackDeployment,
		Model: "tiny:1b", Billing: client.BillingMonthly, SSHKeyIDs: []string{key.ID}}
	srv, err := c.CreateServer(ctx, req)
	if err != nil || srv.Status != client.StatusProvisioning || srv.DeploymentURL != "http://web.deploy.test/api/v1" {
		t.Fatalf("create server: %+v %v", srv, err)
	}
	var statuses []client.ServerStatus
	srv, err = c.WaitServerRunning(ctx, srv.ID, client.WaitOptions{Interval: fast.Interval,
		Progress: func(s client.Server) { statuses = append(statuses, s.Status) }})
	if err != nil || srv.Status != client.StatusRunning || srv.IP == nil || *srv.IP != "203.0.113.7" ||
		srv.Enforcement.Runtime.Model == nil || *srv.Enforcement.Runtime.Model != "tiny:1b" || srv.Enforcement.ReportedAt == nil {
		t.Fatalf("wait running: %+v %v", srv, err)
	}
	if statuses[len(statuses)-1] != client.StatusRunning {
		t.Fatalf("progress %v", statuses)
	}
	if client.Diagnose(srv) != "" {
		t.Fatalf("a running server diagnosed %q", client.Diagnose(srv))
	}
	page, err := c.ListServers(ctx, client.ListServersParams{Status: client.StatusRunning})
	if err != nil || len(page.Data) != 1 || page.HasMore || page.NextCursor != nil || *page.Data[0].IP != "203.0.x.x" {
		t.Fatalf("list running: %+v %v", page, err)
	}

	// A model change: updating while the node still serves the old model.
	node.Hold()
	srv, err = c.UpdateServer(ctx, srv.ID, client.UpdateServerRequest{Model: "tiny:2b"})
	if err != nil || srv.Status != client.StatusUpdating || srv.Model != "tiny:2b" {
		t.Fatalf("update: %+v %v", srv, err)
	}
	node.Release()
	if srv, err = c.WaitServerRunning(ctx, srv.ID, fast); err != nil || *srv.Enforcement.Runtime.Model != "tiny:2b" {
		t.Fatalf("wait after update: %+v %v", srv, err)
	}

	// Firewall rules and API keys under the server.
	rule, err := c.CreateFirewallRule(ctx, srv.ID, client.CreateFirewallRuleRequest{Direction: client.Inbound,
		Protocol: client.TCP, PortRange: "22", Source: "198.51.100.7", Action: client.Allow, Description: "ssh"})
	if err != nil || rule.Source == nil || *rule.Source != "198.51.100.7/32" || rule.Destination != nil {
		t.Fatalf("create rule: %+v %v", rule, err)
	}
	if got, err := c.GetFirewallRule(ctx, srv.ID, rule.ID); err != nil || got.ID != rule.ID || *got.PortRange != "22" {
		t.Fatalf("get rule: %+v %v", got, err)
	}
	_, err = c.CreateFirewallRule(ctx, srv.ID, client.CreateFirewallRuleRequest{Direction: client.Inbound,
		Protocol: client.ICMP, PortRange: "22", Action: client.Allow})
	if !errors.As(err, &apiErr) || apiErr.Param != "port_range" {
		t.Fatalf("icmp with a port: %v", err)
	}
	expires := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	created, err := c.CreateAPIKey(ctx, srv.ID, client.CreateAPIKeyRequest{Name: "app", ExpiresAt: &expires, RequestsPerMinute: 60})
	if err != nil || created.Key == nil || !strings.HasPrefix(*created.Key, "hearth_live_") ||
		!created.ExpiresAt.Equal(expires) || created.RequestsPerMinute != 60 || created.LastUsedAt != nil {
		t.Fatalf("create API key: %+v %v", created, err)
	}
	got, err := c.GetAPIKey(ctx, srv.ID, created.ID)
	if err != nil || got.Hint != created.Hint || got.ID != created.ID {
		t.Fatalf("get API key: %+v %v", got, err)
	}
	// A replay of the creation answers the same key without its secret.
	idem := client.WithIdempotencyKey(ctx, "app-key-1")
	first, err := c.CreateAPIKey(idem, srv.ID, client.CreateAPIKeyRequest{Name: "ci"})
	if err != nil || first.Key == nil {
		t.Fatalf("create with a key: %+v %v", first, err)
	}
	replay, err := c.CreateAPIKey(idem, srv.ID, client.CreateAPIKeyRequest{Name: "ci"})
	if err != nil || replay.ID != first.ID || replay.Key != nil {
		t.Fatalf("replay: %+v %v", replay, err)
	}
	var keyIDs []string
	for k, err := range c.AllAPIKeys(ctx, srv.ID, client.ListParams{Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		keyIDs = append(keyIDs, k.ID)
	}
	if fmt.Sprint(keyIDs) != fmt.Sprint([]string{first.ID, created.ID}) {
		t.Fatalf("keys %v", keyIDs)
	}
	if err := c.DeleteAPIKey(ctx, srv.ID, created.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteAPIKey(ctx, srv.ID, created.ID); !errors.As(err, &apiErr) || apiErr.Param != "key_id" {
		t.Fatalf("delete again: %v", err)
	}
	if err := c.DeleteFirewallRule(ctx, srv.ID, rule.ID); err != nil {
		t.Fatal(err)
	}
	if page, err := c.ListFirewallRules(ctx, srv.ID, client.ListParams{}); err != nil || len(page.Data) != 0 {
		t.Fatalf("rules after delete: %+v %v", page, err)
	}

	// Bad input names its parameter; an unknown ID is a 404.
	_, err = c.CreateServer(ctx, client.CreateServerRequest{Name: "Bad Name", Chip: "cpu", RAM: 1, Storage: 1,
		Stack: client.StackBare, Billing: client.BillingMonthly})
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "name" {
		t.Fatalf("bad name: %v", err)
	}
	if _, err := c.GetServer(ctx, "srv_000000000000000000000000"); !client.IsNotFound(err) {
		t.Fatalf("unknown server: %v", err)
	}
	if _, err := c.ListSSHKeys(ctx, client.ListParams{Limit: 101}); !errors.As(err, &apiErr) || apiErr.Param != "limit" {
		t.Fatalf("limit 101: %v", err)
	}
	if _, err := connect(t, ctl, "hct_wrong").ListServers(ctx, client.ListServersParams{}); !client.HasCode(err, client.CodeUnauthorized) {
		t.Fatalf("wrong token: %v", err)
	}

	// Delete, and wait until the node has wiped it.
	if err := c.DeleteServer(ctx, srv.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitServerRunning(ctx, srv.ID, fast); !errors.Is(err, client.ErrServerDeleting) && !client.IsNotFound(err) {
		t.Fatalf("wait running on a deleted server: %v", err)
	}
	if err := c.WaitServerGone(ctx, srv.ID, fast); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSSHKey(ctx, key.ID); err != nil {
		t.Fatal(err)
	}

	doc, err := c.GetOpenAPI(ctx)
	file, _ := os.ReadFile("../control/openapi.json")
	if err != nil || !bytes.Equal(bytes.TrimSpace(doc), bytes.TrimSpace(file)) {
		t.Fatalf("served OpenAPI document differs from control/openapi.json (%v)", err)
	}
}

// TestIdempotentCreateAgainstControlPlane: the same Idempotency-Key makes
// one server, however often the create is sent.
func TestIdempotentCreateAgainstControlPlane(t *testing.T) {
	ctl := startControl(t)
	ctl.StartNode(controltest.NodeOptions{})
	ctl.StartNode(controltest.NodeOptions{})
	c := connect(t, ctl, ctl.Token)
	ctx := client.WithIdempotencyKey(context.Background(), "deploy-42")
	req := client.CreateServerRequest{Name: "once", Chip: "cpu", RAM: 1, Storage: 1, Stack: client.StackBare, Billing: client.BillingMonthly}
	a, err := c.CreateServer(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.CreateServer(ctx, req)
	if err != nil || b.ID != a.ID {
		t.Fatalf("second create: %+v %v, want the first answer", b, err)
	}
	req.Name = "other"
	if _, err := c.CreateServer(ctx, req); !client.HasCode(err, client.CodeIdempotencyConflict) {
		t.Fatalf("same key, other body: %v", err)
	}
	n := 0
	for _, err := range c.AllServers(context.Background(), client.ListServersParams{}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d servers, want 1", n)
	}
	// A bare server runs once its node is healthy: no model.
	srv, err := c.WaitServerRunning(context.Background(), a.ID, client.WaitOptions{Interval: 50 * time.Millisecond})
	if err != nil || srv.Model != "" || srv.DeploymentURL != "" || srv.Stack != client.StackBare {
		t.Fatalf("bare server: %+v %v", srv, err)
	}
}

// TestWaitEndsWhenTheServerFails: a node that never serves the model lets
// the provision timeout pass; the wait ends with ErrServerFailed.
func TestWaitEndsWhenTheServerFails(t *testing.T) {
	ctl := startControl(t, "--provision-timeout", "1s")
	ctl.StartNode(controltest.NodeOptions{Hold: true})
	c := connect(t, ctl, ctl.Token)
	ctx := context.Background()
	srv, err := c.CreateServer(ctx, client.CreateServerRequest{Name: "stuck", Chip: "cpu", RAM: 1, Storage: 1,
		Stack: client.StackDeployment, Model: "never:1b", Billing: client.BillingMonthly})
	if err != nil {
		t.Fatal(err)
	}
	srv, err = c.WaitServerRunning(ctx, srv.ID, client.WaitOptions{Interval: 100 * time.Millisecond})
	if !errors.Is(err, client.ErrServerFailed) || srv.Status != client.StatusFailed || !strings.Contains(err.Error(), "model pending") {
		t.Fatalf("wait: %+v %v", srv, err)
	}
}

// TestTLSAndScopesAgainstControlPlane: the client reaches an HTTPS
// control plane through a CA file (and is refused without it), and a
// read-only token's write is a 403 forbidden APIError.
func TestTLSAndScopesAgainstControlPlane(t *testing.T) {
	tlsArgs, caFile := controltest.TLSArgs(t)
	ctl := startControl(t, tlsArgs...)
	ctx := context.Background()

	plain := connect(t, ctl, ctl.Token)
	if _, err := plain.ListServers(ctx, client.ListServersParams{}); err == nil || errors.As(err, &client.APIError{}) {
		t.Fatalf("without the CA: %v, want a certificate error", err)
	}
	c, err := client.New(ctl.URL, client.WithToken(ctl.Token), client.WithCAFile(caFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSSHKey(ctx, client.CreateSSHKeyRequest{Name: "k", PublicKey: testPub}); err != nil {
		t.Fatal(err)
	}
	ro, _ := client.New(ctl.URL, client.WithToken(ctl.NewToken("default", "viewer", true)), client.WithCAFile(caFile))
	if page, err := ro.ListSSHKeys(ctx, client.ListParams{}); err != nil || len(page.Data) != 1 {
		t.Fatalf("read-only list: %+v %v", page, err)
	}
	_, err = ro.CreateSSHKey(ctx, client.CreateSSHKeyRequest{Name: "k2", PublicKey: testPub})
	var apiErr client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 403 || apiErr.Code != client.CodeForbidden || apiErr.RequestID == "" {
		t.Fatalf("read-only write: %#v", err)
	}
}
