package control_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/store"
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

// nodeReads counts the node records read through the store.
type nodeReads struct {
	store.KV
	n atomic.Int64
}

func (r *nodeReads) Get(key string, v any) error {
	if strings.HasPrefix(key, "ctl/node/") {
		r.n.Add(1)
	}
	return r.KV.Get(key, v)
}

// TestSweepReadsNoNodeHeardFrom: a sweep decides a running server whose
// node was heard from a moment ago without reading the node's records (at
// 10 000 servers that was most of every sweep's work), and still reads
// them, and marks the server unreachable, once the node is silent.
func TestSweepReadsNoNodeHeardFrom(t *testing.T) {
	clk := &fakeClock{t: time.Now().UTC().Truncate(time.Second)}
	e := newEnvWith(t, func(c *control.Config) { c.Now, c.SweepInterval = clk.now, time.Hour }, false, "")
	reads := &nodeReads{}
	e.wrap = func(kv store.KV) store.KV { reads.KV = kv; return reads }
	e.restart()
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("heard")).must(t, 201))
	d := converge(t, n, "192.0.2.60")
	// Past the node timeout since the start, so that only the node's own
	// report keeps it from being silent.
	clk.add(2 * time.Minute)
	n.report(t, applied(d, ""))
	reads.n.Store(0)
	e.sweep()
	if got := reads.n.Load(); got != 0 {
		t.Fatalf("the sweep read %d node records for a server whose node just reported", got)
	}
	e.wantStatus(t, id, "running", "node heard from")
	clk.add(90 * time.Second)
	e.sweep()
	e.wantStatus(t, id, "unreachable", "node silent for the node timeout")
	if reads.n.Load() == 0 {
		t.Fatal("the silent node's server was decided without reading its node")
	}
}
