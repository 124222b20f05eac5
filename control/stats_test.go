package control_test

import (
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

// The nodes are counted by state, and each new desired state's delay to
// the node's report that it applied it is observed once, on the control
// plane's clock.
func TestNodeStatesAndPropagationDelay(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	var mu sync.Mutex
	var delays []time.Duration
	e.srv.OnPropagation(func(d time.Duration) {
		mu.Lock()
		delays = append(delays, d)
		mu.Unlock()
	})
	got := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return append([]time.Duration(nil), delays...)
	}
	states := func(idle, serving, wiping, unreachable int) {
		t.Helper()
		want := map[string]int{control.NodeIdle: idle, control.NodeServing: serving, control.NodeWiping: wiping,
			control.NodeUnreachable: unreachable}
		if s := e.srv.NodesByState(); !maps.Equal(s, want) {
			t.Fatalf("nodes by state %v, want %v", s, want)
		}
	}

	n := e.enroll(hwM4)
	states(1, 0, 0, 0)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("prop")).must(t, 201))
	e.enroll(hwM4)
	states(1, 1, 0, 0)

	d := n.desired(t, 0)
	clk.add(3 * time.Second)
	n.report(t, applied(d, "192.0.2.7"))
	if ds := got(); len(ds) != 1 || ds[0] != 3*time.Second {
		t.Fatalf("delays %v, want [3s]", ds)
	}
	// Reports of a revision already applied are no propagation.
	clk.add(time.Second)
	n.report(t, applied(d, "192.0.2.7"))
	if ds := got(); len(ds) != 1 {
		t.Fatalf("delays %v after a second report of the same state", ds)
	}
	e.wantStatus(t, id, "running", "converged")

	// A change to the server is a new desired state.
	e.req("PATCH", "/v1/servers/"+id, map[string]any{"model": "model-q"}).must(t, 200)
	d = n.desired(t, d.Revision)
	clk.add(1500 * time.Millisecond)
	n.report(t, applied(d, "192.0.2.7"))
	if ds := got(); len(ds) != 2 || ds[1] != 1500*time.Millisecond {
		t.Fatalf("delays %v, want [3s 1.5s]", ds)
	}

	// Nodes not heard from within the node timeout are unreachable.
	clk.add(91 * time.Second)
	n.report(t, applied(d, "192.0.2.7"))
	states(0, 1, 0, 1)
}
