package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

var update = flag.Bool("update", false, "rewrite the golden files of TestTables")

// TestTables renders fixed items and compares with testdata/*.golden (go
// test -run TestTables -update rewrites them after a deliberate change).
func TestTables(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	str := func(s string) *string { return &s }
	rev := func(n int64) *int64 { return &n }
	reported := ago(5 * time.Second)
	running := client.Server{ID: "srv_AAAAAAAAAAAAAAAAAAAAAAAA", Name: "web", Status: client.StatusRunning, Chip: "cpu",
		RAM: 8, Storage: 40, Stack: client.StackDeployment, Model: "llama3.2:1b", DeploymentURL: "https://web.example.com/api/v1",
		Billing: "monthly", SSHKeyIDs: []string{"sk_BBBBBBBBBBBBBBBBBBBBBBBB"}, IP: str("203.0.113.7"),
		CreatedAt: ago(3 * time.Hour), UpdatedAt: ago(90 * time.Second),
		Enforcement: client.Enforcement{DesiredRevision: 42,
			Firewall: client.EnforcementConcern{Status: "applied", AppliedRevision: rev(42)},
			SSHKeys:  client.EnforcementConcern{Status: "applied", AppliedRevision: rev(42)},
			APIKeys:  client.EnforcementConcern{Status: "applied", AppliedRevision: rev(42)},
			Runtime: client.RuntimeEnforcement{Status: "applied", Healthy: true, Model: str("llama3.2:1b"), AppliedRevision: rev(42),
				Health: client.RuntimeHealthy, LastRestart: &client.RuntimeRestart{At: ago(20 * time.Minute),
					Reason: "wedged: nothing came back from 1 request(s) in flight for 10s, and a one-token probe got no answer in 5s"}},
			ReportedAt: &reported}}
	pulling := client.Server{ID: "srv_CCCCCCCCCCCCCCCCCCCCCCCC", Name: "big", Status: client.StatusUpdating, Chip: "m4",
		RAM: 64, Storage: 500, Stack: client.StackDeployment, Model: "llama3.1:70b", DeploymentURL: "https://big.example.com/api/v1",
		Billing: "monthly", SSHKeyIDs: []string{}, IP: str("198.51.x.x"), CreatedAt: ago(72 * time.Hour), UpdatedAt: ago(time.Minute),
		Enforcement: client.Enforcement{DesiredRevision: 50,
			Firewall: client.EnforcementConcern{Status: "failed", AppliedRevision: rev(48), Error: str("nft: no such table")},
			SSHKeys:  client.EnforcementConcern{Status: "applied", AppliedRevision: rev(50)},
			APIKeys:  client.EnforcementConcern{Status: "pending", AppliedRevision: rev(48)},
			Runtime: client.RuntimeEnforcement{Status: "pending", Healthy: false, Model: str("llama3.1:8b"), AppliedRevision: rev(47),
				Health:   client.RuntimeRestarting,
				Progress: &client.PullProgress{Status: "pulling 6a0746a1ec1a", Completed: 1 << 30, Total: 4 << 30}},
			ReportedAt: &reported}}
	bare := client.Server{ID: "srv_DDDDDDDDDDDDDDDDDDDDDDDD", Name: "build", Status: client.StatusProvisioning, Chip: "cpu",
		RAM: 4, Storage: 20, Stack: client.StackBare, Billing: "monthly", CreatedAt: ago(10 * time.Second), UpdatedAt: ago(10 * time.Second),
		Enforcement: client.Enforcement{Firewall: client.EnforcementConcern{Status: "pending"}, SSHKeys: client.EnforcementConcern{Status: "pending"},
			APIKeys: client.EnforcementConcern{Status: "pending"}, Runtime: client.RuntimeEnforcement{Status: "pending"}}}
	expires := now.Add(30 * 24 * time.Hour)
	used := ago(2 * time.Minute)
	keys := []client.APIKey{
		{ID: "dk_EEEEEEEEEEEEEEEEEEEEEEEE", ServerID: running.ID, Name: "ci", Hint: "hearth_live_…a1B2", CreatedAt: ago(time.Hour),
			ExpiresAt: &expires, RequestsPerMinute: 60, TokensPerMinute: 10000, Requests: 12, PromptTokens: 300, CompletionTokens: 900, LastUsedAt: &used},
		{ID: "dk_FFFFFFFFFFFFFFFFFFFFFFFF", ServerID: running.ID, Name: "my-app", Hint: "hearth_live_…Zz99", CreatedAt: ago(50 * 24 * time.Hour)},
	}
	rules := []client.FirewallRule{
		{ID: "fw_GGGGGGGGGGGGGGGGGGGGGGGG", ServerID: running.ID, Direction: client.Inbound, Protocol: client.TCP, PortRange: str("22"),
			Source: str("198.51.100.0/24"), Action: client.Allow, Description: "ssh from the office", CreatedAt: ago(time.Hour)},
		{ID: "fw_HHHHHHHHHHHHHHHHHHHHHHHH", ServerID: running.ID, Direction: client.Outbound, Protocol: client.UDP, PortRange: str("53"),
			Destination: str("2001:db8::1/128"), Action: client.Deny, CreatedAt: ago(time.Hour)},
		{ID: "fw_IIIIIIIIIIIIIIIIIIIIIIII", ServerID: running.ID, Direction: client.Inbound, Protocol: client.ICMP, Action: client.Allow, CreatedAt: ago(time.Hour)},
		{ID: "fw_JJJJJJJJJJJJJJJJJJJJJJJJ", ServerID: running.ID, Direction: client.Inbound, Protocol: client.TCP, Action: client.Deny, CreatedAt: ago(time.Hour)},
	}
	sshKeys := []client.SSHKey{{ID: "sk_BBBBBBBBBBBBBBBBBBBBBBBB", Name: "alice@laptop", PublicKey: testKey,
		Fingerprint: "SHA256:3ZqJ0bTkWzL3T1g7mLrKD3Zb0oQb8m2l7eP2tP0kqVw", Type: "ssh-ed25519", Bits: 256, CreatedAt: ago(26 * time.Hour)}}

	fin := ago(time.Hour - 3*time.Second)
	actions := []client.ServerAction{
		{ID: "act_KKKKKKKKKKKKKKKKKKKKKKKK", Command: client.CommandCreate, Status: client.ActionStatusRunning, Progress: 40,
			StartedAt: ago(time.Minute), Resources: []client.ActionResource{{Type: "server", ID: running.ID}}},
		{ID: "act_LLLLLLLLLLLLLLLLLLLLLLLL", Command: client.CommandFirewallRuleAdd, Status: client.ActionStatusError,
			StartedAt: ago(time.Hour), FinishedAt: &fin, Error: &client.ActionError{Code: "apply_failed", Message: "nft: no such table"},
			Resources: []client.ActionResource{{Type: "server", ID: running.ID}, {Type: "firewall_rule", ID: rules[0].ID}}},
	}
	p50, p95 := 120.5, 480.0
	day := func(i int) time.Time { return time.Date(2026, 11, 15+i, 0, 0, 0, 0, time.UTC) }
	byKey := client.ByAPIKey
	usage := client.Usage{Start: day(0), End: day(7), Granularity: client.Daily, GroupBy: &byKey}
	for i := range 7 {
		b := client.UsageBucket{Start: day(i), End: day(i + 1)}
		for k, key := range keys {
			r := client.UsageResult{ServerID: running.ID, APIKeyID: key.ID}
			if k == 0 || i == 6 {
				r.Requests, r.PromptTokens, r.CompletionTokens = int64(10*i+k), int64(100*i), int64(300*i)
				r.TTFTP50, r.TTFTP95 = &p50, &p95
			}
			b.Results = append(b.Results, r)
		}
		usage.Data = append(usage.Data, b)
	}
	total := client.Usage{Start: day(0), End: day(2), Granularity: client.Daily, Data: []client.UsageBucket{
		{Start: day(0), End: day(1), Results: []client.UsageResult{{}}},
		{Start: day(1), End: day(2), Results: []client.UsageResult{{Requests: 4, PromptTokens: 40, CompletionTokens: 80, ReasoningTokens: 8, Errors: 1, TTFTP50: &p50, TTFTP95: &p95}}}}}
	audit := []client.AuditLogEntry{{ID: "aud_MMMMMMMMMMMMMMMMMMMMMMMM", Time: ago(30 * time.Second), TokenID: "tok_NNNNNNNNNNNNNNNNNNNNNNNN",
		TokenName: "ci", Method: "DELETE", Path: "/v1/servers/" + running.ID, Status: 204, RequestID: "req_1", SourceIP: "198.51.100.7",
		ResourceIDs: []string{running.ID}, ActionIDs: []string{actions[0].ID}}}

	for _, tc := range []struct {
		name   string
		render func(*bytes.Buffer) error
	}{
		{"actions", func(b *bytes.Buffer) error { return renderActions(b, actions, now) }},
		{"action", func(b *bytes.Buffer) error { return renderAction(b, actions[1], now) }},
		{"usage-by-key", func(b *bytes.Buffer) error { return renderUsage(b, usage, true) }},
		{"usage", func(b *bytes.Buffer) error { return renderUsage(b, total, false) }},
		{"audit-log", func(b *bytes.Buffer) error { return renderAuditLog(b, audit, now) }},
		{"servers", func(b *bytes.Buffer) error { return renderServers(b, []client.Server{running, pulling, bare}, now) }},
		{"server-running", func(b *bytes.Buffer) error { return renderServer(b, running, now) }},
		{"server-updating", func(b *bytes.Buffer) error { return renderServer(b, pulling, now) }},
		{"server-bare", func(b *bytes.Buffer) error { return renderServer(b, bare, now) }},
		{"api-keys", func(b *bytes.Buffer) error { return renderAPIKeys(b, keys, now) }},
		{"api-key-created", func(b *bytes.Buffer) error {
			return renderCreatedAPIKey(b, client.CreatedAPIKey{APIKey: keys[1], Key: str("hearth_live_0123456789abcdefghijABCDEFGHZz99")})
		}},
		{"firewall-rules", func(b *bytes.Buffer) error { return renderRules(b, rules, now) }},
		{"ssh-keys", func(b *bytes.Buffer) error { return renderSSHKeys(b, sshKeys, now) }},
		{"ssh-key", func(b *bytes.Buffer) error { return renderSSHKey(b, sshKeys[0], now) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.render(&b); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if b.String() != string(want) {
				t.Fatalf("%s differs:\n--- got\n%s--- want\n%s", golden, b.String(), want)
			}
		})
	}
}

func TestAge(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 59 * time.Second: "59s", time.Minute: "1m", 59 * time.Minute: "59m",
		time.Hour: "1h", 47 * time.Hour: "47h", 48 * time.Hour: "2d", 400 * 24 * time.Hour: "400d",
	} {
		if got := age(now.Add(-d), now); got != want {
			t.Errorf("age(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestProgressLine: on a terminal the line is redrawn in place with the
// time waited; elsewhere a line is written only when it changes.
func TestProgressLine(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := start
	srv := client.Server{ID: "srv_1", Name: "web", Status: client.StatusProvisioning}
	srv.Enforcement.Firewall.Status, srv.Enforcement.SSHKeys.Status = client.EnforcementApplied, client.EnforcementApplied
	srv.Enforcement.APIKeys.Status, srv.Enforcement.Runtime.Status = client.EnforcementApplied, client.EnforcementPending
	srv.Enforcement.Runtime.Healthy, srv.Enforcement.ReportedAt = true, &start
	for _, tty := range []bool{true, false} {
		var b bytes.Buffer
		p := &progress{w: &b, tty: tty, now: func() time.Time { return now }, start: start}
		now = start
		p.update(srv)
		now = start.Add(2 * time.Second)
		p.update(srv)
		running := srv
		running.Status = client.StatusRunning
		p.update(running)
		p.done()
		want := "srv_1 (web): provisioning, model pending\nsrv_1 (web): running\n"
		if tty {
			want = "\r\033[Ksrv_1 (web): provisioning, model pending [0s]" +
				"\r\033[Ksrv_1 (web): provisioning, model pending [2s]" +
				"\r\033[Ksrv_1 (web): running [2s]\n"
		}
		if b.String() != want {
			t.Errorf("tty %v:\n%q\nwant\n%q", tty, b.String(), want)
		}
	}
}

// TestCompletion: the completion scripts, and dynamic completion of
// servers, SSH keys, contexts and enums through cobra's __complete.
func TestCompletion(t *testing.T) {
	h := newHarness(t)
	h.ctl.StartNode(controltest.NodeOptions{})
	var srv client.Server
	h.json(&srv, "server", "create", "--name", "web", "--chip", "cpu", "--ram", "1", "--storage", "1", "--stack", "bare")
	var key client.SSHKey
	h.json(&key, "ssh-key", "add", "--public-key", testKey)

	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		if r := h.ok("completion", shell); !strings.Contains(r.out, "hearth") || len(r.out) < 1000 {
			t.Errorf("completion %s: %.200s", shell, r.out)
		}
	}
	complete := func(args ...string) []string {
		r := h.ok(append([]string{"__complete"}, args...)...)
		lines := strings.Split(strings.TrimSpace(r.out), "\n")
		return lines[:len(lines)-1] // the last line is the directive
	}
	has := func(got []string, want ...string) {
		t.Helper()
		for _, w := range want {
			found := false
			for _, g := range got {
				found = found || strings.HasPrefix(g, w)
			}
			if !found {
				t.Errorf("completions %q lack %q", got, w)
			}
		}
	}
	has(complete("server", "get", ""), srv.ID+"\t", "web\t")
	has(complete("firewall-rule", "list", "--server", ""), srv.ID, "web")
	has(complete("ssh-key", "delete", ""), key.ID+"\talice@laptop")
	has(complete("server", "create", "--ssh-key", ""), key.ID)
	has(complete("server", "list", "--status", ""), "provisioning", "running", "updating", "failed", "unreachable", "deleting")
	has(complete("firewall-rule", "add", "--protocol", ""), "tcp", "udp", "icmp")
	has(complete("firewall-rule", "add", "--direction", ""), "inbound", "outbound")
	has(complete("server", "list", "-o", ""), "table", "json")
	has(complete("ser"), "server")
	h.env["HEARTH_TOKEN"] = "" // the context's token comes on stdin
	h.startWith(h.ctl.Token+"\n", "context", "create", "prod", "--url", h.ctl.URL).wait(t)
	has(complete("context", "use", ""), "prod\t"+h.ctl.URL)
}
