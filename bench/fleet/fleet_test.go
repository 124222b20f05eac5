package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
)

// smallFleet is a fleet run small and short enough for make test.
func smallFleet(t *testing.T, bin string) FleetConfig {
	// Without CAP_SYS_RESOURCE the soft limit goes up to the hard one,
	// which is plenty for 50 nodes.
	noFile, _ := bench.RaiseNoFile(1 << 20)
	logs := &proctest.LogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane output:\n%s", logs.String())
		}
	})
	return FleetConfig{
		ControlBin: bin, WorkDir: t.TempDir(), Nodes: 50, Clients: 4, EnrollConcurrency: 8,
		CreateDuration: time.Second, MaxCreates: 20, ChurnDuration: 1500 * time.Millisecond,
		// One rule per server: a server's second rule change is a delete
		// and an add, so the short churn has deletes even on a busy machine.
		RulesPerServer: 1,
		IdleDuration:   time.Second, ReportDuration: 500 * time.Millisecond, ReportConcurrency: 8,
		ReportInterval: time.Second, ReportRefresh: 2 * time.Second, PollWait: 5 * time.Second,
		SettleTimeout: time.Minute, DrainTimeout: time.Minute, NoFile: noFile,
		UsageDuration: 1500 * time.Millisecond, QueryKeys: 150, QueryDays: 3,
		ControlLog: logs,
	}
}

// checkFleet asserts that a run measured what it claims: every request
// answered, every answered change seen by its node exactly once, and the
// process numbers filled in. It never checks how fast anything was.
func checkFleet(t *testing.T, cfg FleetConfig, res FleetResult) {
	t.Helper()
	if res.Nodes != cfg.Nodes || res.Enroll.OK != cfg.Nodes || res.Enroll.Errors != 0 || res.NodesFit < cfg.Nodes {
		t.Errorf("enrolled %d of %d (fit %d), enrolment %+v", res.Nodes, cfg.Nodes, res.NodesFit, res.Enroll)
	}
	if res.SettleS <= 0 || res.Enroll.PerSecond <= 0 || res.Enroll.Latency.N != cfg.Nodes {
		t.Errorf("settle %v s, enrolment %+v", res.SettleS, res.Enroll)
	}
	creates := res.Create["create"]
	if creates.OK == 0 || creates.OK > cfg.MaxCreates+cfg.Clients || creates.Latency.N != creates.OK || creates.PerSecond <= 0 {
		t.Errorf("create phase: %+v (at most %d + %d clients)", creates, cfg.MaxCreates, cfg.Clients)
	}
	for phase, ops := range map[string]map[string]OpStats{"create": res.Create, "churn": res.Churn} {
		for op, s := range ops {
			if s.Errors != 0 || s.CapacityUnavailable != 0 {
				t.Errorf("%s %s: %+v", phase, op, s)
			}
		}
	}
	for _, op := range opNames {
		if res.Churn[op].OK == 0 {
			t.Errorf("churn did no %s: %+v", op, res.Churn)
		}
	}
	// Every answered change reached its node, and nothing else did.
	p := res.Propagation
	want := map[string]int{
		"create":      creates.OK + res.Churn["create"].OK,
		"rule_add":    res.Churn["rule_add"].OK,
		"rule_delete": res.Churn["rule_delete"].OK,
		"delete":      res.Churn["delete"].OK,
	}
	total := 0
	for k, n := range want {
		if d := p.ByKind[k]; d.N != n || d.P99 < d.P50 || d.P50 < 0 {
			t.Errorf("propagation of %s: %+v, want %d samples", k, d, n)
		}
		total += n
	}
	if p.All.N != total || p.Unseen != 0 || p.Unmatched != 0 || p.All.Max <= 0 {
		t.Errorf("propagation %+v, want %d samples, none unseen or unmatched", p, total)
	}
	// Every deleted server was wiped by its node and left the fleet.
	f := res.Fleet
	if f.Wipes != int64(res.Churn["delete"].OK) || f.PollErrors != 0 || f.ReportErrors != 0 || f.Polls < int64(total) {
		t.Errorf("fleet %+v, want %d wipes and at least %d polls with a state", f, res.Churn["delete"].OK, total)
	}
	b := res.Reports.Burst
	if b.OK == 0 || b.Errors != 0 || b.PerSecond <= 0 || res.Reports.BurstPerSecond < b.PerSecond || b.Latency.N != b.OK || res.Reports.ChurnPerSecond <= 0 || res.Reports.IdlePerSecond <= 0 {
		t.Errorf("reports %+v", res.Reports)
	}
	if res.Idle.Seconds <= 0 || res.Idle.CPUmsPerNodeMinute < 0 || res.Idle.PollsPerSecond+res.Idle.ReportsPerSecond <= 0 {
		t.Errorf("idle %+v", res.Idle)
	}
	for _, phase := range []string{"enroll", "create", "churn", "idle", "report_burst"} {
		if ph, ok := res.Phases[phase]; !ok || ph.Seconds <= 0 || ph.ControlCPUS < 0 || ph.BenchCPUS < 0 || ph.RSSPeak <= 0 || ph.RSSPeak > res.RSSPeak {
			t.Errorf("phase %s: %+v", phase, ph)
		}
	}
	if res.Phases["churn"].ControlCPUS <= 0 {
		t.Errorf("the control plane used no CPU during the churn: %+v", res.Phases["churn"])
	}
	if res.RSSPeak <= 0 || res.RSSEnd <= 0 || res.RSSHWM < res.RSSEnd {
		t.Errorf("RSS peak %d end %d HWM %d", res.RSSPeak, res.RSSEnd, res.RSSHWM)
	}
	checkUsage(t, cfg, res)
	rep := FleetReport{Results: []FleetResult{res}}
	if md := rep.Markdown(); !strings.Contains(md, "| "+res.Variant+" | 50 |") {
		t.Errorf("markdown lacks the %s row:\n%s", res.Variant, md)
	}
}

// TestFleetSmoke runs the fleet benchmark end to end with a real control
// plane process and 50 simulated nodes, on Pebble, then on PostgreSQL with
// two replicas.
func TestFleetSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	bin, err := BuildControl(ctx, t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("pebble", func(t *testing.T) {
		cfg := smallFleet(t, bin)
		cfg.ProfileDir = t.TempDir()
		res, err := RunFleet(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkFleet(t, cfg, res)
		// The profiling build serves pprof: a CPU profile of the churn
		// (the only phase here long enough for one) and a heap profile.
		for _, kind := range []string{"cpu", "heap"} {
			file := filepath.Join(cfg.ProfileDir, "pebble.churn.r0."+kind+".pprof")
			if st, err := os.Stat(file); err != nil || st.Size() == 0 || !slices.Contains(res.Profiles, file) {
				t.Errorf("%s profile %s: %v (profiles %v)", kind, file, err, res.Profiles)
			}
		}
	})
	t.Run("postgres-2", func(t *testing.T) {
		testutil.Integration(t, "PostgreSQL")
		cfg := smallFleet(t, bin)
		cfg.Backend, cfg.Replicas = BackendPostgres, 2
		if supported, err := SupportsDatabaseURL(ctx, bin); err != nil || !supported {
			t.Fatalf("hearth-control serve takes --database-url: %v, %v", supported, err)
		}
		res, err := RunFleet(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		checkFleet(t, cfg, res)
		if res.Phases["churn"].PgCPUS <= 0 {
			t.Errorf("no PostgreSQL CPU measured: %+v", res.Phases["churn"])
		}
	})
}

// The PostgreSQL variants run on a fresh database of a private server, whose
// CPU (the postmaster and its backends) counts with the control plane's.
func TestFleetDatabaseOnPrivatePostgres(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pg := pgtest.Start(t)
	url, err := createDatabase(ctx, pg.URL(), "hearth_fleet_test")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var db string
	if err := conn.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil || db != "hearth_fleet_test" {
		t.Fatalf("connected to %q (%v), want hearth_fleet_test", db, err)
	}
	s := newProcSampler(nil, pg.PID())
	defer s.Close()
	_, before := s.cpu()
	// Work for this connection's backend, a child of the postmaster.
	var sum int64
	if err := conn.QueryRow(ctx, "SELECT sum(i) FROM generate_series(1, 3000000) i").Scan(&sum); err != nil || sum != 4500001500000 {
		t.Fatalf("sum %d: %v", sum, err)
	}
	if _, after := s.cpu(); after <= before {
		t.Fatalf("PostgreSQL CPU %v → %v after a query", before, after)
	}
}

// TestLatencyCSV: each answered request is one line, its answer time and
// latency in microseconds from the phase's start; failures are not listed.
func TestLatencyCSV(t *testing.T) {
	start := time.Date(2026, 11, 28, 5, 0, 0, 0, time.UTC)
	var r opRecorder
	r.lat[opCreate] = []time.Duration{40 * time.Millisecond, 1500 * time.Microsecond}
	r.ends[opCreate] = []time.Time{start.Add(50 * time.Millisecond), start.Add(2 * time.Second)}
	r.lat[opDelete] = []time.Duration{time.Millisecond}
	r.ends[opDelete] = []time.Time{start.Add(time.Second)}
	r.fail(opCreate, errors.New("refused"))
	want := "# phase start 2026-11-28T05:00:00Z (unix µs 1795842000000000)\n" +
		"op,answered_us,latency_us\n" +
		"create,50000,40000\ncreate,2000000,1500\ndelete,1000000,1000\n"
	if got := string(r.latencyCSV(start)); got != want {
		t.Fatalf("got\n%s\nwant\n%s", got, want)
	}
}

// checkUsage asserts that the usage phases ran as they say: every node
// with a server got a key, each phase reported (with buckets in the two
// that send them), and the month of the query project read back exactly.
func checkUsage(t *testing.T, cfg FleetConfig, res FleetResult) {
	t.Helper()
	u := res.Usage
	if u == nil {
		t.Fatal("no usage result")
	}
	// The query project's servers hold 100 keys each; every other node one.
	servers := (cfg.QueryKeys + 99) / 100
	if u.Nodes < cfg.Nodes-cfg.Clients || u.Keys != u.Nodes-servers+cfg.QueryKeys {
		t.Errorf("usage on %d nodes with %d keys; want at least %d nodes", u.Nodes, u.Keys, cfg.Nodes-cfg.Clients)
	}
	// A minute's buckets come once a minute: the short usage phase may
	// have none.
	for name, buckets := range map[string]string{"usage_baseline": "none", "usage": "any", "usage_every_report": "some"} {
		p, ok := u.Phases[name]
		if !ok || p.Seconds <= 0 || p.ReportsPerSecond <= 0 || p.CPUPerSecond <= 0 || p.CPUmsPerReport <= 0 ||
			(buckets == "none" && p.BucketsPerSecond != 0) || (buckets == "some" && p.BucketsPerSecond <= 0) {
			t.Errorf("usage phase %s: %+v", name, p)
		}
		for round := 1; round <= usageRounds; round++ {
			if ph := res.Phases[fmt.Sprintf("%s %d", name, round)]; ph.Seconds <= 0 {
				t.Errorf("phase %s %d not measured: %+v", name, round, ph)
			}
		}
	}
	if u.QueryErrors != 0 || !u.QueryChecked || u.QueryKeys != cfg.QueryKeys || u.QueryDays != cfg.QueryDays {
		t.Errorf("usage query: %d errors %v, checked %v", u.QueryErrors, u.Errors, u.QueryChecked)
	}
	for _, g := range []string{"ungrouped", "server", "api_key"} {
		if d := u.Query[g]; d.N != queryRequests || d.P99 < d.P50 || d.P50 <= 0 {
			t.Errorf("usage query %s: %+v", g, d)
		}
	}
}
