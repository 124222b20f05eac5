package apikeys

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearthd/hearth/store"
)

type cliResult struct {
	stdout, stderr string
	err            error
}

func runCLI(t *testing.T, socket, stateDir string, args ...string) cliResult {
	t.Helper()
	var out, errOut bytes.Buffer
	err := RunCLI(t.Context(), args, &out, &errOut, socket, stateDir)
	return cliResult{out.String(), errOut.String(), err}
}

// createViaCLI runs "keys create" and returns the printed secret.
func createViaCLI(t *testing.T, socket, stateDir, name string) string {
	t.Helper()
	r := runCLI(t, socket, stateDir, "create", "--name", name)
	if r.err != nil {
		t.Fatalf("create: %v\n%s", r.err, r.stderr)
	}
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	if len(lines) != 1 || !secretRE.MatchString(lines[0]) {
		t.Fatalf("create printed %q; want the key alone on one line", r.stdout)
	}
	if !strings.Contains(r.stderr, "cannot be shown again") {
		t.Fatalf("create did not warn the key is shown once: %q", r.stderr)
	}
	return lines[0]
}

func TestCLIDirectStore(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	noDaemon := filepath.Join(t.TempDir(), "admin.sock")

	secret := createViaCLI(t, noDaemon, stateDir, "direct key")
	r := runCLI(t, noDaemon, stateDir, "list")
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !strings.Contains(r.stderr, "not running") {
		t.Fatalf("direct mode not announced on stderr: %q", r.stderr)
	}
	if strings.Contains(r.stdout, secret[len(Prefix):]) {
		t.Fatalf("list shows the secret:\n%s", r.stdout)
	}
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") {
		t.Fatalf("list output:\n%s", r.stdout)
	}
	fields := strings.Fields(lines[1])
	id := fields[0]
	if !idRE.MatchString(id) || !strings.Contains(lines[1], "direct key") ||
		!strings.Contains(lines[1], secret[len(secret)-4:]) {
		t.Fatalf("list row %q lacks id, name or hint", lines[1])
	}

	if r := runCLI(t, noDaemon, stateDir, "revoke", id); r.err != nil || !strings.Contains(r.stdout, id) {
		t.Fatalf("revoke: %v %q %q", r.err, r.stdout, r.stderr)
	}
	if r := runCLI(t, noDaemon, stateDir, "revoke", "key_missing"); !errors.Is(r.err, ErrNotFound) {
		t.Fatalf("revoke unknown: %v", r.err)
	}
	r = runCLI(t, noDaemon, stateDir, "list")
	// Created and revoked are both times ("…Z"); expires stays "-".
	if rows := strings.Split(r.stdout, "\n"); r.err != nil || len(rows) != 3 || strings.Count(rows[1], "Z ") != 2 {
		t.Fatalf("list after revoke (want a revocation time, not -): %v\n%s", r.err, r.stdout)
	}

	// The CLI's changes are in the state the daemon will open.
	st, err := store.Open(stateDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k, err := Open(st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(bearer(secret)); !errors.Is(err, ErrRevoked) {
		t.Fatalf("key revoked by the CLI: %v, want ErrRevoked", err)
	}
}

func TestCLIThroughDaemon(t *testing.T) {
	stateDir := t.TempDir()
	// The "daemon" holds the Pebble lock, so the CLI can only succeed
	// through the socket.
	_, k, _ := openDir(t, stateDir, nil)
	socket := startAdmin(t, k)

	secret := createViaCLI(t, socket, stateDir, "via daemon")
	got, err := k.Authenticate(bearer(secret))
	if err != nil || got.Name != "via daemon" {
		t.Fatalf("daemon does not know the CLI's key: %+v, %v", got, err)
	}
	k.RecordUsage(got.ID, 7, 11, 13)

	r := runCLI(t, socket, stateDir, "list")
	if r.err != nil || strings.Contains(r.stderr, "not running") {
		t.Fatalf("list: %v, stderr %q", r.err, r.stderr)
	}
	row := strings.Fields(strings.Split(strings.TrimSpace(r.stdout), "\n")[1])
	if tail := strings.Join(row[len(row)-3:], " "); tail != "7 11 13" {
		t.Fatalf("list usage columns %q, want \"7 11 13\":\n%s", tail, r.stdout)
	}

	if r := runCLI(t, socket, stateDir, "revoke", got.ID); r.err != nil {
		t.Fatalf("revoke: %v", r.err)
	}
	if _, err := k.Authenticate(bearer(secret)); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after CLI revoke: %v, want ErrRevoked", err)
	}
}

func TestCLIUsageErrors(t *testing.T) {
	stateDir := filepath.Join(t.TempDir(), "state")
	sock := filepath.Join(t.TempDir(), "admin.sock")
	for _, args := range [][]string{
		nil,
		{"frobnicate"},
		{"revoke"},
		{"revoke", "a", "b"},
		{"list", "extra"},
		{"create", "--name", ""},
		{"create", "--bogus"},
	} {
		if r := runCLI(t, sock, stateDir, args...); r.err == nil {
			t.Errorf("keys %q succeeded", args)
		}
	}
	// None of them touched the state.
	if r := runCLI(t, sock, stateDir, "list"); r.err != nil || strings.Count(r.stdout, "\n") != 1 {
		t.Fatalf("list after failed commands: %v\n%s", r.err, r.stdout)
	}
}

func TestCLIStateHeldWithoutSocket(t *testing.T) {
	stateDir := t.TempDir()
	// A daemon that holds the state but does not answer on the socket the
	// CLI was given: the CLI must fail, not write behind its back.
	_, k, _ := openDir(t, stateDir, nil)
	r := runCLI(t, filepath.Join(t.TempDir(), "other.sock"), stateDir, "create", "--name", "x")
	if r.err == nil {
		t.Fatalf("create succeeded while another process holds the state: %q", r.stdout)
	}
	t.Logf("error shown to the operator: %v", r.err)
	if r.stdout != "" {
		t.Fatalf("failed create printed %q", r.stdout)
	}
	if n := len(k.List()); n != 0 {
		t.Fatalf("daemon has %d keys, want 0", n)
	}
}
