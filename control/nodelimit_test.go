package control_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
)

// TestTenantsChangesNeverThrottleItsNode: a burst of a tenant's changes,
// far beyond the node's own request rate, wakes the node for each, and the
// node's long-polls and its reports of each change are never refused with
// 429: the changes pay for them. What the node does of its own accord is
// still throttled, the changes' credit capped.
func TestTenantsChangesNeverThrottleItsNode(t *testing.T) {
	const burst = 4
	e, _ := newClockEnv(t, func(c *control.Config) { c.NodeRateLimit, c.NodeRateBurst = 1, burst })
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("busy")).must(t, 201))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := n.desired(t, 0)
	if err := n.client.ReportObserved(ctx, applied(d, "")); err != nil {
		t.Fatal(err)
	}

	// The node as its agent runs: poll, apply, report, poll again.
	var (
		mu      sync.Mutex
		last    = d.Revision
		refused []error
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		after := d.Revision
		for ctx.Err() == nil {
			got, changed, err := n.client.Desired(ctx, after, 5*time.Second)
			if err == nil && changed {
				after = got.Revision
				err = n.client.ReportObserved(ctx, applied(got, ""))
			}
			if err != nil && ctx.Err() == nil {
				mu.Lock()
				refused = append(refused, err)
				mu.Unlock()
				return
			}
			mu.Lock()
			last = after
			mu.Unlock()
		}
	}()

	const changes = 60
	for i := range changes {
		e.req("POST", "/v1/servers/"+id+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
			"port_range": fmt.Sprint(1000 + i), "action": "allow"}).must(t, 201)
	}
	want := d.Revision + changes
	deadline := time.Now().Add(time.Minute)
	for {
		mu.Lock()
		got, errs := last, refused
		mu.Unlock()
		if len(errs) > 0 {
			t.Fatalf("the node was refused under its tenant's burst of changes: %v", errs)
		}
		if got == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node reached revision %d, want %d", got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done

	// On its own the node is throttled after its bucket and what is left
	// of the credit (the clock stands still: nothing refills).
	for i := 0; ; i++ {
		_, _, err := n.client.Desired(context.Background(), 0, 0)
		var ne *nodeapi.Error
		if errors.As(err, &ne) && ne.Status == 429 {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i > 2*burst {
			t.Fatalf("%d re-fetches of the desired state, none throttled", i)
		}
	}
}
