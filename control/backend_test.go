package control_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/store/pgstore"
)

// backendEnv selects the store the black-box suite runs on: unset for
// embedded Pebble, "postgres" for a private PostgreSQL (internal/pgtest).
// TestSuiteOnPostgres sets it for a second run of the suite.
const backendEnv = "HEARTH_CONTROL_TEST_BACKEND"

// pg is this test binary's PostgreSQL, started on first use.
var pgShared pgtest.Shared

func TestMain(m *testing.M) {
	code := m.Run()
	pgShared.Close()
	os.Exit(code)
}

func onPostgres() bool { return os.Getenv(backendEnv) == "postgres" }

// openBackend opens the env's store: Pebble in dir, or the test's own
// PostgreSQL database, made on first use and kept in *dbURL so a restart
// opens the same state.
func openBackend(t testing.TB, dir string, pg bool, dbURL *string) store.KV {
	t.Helper()
	if !pg {
		st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	if *dbURL == "" {
		*dbURL = pgShared.Get(t).NewDatabase(t)
	}
	st, err := pgstore.Open(context.Background(), *dbURL, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestSuiteOnPostgres runs this package's black-box API suite again with
// the control plane on PostgreSQL: every test but those that crash
// Pebble's own filesystem (crash_test.go) and the ones on Pebble's layout
// upgrade. The suite runs in a child of this test binary, so a plain
// `go test ./control` proves both backends.
func TestSuiteOnPostgres(t *testing.T) {
	if onPostgres() {
		t.Skip("this is the PostgreSQL run itself")
	}
	if testing.Short() {
		t.Skip("the PostgreSQL run of the suite is not short")
	}
	args := []string{"-test.count=1", "-test.skip", "^(TestSuiteOnPostgres|TestReplica.*|TestPostgres.*|TestCrash.*|TestMigrate.*|Fuzz.*)$"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), backendEnv+"=postgres")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the suite on PostgreSQL failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("the suite on PostgreSQL printed no PASS:\n%s", out)
	}
	t.Logf("the suite on PostgreSQL passed:\n%s", lastLines(string(out), 5))
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
