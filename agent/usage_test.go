package agent_test

import (
	"net/url"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/nodeapi"
)

// fakeBuckets is a node's sealed usage buckets: added by the test, taken
// by the agent's reports, dropped once acknowledged.
type fakeBuckets struct {
	mu      sync.Mutex
	seq     uint64
	pending []nodeapi.UsageBucket
	acks    int
}

// add seals n buckets of key, one request each, at the minute of now.
func (f *fakeBuckets) add(key string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for range n {
		f.seq++
		f.pending = append(f.pending, nodeapi.UsageBucket{Seq: f.seq, KeyID: key,
			Minute: time.Now().UTC().Truncate(time.Minute), Requests: 1, PromptTokens: 3})
	}
}

func (f *fakeBuckets) take(limit int) ([]nodeapi.UsageBucket, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := min(limit, len(f.pending))
	return append([]nodeapi.UsageBucket(nil), f.pending[:n]...), len(f.pending) > n, nil
}

func (f *fakeBuckets) accepted(seq uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acks++
	for len(f.pending) > 0 && f.pending[0].Seq <= seq {
		f.pending = f.pending[1:]
	}
	return nil
}

func (f *fakeBuckets) waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.pending)
}

// projectRequests is the project's requests over the last day, summed.
func (c *ctlPlane) projectRequests() uint64 {
	c.t.Helper()
	var u struct {
		Data []struct {
			Results []struct{ Requests uint64 }
		}
	}
	q := url.Values{"start": {time.Now().UTC().Add(-24 * time.Hour).Format(time.RFC3339)}, "granularity": {"hour"}}
	if code := c.api("GET", "/v1/usage?"+q.Encode(), nil, &u); code != 200 {
		c.t.Fatalf("GET usage: %d", code)
	}
	var n uint64
	for _, b := range u.Data {
		for _, r := range b.Results {
			n += r.Requests
		}
	}
	return n
}

// The agent reports its usage buckets with the observed state and drops
// them once accepted; what it keeps while the control plane is away
// arrives later, counted once; a backlog larger than a report goes in
// several, and the wipe is reported with the last of it, so the usage of
// a deleted server is complete.
func TestNodeAgentReportsUsageBuckets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		cfg := nodeConfig(t, ctl)
		b := &fakeBuckets{}
		cfg.UsageBuckets, cfg.UsageAccepted = b.take, b.accepted
		startAgent(t, cfg, nil)
		srv := ctl.createServer(map[string]any{"stack": "deployment", "model": "tiny"})
		var key struct{ ID string }
		if code := ctl.api("POST", "/v1/servers/"+srv+"/api-keys", map[string]any{"name": "k"}, &key); code != 201 {
			t.Fatalf("create key: %d", code)
		}
		within(t, time.Second, "running", func() bool { return ctl.serverStatus(srv) == "running" })

		b.add(key.ID, 3)
		within(t, time.Second, "buckets reported", func() bool { return ctl.projectRequests() == 3 })
		if w := b.waiting(); w != 0 {
			t.Fatalf("%d buckets kept after their report was accepted", w)
		}

		// The control plane away: the node keeps what it counts.
		ctl.stop()
		b.add(key.ID, 4)
		pass(time.Minute)
		if w := b.waiting(); w != 4 {
			t.Fatalf("%d buckets kept while the control plane was away, want 4", w)
		}
		ctl.start()
		within(t, 2*time.Minute, "kept buckets reported", func() bool { return ctl.projectRequests() == 7 })

		// A backlog over a report's bound, and the server deleted: the
		// wipe goes with the last of it.
		b.add(key.ID, 2*nodeapi.MaxUsageBuckets+10)
		if code := ctl.api("DELETE", "/v1/servers/"+srv, nil, nil); code != 204 {
			t.Fatalf("delete: %d", code)
		}
		within(t, 10*time.Second, "server gone", func() bool { return ctl.serverStatus(srv) == "gone" })
		if got, want := ctl.projectRequests(), uint64(7+2*nodeapi.MaxUsageBuckets+10); got != want {
			t.Fatalf("the deleted server's usage: %d requests, want %d", got, want)
		}
		if w := b.waiting(); w != 0 {
			t.Fatalf("%d buckets left", w)
		}
	})
}
