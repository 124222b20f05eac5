package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/store/pgstore"
)

// TestMigrateStore: a Pebble state copied into PostgreSQL serves the same
// projects and tokens (a token made on Pebble authenticates against a
// control plane on the database); a second copy into the now non-empty
// database is refused, as is a copy without a database.
func TestMigrateStore(t *testing.T) {
	pebble := cli{t: t, stateDir: t.TempDir()}
	pebble.must("projects", "create", "--name", "acme")
	tok, _ := pebble.must("tokens", "create", "--project", "acme", "--name", "ci")
	tok = strings.TrimSpace(tok)
	pebble.must("enrollment-tokens", "create", "--uses", "3")
	before, _ := pebble.must("tokens", "list", "--json")

	url := pg.Get(t).NewDatabase(t)
	out, _ := pebble.must("migrate-store", "--database-url", url)
	if !strings.HasPrefix(out, "copied ") || strings.HasPrefix(out, "copied 0 ") {
		t.Fatalf("migrate-store: %q", out)
	}
	if _, _, err := pebble.run("migrate-store", "--database-url", url); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("second migrate-store: %v, want a refusal of the non-empty database", err)
	}
	if _, _, err := pebble.run("migrate-store"); err == nil || !strings.Contains(err.Error(), "--database-url") {
		t.Fatalf("migrate-store without a database: %v", err)
	}

	onPG := cli{t: t, stateDir: t.TempDir(), dbURL: url}
	after, _ := onPG.must("tokens", "list", "--json")
	if after != before {
		t.Fatalf("tokens on PostgreSQL:\n%s\nwant as on Pebble:\n%s", after, before)
	}
	st, err := pgstore.Open(context.Background(), url, pgstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	srv, err := control.New(control.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	req, _ := http.NewRequest("GET", ts.URL+"/v1/servers", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("the migrated token against the database: %d", resp.StatusCode)
	}
}

// TestServeDatabaseDown: serve with a database that does not answer exits
// non-zero saying so, and never falls back to a Pebble state.
func TestServeDatabaseDown(t *testing.T) {
	c := cli{t: t, stateDir: t.TempDir(), dbURL: "postgres://hearth@127.0.0.1:1/hearth?connect_timeout=2"}
	code, msg := c.exitCode("serve", "--listen", "127.0.0.1:0", "--metrics-listen=")
	if code == 0 || !strings.Contains(msg, "database") || !strings.Contains(msg, "unavailable") {
		t.Fatalf("serve with the database down: exit %d, stderr %q", code, msg)
	}
	if _, err := os.Stat(filepath.Join(c.stateDir, "db")); !os.IsNotExist(err) {
		t.Fatalf("a Pebble state was made in the state dir: %v", err)
	}
}
