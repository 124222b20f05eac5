package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

// TestListsFollowCursors: without --all a list shows one page and says
// there is more; with --all it walks every page (of --limit items).
func TestListsFollowCursors(t *testing.T) {
	h := newHarness(t)
	var ids []string
	for _, k := range genKeys(t, 5) {
		var key client.SSHKey
		h.json(&key, "ssh-key", "add", "--public-key", k)
		ids = append(ids, key.ID)
	}
	slices.Reverse(ids) // newest first

	var page []client.SSHKey
	r := h.json(&page, "ssh-key", "list", "--limit", "2")
	if len(page) != 2 || page[0].ID != ids[0] || page[1].ID != ids[1] || !strings.Contains(r.err, "More SSH keys than shown") {
		t.Fatalf("one page: %v", r)
	}
	var all []client.SSHKey
	r = h.json(&all, "ssh-key", "list", "--all", "--limit", "2")
	if got := keyIDs(all); !slices.Equal(got, ids) || r.err != "" {
		t.Fatalf("--all in pages of 2: %v, want %v (%v)", got, ids, r)
	}
	table := h.ok("ssh-key", "list", "--all", "--limit", "3", "-o", "table").out
	rows := tableRows(t, table, "ID", "NAME", "TYPE", "FINGERPRINT", "AGE")
	if len(rows) != 5 || rows[4]["ID"] != ids[4] || rows[4]["NAME"] != "key0@test" || rows[0]["TYPE"] != "ssh-ed25519" {
		t.Fatalf("table: %v\n%s", rows, table)
	}
	var none []client.SSHKey
	if h.json(&none, "server", "list", "--all"); none == nil || len(none) != 0 {
		t.Fatalf("an empty list must be [], got %v", none)
	}
	h.fails(exitUsage, "ssh-key", "list", "--limit", "0")
	h.fails(exitUsage, "ssh-key", "list", "--limit", "101")
}

func keyIDs(keys []client.SSHKey) []string {
	var out []string
	for _, k := range keys {
		out = append(out, k.ID)
	}
	return out
}

// TestSSHKeyCommands: add from a file, stdin or the flag; private keys
// refused before anything is sent; delete by ID or name.
func TestSSHKeyCommands(t *testing.T) {
	h := newHarness(t)
	keys := genKeys(t, 3)
	dir := t.TempDir()
	pubFile := filepath.Join(dir, "id.pub")
	os.WriteFile(pubFile, []byte(keys[0]+"\n"), 0o644)
	privFile := filepath.Join(dir, "id")
	os.WriteFile(privFile, []byte("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn…\n-----END OPENSSH PRIVATE KEY-----\n"), 0o600)

	r := h.ok("ssh-key", "add", "--name", "laptop", "--public-key-from-file", pubFile, "-o", "table")
	for _, want := range []string{`ID:\s+sk_\w{24}`, `Name:\s+laptop`, `Type:\s+ssh-ed25519 \(256 bits\)`, `Fingerprint:\s+SHA256:`} {
		if !regexp.MustCompile(want).MatchString(r.out) {
			t.Errorf("add table lacks %s:\n%s", want, r.out)
		}
	}
	inv := h.startWith(keys[1]+"\n", "ssh-key", "add", "--name", "ci", "--public-key-from-file", "-", "-o", "json")
	if r := inv.wait(t); r.code != 0 || !strings.Contains(r.out, `"name": "ci"`) {
		t.Fatalf("add from stdin: %v", r)
	}
	if r := h.fails(exitUsage, "ssh-key", "add", "--public-key-from-file", privFile); !strings.Contains(r.err, "private key") {
		t.Fatalf("private key: %v", r)
	}
	h.fails(exitUsage, "ssh-key", "add", "--name", "x")                                              // no key
	h.fails(exitUsage, "ssh-key", "add", "--public-key", keys[2], "--public-key-from-file", pubFile) // both
	h.fails(exitError, "ssh-key", "add", "--public-key-from-file", filepath.Join(dir, "missing.pub"))
	r = h.fails(exitError, "ssh-key", "add", "--public-key", "ssh-ed25519 notbase64!", "-o", "table")
	if !strings.Contains(r.err, "param: public_key") {
		t.Fatalf("bad key: %v", r)
	}
	// The same key twice is a conflict naming the first.
	r = h.fails(exitConflict, "ssh-key", "add", "--name", "again", "--public-key", keys[0], "-o", "table")
	if !strings.Contains(r.err, "HTTP 409 conflict") {
		t.Fatalf("duplicate: %v", r)
	}

	// Two keys with one name: the name is refused, the ID works.
	var dup client.SSHKey
	h.json(&dup, "ssh-key", "add", "--name", "ci", "--public-key", keys[2])
	if r := h.fails(exitUsage, "ssh-key", "delete", "ci", "-o", "table"); !strings.Contains(r.err, "2 SSH keys are named") {
		t.Fatalf("ambiguous name: %v", r)
	}
	if r := h.ok("ssh-key", "delete", dup.ID, "-o", "table"); r.out != "SSH key "+dup.ID+" deleted.\n" {
		t.Fatalf("delete by ID: %v", r)
	}
	h.ok("ssh-key", "delete", "laptop")
	h.fails(exitNotFound, "ssh-key", "delete", "laptop")
	h.fails(exitNotFound, "ssh-key", "delete", dup.ID)
	var left []client.SSHKey
	if h.json(&left, "ssh-key", "list"); len(left) != 1 || left[0].Name != "ci" {
		t.Fatalf("left: %+v", left)
	}
}

// TestFirewallRuleCommands: add with defaults and canonical forms, list
// as table and JSON across pages, delete, and the API's refusals.
func TestFirewallRuleCommands(t *testing.T) {
	h := newHarness(t)
	h.ctl.StartNode(controltest.NodeOptions{})
	var srv client.Server
	h.json(&srv, "server", "create", "--name", "fw", "--chip", "cpu", "--ram", "1", "--storage", "1", "--stack", "bare")

	var ssh client.FirewallRule
	h.json(&ssh, "firewall-rule", "add", "--server", "fw", "--protocol", "tcp", "--port", "22", "--source", "198.51.100.7", "--description", "ssh")
	if ssh.Direction != client.Inbound || ssh.Action != client.Allow || *ssh.Source != "198.51.100.7/32" || ssh.ServerID != srv.ID {
		t.Fatalf("add with defaults: %+v", ssh)
	}
	r := h.ok("firewall-rule", "add", "--server", srv.ID, "--direction", "outbound", "--protocol", "udp", "--port", "53",
		"--destination", "2001:db8::1", "--action", "deny", "-o", "table")
	rows := tableRows(t, r.out, "ID", "DIRECTION", "PROTOCOL", "PORTS", "ADDRESS", "ACTION", "DESCRIPTION", "AGE")
	if len(rows) < 1 || rows[0]["ADDRESS"] != "2001:db8::1/128" || rows[0]["ACTION"] != "deny" || rows[0]["DESCRIPTION"] != "-" {
		t.Fatalf("add table: %v\n%s", rows, r.out)
	}
	h.ok("firewall-rule", "add", "--server", "fw", "--protocol", "icmp")

	var rules []client.FirewallRule
	h.json(&rules, "firewall-rule", "list", "--server", "fw", "--all", "--limit", "2")
	if len(rules) != 3 || rules[2].ID != ssh.ID || rules[0].Protocol != client.ICMP || rules[0].PortRange != nil {
		t.Fatalf("list --all: %+v", rules)
	}
	table := h.ok("firewall-rule", "list", "--server", "fw", "-o", "table").out
	rows = tableRows(t, table, "ID", "DIRECTION", "PROTOCOL", "PORTS", "ADDRESS", "ACTION", "DESCRIPTION", "AGE")
	if len(rows) != 3 || rows[0]["PORTS"] != "-" || rows[0]["ADDRESS"] != "any" || rows[2]["PORTS"] != "22" {
		t.Fatalf("list table: %v\n%s", rows, table)
	}

	r = h.fails(exitError, "firewall-rule", "add", "--server", "fw", "--protocol", "icmp", "--port", "22", "-o", "table")
	if !strings.Contains(r.err, "param: port_range") || !strings.Contains(r.err, "request id: req_") {
		t.Fatalf("icmp with a port: %v", r)
	}
	h.fails(exitConflict, "firewall-rule", "add", "--server", "fw", "--protocol", "tcp", "--port", "22", "--source", "198.51.100.7")
	h.fails(exitUsage, "firewall-rule", "add", "--server", "fw", "--protocol", "tcp", "--source", "a", "--destination", "b")
	h.fails(exitUsage, "firewall-rule", "add", "--protocol", "tcp")
	h.fails(exitNotFound, "firewall-rule", "list", "--server", "nosuch")

	var got client.FirewallRule
	h.json(&got, "firewall-rule", "get", ssh.ID, "--server", "fw")
	if got.ID != ssh.ID || got.PortRange == nil || *got.PortRange != "22" || got.Description != "ssh" {
		t.Fatalf("get: %+v", got)
	}
	one := tableRows(t, h.ok("firewall-rule", "get", ssh.ID, "--server", "fw", "-o", "table").out,
		"ID", "DIRECTION", "PROTOCOL", "PORTS", "ADDRESS", "ACTION", "DESCRIPTION", "AGE")
	if len(one) != 1 || one[0]["ID"] != ssh.ID || one[0]["PORTS"] != "22" {
		t.Fatalf("get table: %v", one)
	}
	h.fails(exitUsage, "firewall-rule", "get", "--server", "fw")

	if r := h.ok("firewall-rule", "delete", ssh.ID, "--server", "fw", "-o", "table"); r.out != "Firewall rule "+ssh.ID+" deleted.\n" {
		t.Fatalf("delete: %v", r)
	}
	r = h.fails(exitNotFound, "firewall-rule", "delete", ssh.ID, "--server", "fw", "-o", "table")
	if !strings.Contains(r.err, "param: rule_id") {
		t.Fatalf("delete again: %v", r)
	}
}

// TestAPIKeyCommands: the secret is printed at create, and never again.
func TestAPIKeyCommands(t *testing.T) {
	h := newHarness(t)
	h.ctl.StartNode(controltest.NodeOptions{})
	h.ctl.StartNode(controltest.NodeOptions{})
	h.ok("server", "create", "--name", "dep", "--chip", "cpu", "--ram", "1", "--storage", "1", "--model", "tiny:1b")
	h.ok("server", "create", "--name", "bare", "--chip", "cpu", "--ram", "1", "--storage", "1", "--stack", "bare")

	r := h.ok("api-key", "create", "--server", "dep", "--name", "app", "-o", "table")
	secret := regexp.MustCompile(`hearth_live_[0-9A-Za-z]{32}`).FindString(r.out)
	if secret == "" || !strings.Contains(r.out, "shown only this once") {
		t.Fatalf("create table must show the secret once: %v", r)
	}
	var created client.CreatedAPIKey
	before := time.Now()
	h.json(&created, "api-key", "create", "--server", "dep", "--name", "ci", "--expires-in", "720h",
		"--requests-per-minute", "60", "--tokens-per-minute", "1000")
	if created.Key == nil || *created.Key == secret || created.ExpiresAt == nil ||
		created.ExpiresAt.Sub(before) < 719*time.Hour || created.RequestsPerMinute != 60 || created.TokensPerMinute != 1000 {
		t.Fatalf("create JSON: %+v", created)
	}

	for _, out := range []string{"json", "table"} {
		r := h.ok("api-key", "list", "--server", "dep", "-o", out)
		if strings.Contains(r.out, secret) || strings.Contains(r.out, *created.Key) || strings.Contains(r.out, `"key"`) {
			t.Fatalf("list -o %s shows a secret:\n%s", out, r.out)
		}
	}
	table := h.ok("api-key", "list", "--server", "dep", "-o", "table").out
	rows := tableRows(t, table, "ID", "NAME", "HINT", "EXPIRES", "LIMITS", "REQUESTS", "TOKENS", "LAST USED", "AGE")
	if len(rows) != 2 || rows[0]["ID"] != created.ID || rows[0]["LIMITS"] != "60 req/min, 1000 tok/min" ||
		rows[1]["EXPIRES"] != "never" || rows[1]["LAST USED"] != "never" || rows[1]["HINT"] != "hearth_live_…"+secret[len(secret)-4:] {
		t.Fatalf("list table: %v\n%s", rows, table)
	}
	var keys []client.APIKey
	h.json(&keys, "api-key", "list", "--server", "dep", "--all", "--limit", "1")
	if len(keys) != 2 || keys[0].ID != created.ID {
		t.Fatalf("list --all --limit 1: %+v", keys)
	}

	// A replayed create (same Idempotency-Key) cannot show the secret: the
	// CLI says so and fails.
	h.ok("api-key", "create", "--server", "dep", "--name", "once", "--idempotency-key", "k-1")
	r = h.fails(exitError, "api-key", "create", "--server", "dep", "--name", "once", "--idempotency-key", "k-1")
	if !strings.Contains(r.err, "lost in transit") || strings.Contains(r.out, "hearth_live_") {
		t.Fatalf("replay: %v", r)
	}

	r = h.fails(exitConflict, "api-key", "create", "--server", "bare", "--name", "x", "-o", "table")
	if !strings.Contains(r.err, "HTTP 409 conflict") {
		t.Fatalf("bare server: %v", r)
	}
	h.fails(exitUsage, "api-key", "create", "--server", "dep", "--name", "x", "--expires-in", "1h", "--expires-at", "2030-01-01T00:00:00Z")
	h.fails(exitUsage, "api-key", "create", "--server", "dep", "--name", "x", "--expires-at", "tomorrow")
	r = h.fails(exitError, "api-key", "create", "--server", "dep", "--name", "x", "--requests-per-minute", "-1", "-o", "table")
	if !strings.Contains(r.err, "param: requests_per_minute") {
		t.Fatalf("negative limit: %v", r)
	}

	for _, out := range []string{"json", "table"} {
		r := h.ok("api-key", "get", created.ID, "--server", "dep", "-o", out)
		if strings.Contains(r.out, *created.Key) || strings.Contains(r.out, `"key"`) || !strings.Contains(r.out, created.ID) {
			t.Fatalf("get -o %s: shows a secret or not the key:\n%s", out, r.out)
		}
	}
	var got client.APIKey
	h.json(&got, "api-key", "get", created.ID, "--server", "dep")
	if got.ID != created.ID || got.Name != "ci" || got.RequestsPerMinute != 60 || got.ServerID != created.ServerID {
		t.Fatalf("get: %+v", got)
	}
	one := tableRows(t, h.ok("api-key", "get", created.ID, "--server", "dep", "-o", "table").out,
		"ID", "NAME", "HINT", "EXPIRES", "LIMITS", "REQUESTS", "TOKENS", "LAST USED", "AGE")
	if len(one) != 1 || one[0]["LIMITS"] != "60 req/min, 1000 tok/min" {
		t.Fatalf("get table: %v", one)
	}

	if r := h.ok("api-key", "delete", created.ID, "--server", "dep", "-o", "table"); r.out != fmt.Sprintf("API key %s deleted.\n", created.ID) {
		t.Fatalf("delete: %v", r)
	}
	h.fails(exitNotFound, "api-key", "delete", created.ID, "--server", "dep")
	h.fails(exitNotFound, "api-key", "get", created.ID, "--server", "dep")
}
