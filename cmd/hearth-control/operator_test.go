package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/certreload/certtest"
	"github.com/hearthd/hearth/internal/pgtest"
)

// TestMain lets a test run the real main (for its exit code) by starting
// this binary with HEARTH_CONTROL_TEST_MAIN set.
func TestMain(m *testing.M) {
	if os.Getenv("HEARTH_CONTROL_TEST_MAIN") == "1" {
		os.Args = append([]string{"hearth-control"}, strings.Fields(os.Getenv("HEARTH_CONTROL_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	code := m.Run()
	pg.Close()
	os.Exit(code)
}

// pg is this test binary's PostgreSQL, started on first use.
var pg pgtest.Shared

// cli runs one operator command against a state directory.
type cli struct {
	t        *testing.T
	stateDir string
	dbURL    string // --database-url for every command, if set
}

// flags are the location flags every command of this cli gets.
func (c cli) flags() []string {
	f := []string{"--state-dir", c.stateDir}
	if c.dbURL != "" {
		f = append(f, "--database-url", c.dbURL)
	}
	return f
}

// run runs the command in this process and returns its output.
func (c cli) run(args ...string) (stdout, stderr string, err error) {
	c.t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), append(args, c.flags()...), &out, &errOut)
	return out.String(), errOut.String(), err
}

func (c cli) must(args ...string) (stdout, stderr string) {
	c.t.Helper()
	out, errOut, err := c.run(args...)
	if err != nil {
		c.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out, errOut
}

// exitCode runs the real main with args in a child process.
func (c cli) exitCode(args ...string) (int, string) {
	c.t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "HEARTH_CONTROL_TEST_MAIN=1",
		"HEARTH_CONTROL_TEST_ARGS="+strings.Join(append(args, c.flags()...), " "))
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), errOut.String()
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return 0, errOut.String()
}

// serving starts hearth-control serve in this process on the state
// directory, so the commands go through its admin socket, and stops it
// when the test ends.
func (c cli) serving() {
	c.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	logs := &signalWriter{want: "control plane serving", seen: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", ""}, c.flags()...), logs, logs)
	}()
	select {
	case <-logs.seen:
	case err := <-done:
		cancel()
		c.t.Fatalf("serve: %v\n%s", err, logs.String())
	}
	c.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			c.t.Errorf("serve: %v", err)
		}
	})
}

// signalWriter collects a log and closes seen once a line holds want.
type signalWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestOperatorCommands runs the project and token commands on a stopped
// control plane (straight on the state) and on a running one (through its
// admin socket): the same answers, the same errors, and no secret ever
// printed but by tokens create.
func TestOperatorCommands(t *testing.T) {
	for _, mode := range []string{"offline", "through the admin socket", "on PostgreSQL", "on PostgreSQL while serving"} {
		t.Run(mode, func(t *testing.T) {
			c := cli{t: t, stateDir: t.TempDir()}
			if strings.HasPrefix(mode, "on PostgreSQL") {
				c.dbURL = pg.Get(t).NewDatabase(t)
			}
			if strings.HasSuffix(mode, "serving") || mode == "through the admin socket" {
				c.serving()
			}
			checkOperatorCommands(t, c)
		})
	}
}

func checkOperatorCommands(t *testing.T, c cli) {
	id, msg := c.must("projects", "create", "--name", "acme")
	id = strings.TrimSpace(id)
	if !strings.HasPrefix(id, "prj_") || !strings.Contains(msg, "(acme) created") {
		t.Fatalf("projects create: %q / %q", id, msg)
	}
	if _, _, err := c.run("projects", "create", "--name", "acme"); err == nil || !strings.Contains(err.Error(), `"acme" already exists`) {
		t.Fatalf("duplicate project: %v", err)
	}
	if _, _, err := c.run("projects", "create"); err == nil {
		t.Fatal("projects create without --name")
	}
	table, _ := c.must("projects", "list")
	if lines := strings.Split(strings.TrimSpace(table), "\n"); len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") ||
		!strings.Contains(table, " default ") || !strings.Contains(table, id+"  acme") {
		t.Fatalf("projects list:\n%s", table)
	}

	var secrets []string
	for _, tc := range []struct {
		args  []string
		scope string
	}{
		{[]string{"--project", "acme", "--name", "ci", "--read-only"}, control.ScopeReadOnly},
		{[]string{"--project", id}, control.ScopeReadWrite},
		{[]string{"--project", "default", "--name", "ops"}, control.ScopeReadWrite},
	} {
		out, msg := c.must(append([]string{"tokens", "create"}, tc.args...)...)
		tok := strings.TrimSpace(out)
		if !strings.HasPrefix(tok, "hct_") || !strings.Contains(msg, tc.scope) || strings.Contains(msg, tok) {
			t.Fatalf("tokens create %v: %q / %q", tc.args, out, msg)
		}
		secrets = append(secrets, tok)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"tokens", "create", "--project", "nope"}, `no project "nope"`},
		{[]string{"tokens", "create", "--name", "x"}, "needs --project"},
		{[]string{"tokens", "create", "--project", "acme", "--name", " padded"}, "token name"},
		{[]string{"tokens", "revoke", "tok_AAAAAAAAAAAAAAAAAAAAAAAA"}, `no API token "tok_AAAAAAAAAAAAAAAAAAAAAAAA"`},
		{[]string{"tokens", "revoke"}, "takes 1 argument"},
		{[]string{"tokens", "list", "--project", "nope"}, `no project "nope"`},
		{[]string{"tokens", "rotate"}, "usage: hearth-control tokens create|list|revoke"},
	} {
		out, _, err := c.run(bad.args...)
		if err == nil || !strings.Contains(err.Error(), bad.want) || out != "" {
			t.Errorf("%v: %v (stdout %q), want an error saying %q", bad.args, err, out, bad.want)
		}
	}

	noSecrets := func(what, out string) {
		t.Helper()
		for _, s := range secrets {
			if strings.Contains(out, s) || strings.Contains(out, s[4:24]) {
				t.Fatalf("%s shows a secret:\n%s", what, out)
			}
		}
	}
	table, _ = c.must("tokens", "list")
	noSecrets("tokens list", table)
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) != 4 || strings.Join(strings.Fields(lines[0]), " ") != "ID NAME PROJECT SCOPE CREATED LAST USED" {
		t.Fatalf("tokens list:\n%s", table)
	}
	out, _ := c.must("tokens", "list", "--project", "acme", "--json")
	noSecrets("tokens list --json", out)
	var tokens []control.TokenInfo
	if err := json.Unmarshal([]byte(out), &tokens); err != nil || len(tokens) != 2 {
		t.Fatalf("tokens list --json: %v\n%s", err, out)
	}
	for _, tk := range tokens {
		if tk.Project != id || tk.ProjectName != "acme" || tk.LastUsedAt != nil || tk.CreatedAt.IsZero() || !strings.HasPrefix(tk.ID, "tok_") {
			t.Fatalf("token %+v", tk)
		}
		if strings.Contains(strings.Join(strings.Fields(table), " "), tk.ID+" ") != true {
			t.Fatalf("token %s not in the table:\n%s", tk.ID, table)
		}
	}
	// Revoking: the ID may come before or after the flags.
	out, _ = c.must("tokens", "revoke", tokens[0].ID)
	if !strings.Contains(out, tokens[0].ID+" revoked") {
		t.Fatalf("tokens revoke: %q", out)
	}
	if _, _, err := c.run("tokens", "revoke", tokens[0].ID); err == nil || !strings.Contains(err.Error(), "no API token") {
		t.Fatalf("revoking twice: %v", err)
	}
	out, _ = c.must("tokens", "list", "--project", "acme", "--json")
	if err := json.Unmarshal([]byte(out), &tokens); err != nil || len(tokens) != 1 {
		t.Fatalf("after revoking: %v\n%s", err, out)
	}

	// The audit log: nothing was asked of the management API yet.
	if out, _ := c.must("audit-log", "--json", "--since", "24h"); strings.TrimSpace(out) != "[]" {
		t.Fatalf("audit-log --json: %q", out)
	}
	if table, _ := c.must("audit-log", "--project", "acme"); strings.Join(strings.Fields(table), " ") != "TIME PROJECT TOKEN SOURCE REQUEST STATUS RESOURCES" {
		t.Fatalf("audit-log: %q", table)
	}
	for args, want := range map[string]string{"--project nope": `no project "nope"`, "--since yesterday": "--since", "--limit 0": "--limit"} {
		if _, _, err := c.run(append([]string{"audit-log"}, strings.Fields(args)...)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("audit-log %s: %v, want an error saying %q", args, err, want)
		}
	}

	// The real binary's exit codes: 0, and non-zero for each refusal.
	if code, msg := c.exitCode("tokens", "list"); code != 0 {
		t.Fatalf("tokens list exit %d: %s", code, msg)
	}
	for _, args := range [][]string{{"tokens", "create", "--project", "nope"}, {"tokens", "revoke", "tok_nope"}, {"projects", "create", "--name", "acme"}} {
		if code, msg := c.exitCode(args...); code == 0 || !strings.Contains(msg, "hearth-control: ") {
			t.Errorf("%v: exit %d, stderr %q", args, code, msg)
		}
	}
}

// TestEnrollmentTokenShowsPin: with a certificate configured, enrollment
// tokens come with the fingerprint a node pins: the SHA-256 of the leaf.
func TestEnrollmentTokenShowsPin(t *testing.T) {
	dir := t.TempDir()
	certPEM, _ := certtest.NewCA(t).Issue(t, 7, time.Now().Add(time.Hour))
	path := filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(path, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	sum := sha256.Sum256(block.Bytes)
	c := cli{t: t, stateDir: dir}
	out, msg := c.must("enrollment-tokens", "create", "--tls-cert", path)
	if !strings.HasPrefix(strings.TrimSpace(out), "hce_") || !strings.Contains(msg, "--control-cert-sha256 "+hex.EncodeToString(sum[:])) {
		t.Fatalf("enrollment-tokens create: %q / %q", out, msg)
	}
	if _, msg := c.must("enrollment-tokens", "create"); strings.Contains(msg, "control-cert-sha256") {
		t.Fatalf("no certificate, yet a pin: %q", msg)
	}
}
