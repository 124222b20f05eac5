package client_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

// TestClientHistory: usage over time, actions and the audit log through
// the client against a real hearth-control: the types decode the answers,
// the iterators walk real cursors, and WaitAction ends with the action.
func TestClientHistory(t *testing.T) {
	ctl := startControl(t, "--rate-limit", "1000", "--rate-burst", "1000")
	node := ctl.StartNode(controltest.NodeOptions{Hold: true})
	c := connect(t, ctl, ctl.Token)
	ctx := context.Background()

	srv, err := c.CreateServer(ctx, client.CreateServerRequest{Name: "meter", Chip: "cpu", RAM: 8, Storage: 40,
		Stack: client.StackDeployment, Model: "tiny:1b", Billing: client.BillingMonthly})
	if err != nil || srv.Action == nil || srv.Action.Command != client.CommandCreate || srv.Action.Status != client.ActionStatusRunning {
		t.Fatalf("create: %+v %v", srv.Action, err)
	}
	node.Pull(25, 100)
	var seen []int
	done := make(chan struct{})
	go func() {
		defer close(done)
		a, err := c.WaitAction(ctx, srv.Action.ID, client.WaitActionOptions{Interval: 20 * time.Millisecond,
			Progress: func(a client.ServerAction) { seen = append(seen, a.Progress) }})
		if err != nil || a.Status != client.ActionStatusSuccess || a.Progress != 100 || a.FinishedAt == nil {
			t.Errorf("wait action: %+v %v", a, err)
		}
	}()
	time.Sleep(100 * time.Millisecond)
	node.Release()
	<-done
	if !slices.Contains(seen, 25) {
		t.Fatalf("progress seen %v, want 25 among it", seen)
	}

	key, err := c.CreateAPIKey(ctx, srv.ID, client.CreateAPIKeyRequest{Name: "k"})
	if err != nil || key.Action == nil || key.Action.Command != client.CommandAPIKeyCreate {
		t.Fatalf("create key: %+v %v", key, err)
	}
	rule, err := c.CreateFirewallRule(ctx, srv.ID, client.CreateFirewallRuleRequest{Direction: client.Inbound,
		Protocol: client.ICMP, Action: client.Allow})
	if err != nil || rule.StartedAction == nil || rule.StartedAction.Command != client.CommandFirewallRuleAdd || rule.Action != client.Allow {
		t.Fatalf("create rule: %+v %v", rule, err)
	}

	// Usage: two reports of the key, by hour and by key.
	node.Use(key.ID, 3, 10, 80*time.Millisecond)
	node.Use(key.ID, 2, 10, 0)
	u, err := c.GetUsage(ctx, client.UsageParams{Start: time.Now().Add(-2 * time.Hour), Granularity: client.Hourly})
	if err != nil || len(u.Data) < 2 || u.GroupBy != nil {
		t.Fatalf("usage: %+v %v", u, err)
	}
	last := u.Data[len(u.Data)-1].Results[0]
	if last.Requests != 5 || last.PromptTokens != 20 || last.TTFTP50 == nil || *last.TTFTP50 <= 75 || *last.TTFTP50 > 100 {
		t.Fatalf("this hour: %+v", last)
	}
	su, err := c.GetServerUsage(ctx, srv.ID, client.UsageParams{Start: time.Now().Add(-time.Hour), GroupBy: client.ByAPIKey})
	if err != nil || *su.GroupBy != client.ByAPIKey || su.Data[len(su.Data)-1].Results[0].APIKeyID != key.ID {
		t.Fatalf("server usage by key: %+v %v", su, err)
	}
	var apiErr client.APIError
	if _, err := c.GetUsage(ctx, client.UsageParams{Start: time.Now(), End: time.Now().Add(-time.Hour)}); !errors.As(err, &apiErr) ||
		apiErr.StatusCode != 400 || apiErr.Param != "start" {
		t.Fatalf("start after end: %v", err)
	}

	// Actions: the server's, newest first, walked a page of one at a time.
	var cmds []client.ActionCommand
	for a, err := range c.AllServerActions(ctx, srv.ID, client.ListParams{Limit: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, a.Command)
	}
	if want := []client.ActionCommand{client.CommandFirewallRuleAdd, client.CommandAPIKeyCreate, client.CommandCreate}; !slices.Equal(cmds, want) {
		t.Fatalf("server actions %v, want %v", cmds, want)
	}
	ok, err := c.ListActions(ctx, client.ListActionsParams{Status: client.ActionStatusSuccess})
	if err != nil || len(ok.Data) < 1 {
		t.Fatalf("successful actions: %+v %v", ok, err)
	}

	// The audit log: every change above, by resource, walked by pages.
	var paths []string
	for e, err := range c.AllAuditLog(ctx, client.ListAuditLogParams{ListParams: client.ListParams{Limit: 2}, ResourceID: srv.ID}) {
		if err != nil {
			t.Fatal(err)
		}
		if e.TokenName == "" || e.SourceIP == "" || e.Status/100 != 2 {
			t.Fatalf("entry %+v", e)
		}
		paths = append(paths, e.Method+" "+e.Path)
	}
	want := []string{"POST /v1/servers/" + srv.ID + "/firewall-rules", "POST /v1/servers/" + srv.ID + "/api-keys", "POST /v1/servers"}
	if !slices.Equal(paths, want) {
		t.Fatalf("audit log %v, want %v", paths, want)
	}
}
