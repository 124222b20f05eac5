package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// newReplicas starts two control planes on one PostgreSQL database, as two
// replicas behind a load balancer would run.
func newReplicas(t *testing.T, mod func(*control.Config)) (a, b *env) {
	t.Helper()
	a = newEnvWith(t, mod, true, "")
	b = newEnvWith(t, mod, true, a.dbURL)
	return a, b
}

// TestReplicaReadsAndWakes: a write through one replica is read through the
// other at once, and a node long-polling one replica learns of a change
// made through the other without waiting out its poll.
func TestReplicaReadsAndWakes(t *testing.T) {
	a, b := newReplicas(t, nil)
	n := b.enroll(hwM4)
	id := idOf(t, a.req("POST", "/v1/servers", serverBody("web")).must(t, 201))
	if got := b.req("GET", "/v1/servers/"+id, nil).must(t, 200).obj(t)["name"]; got != "web" {
		t.Fatalf("replica B reads name %v", got)
	}
	d := n.desired(t, 0)
	if d.Server == nil || d.Server.ID != id {
		t.Fatalf("node (on B) desired %+v, want server %s", d, id)
	}

	// The node waits on B; the rule is added through A. Only a wake from
	// A's commit ends the wait before its minute.
	type result struct {
		d       nodeapi.Desired
		changed bool
		err     error
	}
	got := make(chan result, 1)
	go func() {
		d2, changed, err := n.client.Desired(context.Background(), d.Revision, time.Minute)
		got <- result{d2, changed, err}
	}()
	testutil.WaitFor(t, 30*time.Second, "the long-poll to wait on B", func() bool { return control.LongPollsWaiting(b.srv) == 1 })
	a.req("POST", "/v1/servers/"+id+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "source": "10.0.0.0/8", "action": "allow"}).must(t, 201)
	r := <-got
	if r.err != nil || !r.changed || r.d.Revision <= d.Revision || len(r.d.FirewallRules) != 1 {
		t.Fatalf("long-poll on B after a change on A: %+v changed %v err %v", r.d, r.changed, r.err)
	}
}

// TestReplicaCreatesShareNoNode: creates racing through both replicas take
// each node once; the losers get capacity_unavailable, and an
// Idempotency-Key replays through either replica.
func TestReplicaCreatesShareNoNode(t *testing.T) {
	a, b := newReplicas(t, nil)
	const nodes, creates = 6, 24
	var ns []node
	for range nodes {
		ns = append(ns, a.enroll(hwM4))
	}
	var wg sync.WaitGroup
	status := make([]int, creates)
	for i := range creates {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e := []*env{a, b}[i%2]
			status[i] = e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("race-%d", i))).status
		}()
	}
	wg.Wait()
	ok := 0
	for i, s := range status {
		switch s {
		case http.StatusCreated:
			ok++
		case http.StatusConflict:
		default:
			t.Errorf("create %d: status %d", i, s)
		}
	}
	if ok != nodes {
		t.Fatalf("%d creates succeeded over %d nodes", ok, nodes)
	}
	// Every node got one server, and every listed server is on a node.
	held := map[string]bool{}
	for _, n := range ns {
		d := n.desired(t, 0)
		if d.Server == nil || held[d.Server.ID] {
			t.Fatalf("node %s desired server %+v (already held: %v)", n.id, d.Server, d.Server != nil && held[d.Server.ID])
		}
		held[d.Server.ID] = true
	}
	for _, s := range walkServers(t, b) {
		if !held[s["id"].(string)] {
			t.Fatalf("server %s listed but on no node", s["id"])
		}
	}

	// The same Idempotency-Key through the other replica (same project,
	// same token) replays the first answer.
	key := map[string]any{"name": "k1", "public_key": mustKey(t)}
	first := a.req("POST", "/v1/ssh-keys", key, "Idempotency-Key", "idem-1").must(t, 201)
	again := a.reqAs(a.token, "POST", "/v1/ssh-keys", key, "Idempotency-Key", "idem-1")
	viaB := b.reqAs(a.token, "POST", "/v1/ssh-keys", key, "Idempotency-Key", "idem-1")
	for _, r := range []answer{again, viaB} {
		if r.status != 201 || r.hdr.Get("Idempotent-Replayed") != "true" || idOf(t, r) != idOf(t, first) {
			t.Fatalf("replay: status %d replayed %q body %s", r.status, r.hdr.Get("Idempotent-Replayed"), r.body)
		}
	}
}

// TestReplicaSweepsOnce: both replicas sweep, and a provision timeout
// fails the server once: one change, one revision for its node.
func TestReplicaSweepsOnce(t *testing.T) {
	clk := &fakeClock{t: time.Now().UTC().Truncate(time.Second)}
	mod := func(c *control.Config) {
		c.Now = clk.now
		c.SweepInterval = time.Hour
		c.ProvisionTimeout = time.Minute
		c.NodeTimeout = time.Hour
	}
	a, b := newReplicas(t, mod)
	n := a.enroll(hwM4)
	id := idOf(t, a.req("POST", "/v1/servers", serverBody("slow")).must(t, 201))
	d := n.desired(t, 0)
	clk.add(2 * time.Minute)
	var wg sync.WaitGroup
	for _, e := range []*env{a, b, a, b} {
		wg.Add(1)
		go func() { defer wg.Done(); e.sweep() }()
	}
	wg.Wait()
	a.wantStatus(t, id, "failed", "after the provision timeout")
	b.wantStatus(t, id, "failed", "after the provision timeout")
	d2, changed, err := n.client.Desired(context.Background(), d.Revision, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if changed && d2.Revision > d.Revision+1 {
		t.Fatalf("node revision moved %d → %d: the timeout was applied more than once", d.Revision, d2.Revision)
	}
}

func walkServers(t *testing.T, e *env) []map[string]any {
	t.Helper()
	var out []map[string]any
	path := "/v1/servers?limit=100"
	for {
		var page struct {
			Data       []map[string]any
			NextCursor *string `json:"next_cursor"`
		}
		e.req("GET", path, nil).must(t, 200).decode(t, &page)
		out = append(out, page.Data...)
		if page.NextCursor == nil {
			return out
		}
		path = "/v1/servers?limit=100&cursor=" + *page.NextCursor
	}
}

func mustKey(t *testing.T) string {
	t.Helper()
	pub, _ := newKey(t, "ed25519")
	return pub
}

// staleStore is a store whose lagging reader answers one key from a copy
// taken earlier, as a replica's read cache may for a moment before a
// commit's invalidation arrives.
type staleStore struct {
	store.KV
	mu    sync.Mutex
	key   string
	stale json.RawMessage
}

func (s *staleStore) Lagging() store.KV { return staleReader{s} }

type staleReader struct{ *staleStore }

func (r staleReader) Get(key string, v any) error {
	r.mu.Lock()
	stale := r.stale
	r.mu.Unlock()
	if key == r.key && stale != nil {
		return json.Unmarshal(stale, v)
	}
	return r.KV.Get(key, v)
}

// TestLaggingReadNeverRollsANodeBack: a long-poll whose lagging read finds
// the node at an older revision than the node itself has seen (a commit it
// learned of through a read that did not lag) asks the database before
// answering, instead of sending the node the older state as if the
// control plane had been restored from a backup.
func TestLaggingReadNeverRollsANodeBack(t *testing.T) {
	st := &staleStore{}
	e := newEnvWith(t, func(*control.Config) {}, false, "")
	e.wrap = func(kv store.KV) store.KV { st.KV = kv; return st }
	e.restart()
	n := e.enroll(hwM4)
	idOf(t, e.req("POST", "/v1/servers", serverBody("lag")).must(t, 201))
	d := n.desired(t, 0)
	st.mu.Lock()
	st.key = "ctl/node/" + n.id
	if err := e.st.Get(st.key, &st.stale); err != nil {
		t.Fatal(err)
	}
	st.mu.Unlock()
	e.req("POST", "/v1/servers/"+d.Server.ID+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "source": "10.0.0.0/8", "action": "allow"}).must(t, 201)
	var fresh json.RawMessage
	if err := e.st.Get(st.key, &fresh); err != nil {
		t.Fatal(err)
	}
	var rec struct{ Revision uint64 }
	_ = json.Unmarshal(fresh, &rec)
	if rec.Revision <= d.Revision {
		t.Fatalf("the rule did not give the node a new revision (%d, was %d)", rec.Revision, d.Revision)
	}
	// The node has seen the new revision; the lagging reader still says
	// the old one.
	got, changed, err := n.client.Desired(context.Background(), rec.Revision, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if changed {
		t.Fatalf("long-poll after revision %d answered revision %d: a lagging read rolled the node back", rec.Revision, got.Revision)
	}
}

// staleShared is staleStore on a shared database, so the control plane
// reads through it as a replica does.
type staleShared struct{ *staleStore }

func (s staleShared) Lock(ctx context.Context, read ...string) (store.KV, func(), error) {
	return s.KV.(store.Shared).Lock(ctx, read...)
}

func (s staleShared) Listen(ctx context.Context, fn func(payload string)) error {
	return s.KV.(store.Shared).Listen(ctx, fn)
}

// TestRevokedTokenChangesNothing: a change sent with a token revoked a
// moment before is refused even while the replica's cache still holds the
// token (its invalidation on the way): a change's token, first read from
// the cache, is read again under the change lock.
func TestRevokedTokenChangesNothing(t *testing.T) {
	st := &staleStore{}
	e := newEnvWith(t, nil, true, "")
	e.wrap = func(kv store.KV) store.KV { st.KV = kv; return staleShared{st} }
	e.restart()
	nt, err := control.CreateAPIToken(e.st, "doomed", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := newKey(t, "ed25519")
	e.reqAs(nt.Token, "POST", "/v1/ssh-keys", map[string]any{"name": "first", "public_key": pub}).must(t, 201)
	st.mu.Lock()
	st.key = control.TokenKey(nt.Token)
	if err := e.st.Get(st.key, &st.stale); err != nil {
		t.Fatal(err)
	}
	st.mu.Unlock()
	if err := control.RevokeToken(e.st, nt.ID); err != nil {
		t.Fatal(err)
	}
	pub2, _ := newKey(t, "ed25519")
	e.reqAs(nt.Token, "POST", "/v1/ssh-keys", map[string]any{"name": "second", "public_key": pub2}).
		wantErr(t, 401, control.CodeUnauthorized, "")
	e.reqAs(nt.Token, "GET", "/v1/ssh-keys", nil).wantErr(t, 401, control.CodeUnauthorized, "")
	// The refused change let the lock go: the next one goes through.
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "second", "public_key": pub2}).must(t, 201)
	var keys struct{ Data []json.RawMessage }
	e.req("GET", "/v1/ssh-keys", nil).must(t, 200).decode(t, &keys)
	if len(keys.Data) != 2 {
		t.Fatalf("%d SSH keys, want 2 (none by the revoked token)", len(keys.Data))
	}
}
