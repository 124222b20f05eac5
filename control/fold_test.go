package control_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// Reports that arrive while the change lock is busy are applied in one
// change; a refused one among them is answered alone and costs the others
// nothing.
func TestReportsFoldIntoOneChange(t *testing.T) {
	e, _ := newClockEnv(t, nil)
	const count = 6
	nodes := make([]node, count)
	ids := make([]string, count)
	desired := make([]nodeapi.Desired, count)
	for i := range nodes {
		nodes[i] = e.enroll(hwM4)
	}
	for i := range nodes {
		e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("fold-%d", i))).must(t, 201)
	}
	for i, n := range nodes {
		desired[i] = n.desired(t, 0)
		ids[i] = desired[i].Server.ID
	}
	// The report of the last node claims a revision never issued.
	reports := make([]nodeapi.Observed, count)
	for i := range reports {
		reports[i] = applied(desired[i], fmt.Sprintf("192.0.2.%d", 10+i))
	}
	reports[count-1].Revision += 100

	before := control.ReportChanges(e.srv)
	release, wait := queueReports(t, e, nodes, reports)
	if got := control.ReportChanges(e.srv) - before; got != 0 {
		t.Fatalf("%d report changes while the lock was held", got)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	errs := wait()

	for i, err := range errs[:count-1] {
		if err != nil {
			t.Fatalf("report %d: %v", i, err)
		}
		e.wantStatus(t, ids[i], "running", "after the folded reports")
	}
	var ae *nodeapi.Error
	if !errors.As(errs[count-1], &ae) || ae.Status != http.StatusBadRequest {
		t.Fatalf("forged report: %v, want 400", errs[count-1])
	}
	e.wantStatus(t, ids[count-1], "provisioning", "after its forged report")
	if got := control.ReportChanges(e.srv) - before; got != 1 {
		t.Fatalf("%d changes for %d reports, want 1", got, count-1)
	}
	if missing, extra, err := control.StatusIndexDrift(e.srv); err != nil || len(missing)+len(extra) > 0 {
		t.Fatalf("status index: missing %v extra %v err %v", missing, extra, err)
	}
	if control.ReportsQueued(e.srv) != 0 {
		t.Fatal("reports left queued")
	}
}

// serverReadFails fails the armed-th read of a server record after arm.
type serverReadFails struct {
	store.KV
	armed atomic.Int64 // reads to let through, plus one; 0: disarmed
}

func (f *serverReadFails) Get(key string, v any) error {
	if strings.Contains(key, "/srv/") && f.armed.Load() > 0 && f.armed.Add(-1) == 0 {
		return errors.New("injected read failure")
	}
	return f.KV.Get(key, v)
}

// A fold whose report fails after staging writes is dropped and built
// again without it: what the dropped change would have done is logged
// never, what the rebuilt one did once (not once per attempt).
func TestFoldRebuiltLogsEventsOnce(t *testing.T) {
	logs := &testutil.SyncBuffer{}
	e := newEnvWith(t, func(c *control.Config) {
		c.SweepInterval = time.Hour
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	}, false, "")
	fails := &serverReadFails{}
	e.wrap = func(kv store.KV) store.KV { fails.KV = kv; return fails }
	e.restart()
	const count = 3
	nodes := make([]node, count)
	reports := make([]nodeapi.Observed, count)
	ids := make([]string, count)
	for i := range nodes {
		nodes[i] = e.enroll(hwM4)
	}
	for i := range nodes {
		e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("relog-%d", i))).must(t, 201)
	}
	for i, n := range nodes {
		d := n.desired(t, 0)
		ids[i], reports[i] = d.Server.ID, applied(d, fmt.Sprintf("192.0.2.%d", 30+i))
	}
	release, wait := queueReports(t, e, nodes, reports)
	// The second report of the fold fails reading its server, after its
	// node record was staged; the first one's change is then dropped too.
	fails.armed.Store(2)
	if err := release(); err != nil {
		t.Fatal(err)
	}
	errs := wait()
	failed := 0
	out := logs.String()
	for i, id := range ids {
		want := 1
		if errs[i] != nil {
			failed++
			want = 0
		}
		if got := strings.Count(out, `msg="server running" server=`+id); got != want {
			t.Errorf("server %d (report error %v) logged running %d times, want %d:\n%s", i, errs[i], got, want, out)
		}
	}
	if failed != 1 {
		t.Fatalf("%d reports failed, want the one whose read failed: %v", failed, errs)
	}
}

// queueReports holds the change lock and has each node post its report,
// returning once all wait behind the lock: release lets them through, wait
// returns what each post returned.
func queueReports(t *testing.T, e *env, nodes []node, reports []nodeapi.Observed) (release func() error, wait func() []error) {
	t.Helper()
	release, err := control.HoldChangeLock(e.srv)
	if err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.client.ReportObserved(context.Background(), reports[i]) })
	}
	testutil.WaitFor(t, 10*time.Second, "every report queued behind the lock", func() bool {
		return control.ReportsQueued(e.srv) == len(nodes)
	})
	return release, func() []error { wg.Wait(); return errs }
}

// A node's second report while its first waits goes into a change of its
// own, after the first, so neither decides on the other's unstaged view.
func TestReportsOfOneNodeFoldApart(t *testing.T) {
	e, _ := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("twice")).must(t, 201))
	d := n.desired(t, 0)
	before := control.ReportChanges(e.srv)
	release, err := control.HoldChangeLock(e.srv)
	if err != nil {
		t.Fatal(err)
	}
	first := applied(d, "192.0.2.20")
	second := applied(d, "192.0.2.21")
	errs := make(chan error, 2)
	go func() { errs <- n.client.ReportObserved(context.Background(), first) }()
	testutil.WaitFor(t, 10*time.Second, "the first report queued", func() bool { return control.ReportsQueued(e.srv) == 1 })
	go func() { errs <- n.client.ReportObserved(context.Background(), second) }()
	testutil.WaitFor(t, 10*time.Second, "the second report queued", func() bool { return control.ReportsQueued(e.srv) == 2 })
	if err := release(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got := control.ReportChanges(e.srv) - before; got != 2 {
		t.Fatalf("%d changes, want 2 (one per report of the node)", got)
	}
	var srv struct {
		Status string `json:"status"`
		IP     string `json:"ip"`
	}
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &srv)
	if srv.Status != "running" || srv.IP != "192.0.2.21" {
		t.Fatalf("server %+v, want running at the second report's address", srv)
	}
}

// Creates that arrive while the change lock is busy are decided in one
// change, each on what the creates before it staged, exactly as one by
// one: a name taken earlier in the fold conflicts, no node is given twice
// and the last free one goes to one create only, an Idempotency-Key used
// earlier in the fold replays its answer (or conflicts for another
// request), and a create refused alone costs the others nothing.
func TestCreatesFoldIntoOneChange(t *testing.T) {
	e := newEnv(t, nil)
	const free = 5
	nodes := make([]node, free)
	for i := range nodes {
		nodes[i] = e.enroll(hwM4)
	}
	type call struct {
		body any
		hdr  []string
	}
	calls := []call{
		{serverBody("a"), nil},
		{serverBody("b"), nil},
		{serverBody("a"), nil}, // the name a was taken by the first
		{serverBody("c", func(b map[string]any) { b["ssh_key_ids"] = []string{"sk_missing000000000000"} }), nil},
		{serverBody("d"), []string{"Idempotency-Key", "k1"}},
		{serverBody("d"), []string{"Idempotency-Key", "k1"}}, // replays the create before
		{serverBody("e"), []string{"Idempotency-Key", "k1"}}, // the key with another request
		{serverBody("f"), nil},
		{serverBody("g"), nil},
		{serverBody("h"), nil}, // no free node left
	}
	before := control.APIChanges(e.srv)
	release, err := control.HoldChangeLock(e.srv)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]answer, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		// One at a time into the queue, so the fold decides them in
		// this order.
		wg.Go(func() { got[i] = e.req("POST", "/v1/servers", c.body, c.hdr...) })
		testutil.WaitFor(t, 10*time.Second, "the create queued", func() bool { return control.ChangesQueued(e.srv) == i+1 })
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	want := []int{201, 201, 409, 400, 201, 201, 409, 201, 201, 409}
	for i, a := range got {
		if a.status != want[i] {
			t.Fatalf("create %d: %d %s, want %d", i, a.status, a.body, want[i])
		}
	}
	if code, param := got[2].err(t); code != control.CodeConflict || param != "name" {
		t.Fatalf("second create of a: %s %s", code, param)
	}
	if code, _ := got[6].err(t); code != control.CodeIdempotencyConflict {
		t.Fatalf("the key with another request: %s", code)
	}
	if code, _ := got[9].err(t); code != control.CodeCapacityUnavailable {
		t.Fatalf("a create past the free nodes: %s", code)
	}
	if idOf(t, got[4]) != idOf(t, got[5]) || got[5].hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the replay within the fold: %s and %s (replayed %q)", got[4].body, got[5].body, got[5].hdr.Get("Idempotent-Replayed"))
	}
	if n := control.APIChanges(e.srv) - before; n != 1 {
		t.Fatalf("%d changes for the fold, want 1", n)
	}

	// Every node has one of the five servers, each a different one.
	created := map[string]bool{}
	for _, i := range []int{0, 1, 4, 7, 8} {
		created[idOf(t, got[i])] = true
	}
	for i, n := range nodes {
		d := n.desired(t, 0)
		if d.Server == nil || !created[d.Server.ID] {
			t.Fatalf("node %d: desired server %+v, want one of the creates", i, d.Server)
		}
		delete(created, d.Server.ID)
	}
	if missing, extra, err := control.StatusIndexDrift(e.srv); err != nil || len(missing)+len(extra) > 0 {
		t.Fatalf("status index: missing %v extra %v err %v", missing, extra, err)
	}
	// The fold's writes are the state: the name stays taken, the replay
	// is stored.
	e.req("POST", "/v1/servers", serverBody("b")).wantErr(t, 409, control.CodeConflict, "name")
	again := e.req("POST", "/v1/servers", serverBody("d"), "Idempotency-Key", "k1").must(t, 201)
	if idOf(t, again) != idOf(t, got[4]) {
		t.Fatal("the fold's Idempotency-Key answer was not kept")
	}
}

// A folded change whose handler panics after staging a write fails alone:
// the fold is built again without it, the others commit, and the change
// lock and the queue's lead are free afterwards.
func TestFoldedChangePanics(t *testing.T) {
	e := newEnv(t, nil)
	errs := control.FoldWithPanic(e.srv, "test/a", "test/b", "test/c")
	if errs[0] != nil || errs[2] != nil || errs[1] == nil || !strings.Contains(errs[1].Error(), "panic") {
		t.Fatalf("errors %v, want only the second's panic", errs)
	}
	for key, want := range map[string]bool{"test/a": true, "test/b": false, "test/c": true} {
		if ok, err := e.st.Has(key); err != nil || ok != want {
			t.Fatalf("%s stored %v (%v), want %v", key, ok, err, want)
		}
	}
	// The lock and the lead are free: a create goes through.
	e.enroll(hwM4)
	e.req("POST", "/v1/servers", serverBody("after")).must(t, 201)
}

// More creates than one fold takes wait behind the lock: they go in two
// changes, and each gets its own node.
func TestCreatesFoldInRounds(t *testing.T) {
	e := newEnv(t, nil)
	const count = control.MaxFold + 6
	for range count {
		e.enroll(hwM4)
	}
	before := control.APIChanges(e.srv)
	release, err := control.HoldChangeLock(e.srv)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]answer, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Go(func() { got[i] = e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("round-%d", i))) })
	}
	testutil.WaitFor(t, 10*time.Second, "every create queued", func() bool { return control.ChangesQueued(e.srv) == count })
	if err := release(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for _, a := range got {
		a.must(t, 201)
	}
	if n := control.APIChanges(e.srv) - before; n != 2 {
		t.Fatalf("%d changes for %d creates, want 2", n, count)
	}
	e.req("POST", "/v1/servers", serverBody("one-more")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	if control.ChangesQueued(e.srv) != 0 {
		t.Fatal("creates left queued")
	}
}
