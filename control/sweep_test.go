package control_test

import (
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

// A sweep with nothing to change does not take the change lock (on a
// shared database a round trip that every change waits behind); one with
// an expired Idempotency-Key answer does, and purges it.
func TestIdleSweepTakesNoLock(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": func() string { p, _ := newKey(t, "ed25519"); return p }()},
		"Idempotency-Key", "idle-sweep").must(t, 201)
	e.sweep() // the token's last use written
	release, err := control.HoldChangeLock(e.srv)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			_ = release()
		}
	}()
	sweep := func() <-chan error {
		done := make(chan error, 1)
		go func() { done <- e.srv.Sweep() }()
		return done
	}
	select {
	case err := <-sweep():
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle sweep waited for the change lock")
	}
	released = true
	if err := release(); err != nil {
		t.Fatal(err)
	}
	clk.add(25 * time.Hour)
	if err := <-sweep(); err != nil {
		t.Fatal(err)
	}
	left := 0
	_ = e.st.Scan("ctl/idem/", "", false, func(string, []byte) (bool, error) { left++; return true, nil })
	if left != 0 {
		t.Fatalf("%d idempotency records left after expiry", left)
	}
}
