package main

import (
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

// TestHistoryCommands: usage, action and audit-log against a real control
// plane and a fake node that reports usage.
func TestHistoryCommands(t *testing.T) {
	h := newHarness(t)
	node := h.ctl.StartNode(controltest.NodeOptions{})
	var srv client.Server
	h.json(&srv, "server", "create", "--name", "web", "--chip", "cpu", "--ram", "8", "--storage", "40", "--model", "tiny:1b", "--wait",
		"--poll-interval", "20ms")
	var key client.CreatedAPIKey
	h.json(&key, "api-key", "create", "--server", "web", "--name", "app")
	node.Use(key.ID, 7, 5, 40*time.Millisecond)

	var u client.Usage
	h.json(&u, "usage", "--server", "web", "--granularity", "hour", "--group-by", "api_key")
	last := u.Data[len(u.Data)-1].Results
	if u.Granularity != client.Hourly || len(u.Data) < 24 || len(last) != 1 || last[0].APIKeyID != key.ID || last[0].Requests != 7 {
		t.Fatalf("usage: %+v", u)
	}
	table := h.ok("usage", "--since", "2d", "-o", "table").out
	rows := tableRows(t, table[strings.Index(table, "\n")+1:], "REQUESTS", "PROMPT", "COMPLETION", "REASONING", "ERRORS", "TTFT P95")
	if len(rows) != 1 || rows[0]["REQUESTS"] != "7" || rows[0]["PROMPT"] != "5" || rows[0]["TTFT P95"] == "-" {
		t.Fatalf("usage table: %v\n%s", rows, table)
	}
	if r := h.fails(2, "usage", "--since", "yesterday"); !strings.Contains(r.err, "--since") {
		t.Fatalf("a bad --since: %v", r)
	}
	if r := h.fails(1, "usage", "--granularity", "minute", "-o", "table"); !strings.Contains(r.err, "param: granularity") {
		t.Fatalf("a bad granularity: %v", r)
	}

	var actions []client.ServerAction
	h.json(&actions, "action", "list", "--server", "web")
	if len(actions) != 2 || actions[0].Command != client.CommandAPIKeyCreate || actions[1].Command != client.CommandCreate ||
		actions[1].Status != client.ActionStatusSuccess {
		t.Fatalf("actions: %+v", actions)
	}
	var act client.ServerAction
	h.json(&act, "action", "get", actions[1].ID)
	if act.ID != actions[1].ID || act.Progress != 100 {
		t.Fatalf("action get: %+v", act)
	}
	if r := h.fails(2, "action", "list", "--server", "web", "--status", "running"); !strings.Contains(r.err, "--status") {
		t.Fatalf("--status with --server: %v", r)
	}
	h.fails(3, "action", "get", "act_AAAAAAAAAAAAAAAAAAAAAAAA")

	var entries []client.AuditLogEntry
	h.json(&entries, "audit-log", "list", "--resource", srv.ID, "--since", "1h")
	if len(entries) != 2 || entries[0].Path != "/v1/servers/"+srv.ID+"/api-keys" || entries[1].Path != "/v1/servers" {
		t.Fatalf("audit log: %+v", entries)
	}
	table = h.ok("audit-log", "list", "-o", "table").out
	if rows := tableRows(t, table, "TIME", "TOKEN", "SOURCE", "REQUEST", "STATUS", "RESOURCES"); len(rows) != 2 || rows[0]["STATUS"] != "201" {
		t.Fatalf("audit log table: %v\n%s", rows, table)
	}
}
