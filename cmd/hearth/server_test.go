package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

// TestServerLifecycle walks a deployment through the CLI: an SSH key from
// ~/.ssh, create --wait (provisioning → running, with progress), list and
// get as table and JSON, update --wait (updating → running), delete --wait
// (deleting → gone).
func TestServerLifecycle(t *testing.T) {
	h := newHarness(t)
	node := h.ctl.StartNode(controltest.NodeOptions{Hold: true})
	if err := os.MkdirAll(filepath.Join(h.env["HOME"], ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.env["HOME"], ".ssh", "id_ed25519.pub"), []byte(testKey+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var key client.SSHKey
	h.json(&key, "ssh-key", "add", "--public-key-from-file", "~/.ssh/id_ed25519.pub")
	if key.Name != "alice@laptop" || key.PublicKey != testKey || !strings.HasPrefix(key.Fingerprint, "SHA256:") {
		t.Fatalf("key %+v: want the file's key named by its comment", key)
	}

	// create --wait: the node holds the model, so the wait shows
	// provisioning until it is released.
	inv := h.start("server", "create", "--name", "web", "--chip", "cpu", "--ram", "8", "--storage", "40",
		"--model", "tiny:1b", "--ssh-key", "alice@laptop", "--wait", "--poll-interval", "20ms", "-o", "json")
	waitStderr(t, inv, "(web): provisioning, model pending")
	node.Pull(25, 100) // the wait shows its create action's progress
	waitStderr(t, inv, "running 25%]")
	node.Release()
	r := inv.wait(t)
	var srv client.Server
	if r.code != 0 || decode(t, r.out, &srv) != nil || srv.Status != client.StatusRunning ||
		len(srv.SSHKeyIDs) != 1 || srv.SSHKeyIDs[0] != key.ID || *srv.IP != "203.0.113.7" {
		t.Fatalf("create --wait: %v", r)
	}
	if !regexp.MustCompile(`\(web\): running \[create act_\w+ success 100%\]\n$`).MatchString(r.err) {
		t.Fatalf("progress did not end with running:\n%s", r.err)
	}

	// list and get, as JSON and as tables.
	var list []client.Server
	h.json(&list, "server", "list")
	if len(list) != 1 || list[0].ID != srv.ID || *list[0].IP != "203.0.x.x" {
		t.Fatalf("list: %+v", list)
	}
	table := h.ok("server", "list", "-o", "table").out
	rows := tableRows(t, table, "ID", "NAME", "STATUS", "STACK", "MODEL", "CHIP", "RAM", "STORAGE", "IP", "AGE")
	if len(rows) != 1 || rows[0]["ID"] != srv.ID || rows[0]["STATUS"] != "running" || rows[0]["MODEL"] != "tiny:1b" ||
		rows[0]["IP"] != "203.0.x.x" || rows[0]["RAM"] != "8 GB" {
		t.Fatalf("list table: %v\n%s", rows, table)
	}
	if r := h.ok("server", "list", "--status", "failed", "-o", "table"); strings.Count(r.out, "\n") != 1 {
		t.Fatalf("list --status failed: want the header only:\n%s", r.out)
	}
	get := h.ok("server", "get", "web", "-o", "table").out
	for _, want := range []string{`ID:\s+` + srv.ID, `Status:\s+running`, `Deployment URL:\s+http://web.deploy.test/api/v1`,
		`IP:\s+203\.0\.113\.7`, `SSH keys:\s+` + key.ID, `runtime:\s+applied \(revision \d+\), serving tiny:1b`} {
		if !regexp.MustCompile(want).MatchString(get) {
			t.Errorf("get table lacks %s:\n%s", want, get)
		}
	}
	var got client.Server
	h.json(&got, "server", "get", srv.ID)
	if got.ID != srv.ID || got.Enforcement.Firewall.Status != client.EnforcementApplied {
		t.Fatalf("get by ID: %+v", got)
	}

	// update --wait: updating until the node serves the new model.
	node.Hold()
	inv = h.start("server", "update", "web", "--model", "tiny:2b", "--wait", "--poll-interval", "20ms", "-o", "json")
	waitStderr(t, inv, "(web): updating")
	node.Release()
	r = inv.wait(t)
	if r.code != 0 || decode(t, r.out, &got) != nil || got.Status != client.StatusRunning || got.Model != "tiny:2b" ||
		*got.Enforcement.Runtime.Model != "tiny:2b" {
		t.Fatalf("update --wait: %v", r)
	}
	// A rename needs no wait; the deployment URL follows.
	h.json(&got, "server", "update", "web", "--name", "web2", "--wait")
	if got.Name != "web2" || got.DeploymentURL != "http://web2.deploy.test/api/v1" {
		t.Fatalf("rename: %+v", got)
	}
	h.fails(exitUsage, "server", "update", "web2")

	// delete --wait: deleting until the node reports the wipe.
	node.Hold()
	inv = h.start("server", "delete", "web2", "--wait", "--poll-interval", "20ms", "-o", "table")
	waitStderr(t, inv, "(web2): deleting")
	node.Release()
	if r = inv.wait(t); r.code != 0 || r.out != "Server "+srv.ID+" deleted.\n" || !strings.Contains(r.err, "(web2): deleting, waiting for the node to wipe it") {
		t.Fatalf("delete --wait: %v", r)
	}
	h.fails(exitNotFound, "server", "get", srv.ID)
	h.fails(exitNotFound, "server", "delete", "web2")

	// Without --wait, create answers provisioning at once and delete says
	// the server is being deleted.
	node.Hold()
	var bare client.Server
	h.json(&bare, "server", "create", "--name", "bare", "--chip", "cpu", "--ram", "1", "--storage", "1", "--stack", "bare")
	if bare.Status != client.StatusProvisioning || bare.Stack != client.StackBare || bare.Model != "" {
		t.Fatalf("create bare: %+v", bare)
	}
	if r := h.ok("server", "delete", bare.ID, "-o", "json"); r.out != "" || !strings.Contains(r.err, "being deleted") {
		t.Fatalf("delete -o json: stdout must stay empty of prose: %v", r)
	}
}

// TestWaitEndings: a server that turns failed ends --wait with exit 7
// (and is shown); --wait-timeout ends it with exit 8; neither stops the
// server's change.
func TestWaitEndings(t *testing.T) {
	h := newHarness(t, "--provision-timeout", "1s")
	h.ctl.StartNode(controltest.NodeOptions{Hold: true})
	h.ctl.StartNode(controltest.NodeOptions{Hold: true})
	r := h.fails(exitWaitTimeout, "server", "create", "--name", "slow", "--chip", "cpu", "--ram", "1", "--storage", "1",
		"--model", "never:1b", "--wait", "--wait-timeout", "200ms", "--poll-interval", "20ms", "-o", "json")
	if r.out != "" || !strings.Contains(r.err, "wait-timeout") {
		t.Fatalf("wait timeout: %v", r)
	}
	r = h.fails(exitFailed, "server", "create", "--name", "stuck", "--chip", "cpu", "--ram", "1", "--storage", "1",
		"--model", "never:1b", "--wait", "--poll-interval", "50ms", "-o", "json")
	var srv client.Server
	if decode(t, r.out, &srv) != nil || srv.Status != client.StatusFailed || !strings.Contains(r.err, "server failed") ||
		!strings.Contains(r.err, "model pending") {
		t.Fatalf("failed server: %v", r)
	}
}

// tableRows parses a table: the header must be exactly cols; each row is
// split at the header's column starts.
func tableRows(t *testing.T, table string, cols ...string) []map[string]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if !sameHeader(lines[0], cols) {
		t.Fatalf("header %q, want %v", lines[0], cols)
	}
	starts := make([]int, len(cols))
	from := 0
	for i, c := range cols {
		starts[i] = from + strings.Index(lines[0][from:], c)
		from = starts[i] + len(c)
	}
	var rows []map[string]string
	for _, l := range lines[1:] {
		row := map[string]string{}
		for i, c := range cols {
			end := len(l)
			if i+1 < len(cols) {
				end = min(starts[i+1], len(l))
			}
			row[c] = strings.TrimSpace(l[min(starts[i], len(l)):end])
		}
		rows = append(rows, row)
	}
	return rows
}

// sameHeader reports whether line is the column names in order, with
// nothing else (a name may hold a space: LAST USED).
func sameHeader(line string, cols []string) bool {
	rest := line
	for _, c := range cols {
		i := strings.Index(rest, c)
		if i < 0 || strings.TrimSpace(rest[:i]) != "" {
			return false
		}
		rest = rest[i+len(c):]
	}
	return strings.TrimSpace(rest) == ""
}

func decode(t *testing.T, s string, v any) error {
	t.Helper()
	err := json.Unmarshal([]byte(s), v)
	if err != nil {
		t.Errorf("not JSON: %v\n%s", err, s)
	}
	return err
}
