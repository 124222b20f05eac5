package control_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

// TokenIdentity answers as the API authenticates: the project and scope of
// a live token, ErrInvalidToken for a wrong or revoked one.
func TestTokenIdentity(t *testing.T) {
	e := newEnv(t, nil)
	p, err := control.CreateProject(e.st, "beta", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ro, err := control.CreateToken(e.st, control.TokenSpec{Project: p.ID, Name: "viewer", ReadOnly: true}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	id, err := e.srv.TokenIdentity(ro.Token)
	if err != nil || id.Project != p.ID || id.ProjectName != "beta" || id.Scope != control.ScopeReadOnly {
		t.Fatalf("read-only token: %+v %v", id, err)
	}
	if id, err := e.srv.TokenIdentity(e.token); err != nil || id.Scope != control.ScopeReadWrite || id.Project == p.ID {
		t.Fatalf("read-write token: %+v %v", id, err)
	}
	for _, bad := range []string{"", "hearth_live_x", ro.Token + "x", "Bearer " + ro.Token} {
		if _, err := e.srv.TokenIdentity(bad); !errors.Is(err, control.ErrInvalidToken) {
			t.Fatalf("token %q: %v", bad, err)
		}
	}
	if err := control.RevokeToken(e.st, ro.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.TokenIdentity(ro.Token); !errors.Is(err, control.ErrInvalidToken) {
		t.Fatalf("revoked token: %v", err)
	}
}
