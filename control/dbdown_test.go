package control_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/nodeapi"
)

// TestPostgresDatabaseLost: with the database gone while serving, writes
// and reads answer 503 with Retry-After (never a 500, a hang or a 401 that
// would look like a revoked credential to a node), nothing changes, and
// the control plane serves again once the database is back, without a
// restart.
func TestPostgresDatabaseLost(t *testing.T) {
	db := pgtest.Start(t)
	e := newEnvWith(t, nil, true, db.NewDatabase(t))
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("a")).must(t, 201))

	if err := db.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for _, c := range []struct{ method, path string }{
		{"POST", "/v1/ssh-keys"}, {"DELETE", "/v1/servers/" + id}, {"GET", "/v1/servers/" + id}, {"GET", "/v1/servers"},
	} {
		var body any
		if c.method == "POST" {
			body = map[string]any{"name": "k", "public_key": mustKey(t)}
		}
		a := e.req(c.method, c.path, body)
		a.wantErr(t, http.StatusServiceUnavailable, control.CodeUnavailable, "")
		if a.hdr.Get("Retry-After") == "" {
			t.Errorf("%s %s: 503 without Retry-After", c.method, c.path)
		}
	}
	_, _, err := n.client.Desired(context.Background(), 0, time.Second)
	if err == nil || !isStatus(err, http.StatusServiceUnavailable) {
		t.Errorf("node long-poll with the database down: %v, want a 503", err)
	}
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("answering took %v with the database down", d)
	}

	if err := db.Restart(); err != nil {
		t.Fatal(err)
	}
	// The pool reconnects on the next request; the server was not touched.
	if got := e.status(id); got != "provisioning" {
		t.Fatalf("after the database is back: status %q, want provisioning (the DELETE must not have applied)", got)
	}
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": mustKey(t)}).must(t, 201)
	if d := n.desired(t, 0); d.Server == nil || d.Server.ID != id {
		t.Fatalf("node desired after recovery: %+v", d)
	}
}

func isStatus(err error, status int) bool {
	var ne *nodeapi.Error
	return errors.As(err, &ne) && ne.Status == status
}
