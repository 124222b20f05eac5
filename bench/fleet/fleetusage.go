package fleet

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/nodeapi"
)

// The usage phases: what usage over time costs the control plane at the
// fleet's scale, and how fast a month of it is read back.
//
// Every node gets a deployment server with an API key (the nodes left free
// after the churn get one now); then three phases of UsageDuration each,
// twice over in turn (so that a change in the shared machine's load falls
// on all three alike), with every node posting at each ReportInterval
// tick, as an agent whose keys are in use does:
//
//   - usage_baseline: the keys' cumulative counters only, which a busy
//     node reported before usage over time existed;
//   - usage: the same, and the ended minute's bucket per key once a minute,
//     as the agent seals them;
//   - usage_every_report: a bucket per key in every report (six times what
//     the agent sends), the ingestion's worst case.
//
// Before them a project of QueryKeys keys (100 per server) is given
// QueryDays days of usage through its nodes' reports, and while the fleet
// keeps reporting, GET /v1/usage over those days by day is timed (ungrouped,
// by server, by key).

// Usage modes of the simulated fleet.
const (
	useNone = iota
	useCounters
	useMinuteBuckets
	useEveryReport
)

// simUsage is one node's use of its server's keys.
type simUsage struct {
	requests   uint64 // per key, cumulative
	seq        uint64
	lastMinute time.Time
	pending    []nodeapi.UsageBucket
	keys       []string
}

// totals are the keys' cumulative usage, for the report (nil when the
// keys are not used).
func (u *simUsage) totals() []nodeapi.KeyUsage {
	if u.requests == 0 {
		return nil
	}
	out := make([]nodeapi.KeyUsage, len(u.keys))
	for i, k := range u.keys {
		out[i] = nodeapi.KeyUsage{ID: k, Requests: u.requests, PromptTokens: 20 * u.requests, CompletionTokens: 40 * u.requests}
	}
	return out
}

// waiting are the buckets the next report carries.
func (u *simUsage) waiting() []nodeapi.UsageBucket {
	return slices.Clone(u.pending[:min(len(u.pending), nodeapi.MaxUsageBuckets)])
}

// accepted drops the buckets a report carried.
func (u *simUsage) accepted(sent []nodeapi.UsageBucket) {
	if n := len(sent); n > 0 && len(u.pending) >= n && u.pending[n-1].Seq == sent[n-1].Seq {
		u.pending = u.pending[n:]
	}
}

// seal adds a bucket per key for minute, of requests requests each.
func (u *simUsage) seal(minute time.Time, requests uint64) {
	for _, k := range u.keys {
		u.seq++
		u.pending = append(u.pending, usageBucket(u.seq, k, minute, requests))
	}
}

func usageBucket(seq uint64, key string, minute time.Time, requests uint64) nodeapi.UsageBucket {
	ttft := make([]uint64, nodeapi.TTFTBin(180*time.Millisecond)+1)
	ttft[len(ttft)-1] = requests
	return nodeapi.UsageBucket{Seq: seq, KeyID: key, Minute: minute, Requests: requests, PromptTokens: 20 * requests,
		CompletionTokens: 40 * requests, TTFT: ttft}
}

// useKeys counts a tick's use of the node's keys as the fleet's usage
// mode says, and reports whether there is any to report.
func (n *simNode) useKeys() bool {
	mode := n.usageMode.Load()
	n.mu.Lock()
	defer n.mu.Unlock()
	u := &n.use
	if mode == useNone || len(n.desired.APIKeys) == 0 || n.desired.Wipe {
		return len(u.pending) > 0
	}
	if len(u.keys) != len(n.desired.APIKeys) {
		u.keys = u.keys[:0]
		for _, k := range n.desired.APIKeys {
			u.keys = append(u.keys, k.ID)
		}
	}
	u.requests++
	now := time.Now().UTC().Truncate(time.Minute)
	switch mode {
	case useMinuteBuckets:
		if !u.lastMinute.IsZero() && now.After(u.lastMinute) {
			u.seal(u.lastMinute, 6)
		}
		u.lastMinute = now
	case useEveryReport:
		u.seal(now, 1)
		u.lastMinute = time.Time{}
	default:
		u.lastMinute = time.Time{}
	}
	return true
}

// backfill has the node report buckets of its keys for each of days days
// before today (one per key and day, requests each), as a node does that
// kept its buckets; it returns once they were all accepted.
func (n *simNode) backfill(ctx context.Context, days int, requests uint64) error {
	n.mu.Lock()
	today := time.Now().UTC().Truncate(24 * time.Hour)
	n.use.keys = n.use.keys[:0]
	for _, k := range n.desired.APIKeys {
		n.use.keys = append(n.use.keys, k.ID)
	}
	for d := days; d >= 1; d-- {
		n.use.seal(today.AddDate(0, 0, -d).Add(12*time.Hour), requests)
	}
	n.mu.Unlock()
	for {
		n.mu.Lock()
		left := len(n.use.pending)
		n.mu.Unlock()
		if left == 0 {
			return nil
		}
		if err := n.report(ctx); err != nil {
			return fmt.Errorf("node %d: backfill report: %w", n.index, err)
		}
	}
}

// UsageBenchResult is what the usage phases measured.
type UsageBenchResult struct {
	// Nodes is how many nodes reported usage, with Keys keys between
	// them; SetupS how long making their servers and keys took.
	Nodes  int     `json:"nodes"`
	Keys   int     `json:"keys"`
	SetupS float64 `json:"setup_s"`
	// Phases by name: usage_baseline, usage, usage_every_report.
	Phases map[string]UsagePhase `json:"phases"`
	// Added and AddedEveryReport are the control plane's extra CPU (with
	// PostgreSQL's, when the bench runs it) per report in the usage and
	// usage_every_report phases over the baseline, as a fraction of the
	// baseline's: at the fleet's report rate, the extra CPU. Per report,
	// so that a phase the shared machine slowed (fewer reports) compares.
	Added            float64 `json:"added_cpu"`
	AddedEveryReport float64 `json:"added_cpu_every_report"`
	// The query: QueryKeys keys, QueryDays days back, latency by grouping.
	QueryKeys   int                   `json:"query_keys"`
	QueryDays   int                   `json:"query_days"`
	Query       map[string]bench.Dist `json:"query"`
	QueryErrors int                   `json:"query_errors"`
	// QueryChecked: the days before today answered exactly what the
	// nodes reported for them.
	QueryChecked bool     `json:"query_checked"`
	Errors       []string `json:"errors,omitempty"`
}

// UsagePhase is one usage phase's load and cost.
type UsagePhase struct {
	Seconds          float64 `json:"seconds"`
	ControlCPUS      float64 `json:"control_cpu_s"`
	PgCPUS           float64 `json:"postgres_cpu_s,omitempty"`
	ReportsPerSecond float64 `json:"reports_per_second"`
	BucketsPerSecond float64 `json:"buckets_per_second"`
	// CPUPerSecond is (control plane + PostgreSQL) CPU-s per second,
	// CPUmsPerReport the same per report accepted, in milliseconds.
	CPUPerSecond   float64 `json:"cpu_per_second"`
	CPUmsPerReport float64 `json:"cpu_ms_per_report"`
}

// usagePhases are the usage phases in the order each round runs them.
var usagePhases = []struct {
	name string
	mode int32
}{{"usage_baseline", useCounters}, {"usage", useMinuteBuckets}, {"usage_every_report", useEveryReport}}

// usageRounds is how many times the usage phases run in turn.
const usageRounds = 2

// usage runs the usage phases (see the top of this file).
func (r *fleetRun) usage(ctx context.Context) error {
	cfg := r.cfg
	res := &UsageBenchResult{Phases: map[string]UsagePhase{}, QueryKeys: cfg.QueryKeys, QueryDays: cfg.QueryDays}
	r.res.Usage = res
	start := time.Now()
	q, err := r.queryProject(ctx)
	if err != nil {
		return err
	}
	if err := r.fillWithKeys(ctx); err != nil {
		return err
	}
	// Every node with a server has its keys.
	deadline := time.Now().Add(cfg.DrainTimeout)
	for {
		waiting := 0
		res.Nodes, res.Keys = 0, 0
		for _, n := range r.nodes {
			n.mu.Lock()
			has, keys := n.desired.Server != nil && !n.desired.Wipe, len(n.desired.APIKeys)
			n.mu.Unlock()
			if has && keys == 0 {
				waiting++
			}
			if keys > 0 {
				res.Nodes++
				res.Keys += keys
			}
		}
		if waiting == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("usage: %d nodes did not get their API keys within %v", waiting, cfg.DrainTimeout)
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
	if err := q.backfill(ctx, r); err != nil {
		return err
	}
	res.SetupS = time.Since(start).Seconds()

	var reports, buckets [3]int64
	for round := range usageRounds {
		for i, ph := range usagePhases {
			r.usageMode.Store(ph.mode)
			// One interval for every node to be in the mode, then the phase.
			sleepCtx(ctx, cfg.ReportInterval)
			reports0, buckets0 := r.count.reports.Load(), r.count.buckets.Load()
			name := fmt.Sprintf("%s %d", ph.name, round+1)
			done := r.phase(name)
			if round == 0 {
				r.cpuProfile(ctx, ph.name, cfg.UsageDuration)
			}
			sleepCtx(ctx, cfg.UsageDuration)
			done()
			reports[i] += r.count.reports.Load() - reports0
			buckets[i] += r.count.buckets.Load() - buckets0
			p, up := r.res.Phases[name], res.Phases[ph.name]
			up.Seconds += p.Seconds
			up.ControlCPUS += p.ControlCPUS
			up.PgCPUS += p.PgCPUS
			res.Phases[ph.name] = up
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	for i, ph := range usagePhases {
		up := res.Phases[ph.name]
		if up.Seconds > 0 && reports[i] > 0 {
			up.ReportsPerSecond = float64(reports[i]) / up.Seconds
			up.BucketsPerSecond = float64(buckets[i]) / up.Seconds
			up.CPUPerSecond = (up.ControlCPUS + up.PgCPUS) / up.Seconds
			up.CPUmsPerReport = 1000 * (up.ControlCPUS + up.PgCPUS) / float64(reports[i])
		}
		res.Phases[ph.name] = up
	}
	if base := res.Phases["usage_baseline"]; base.CPUmsPerReport > 0 {
		res.Added = res.Phases["usage"].CPUmsPerReport/base.CPUmsPerReport - 1
		res.AddedEveryReport = res.Phases["usage_every_report"].CPUmsPerReport/base.CPUmsPerReport - 1
	}
	// The query, with the fleet reporting minute buckets meanwhile.
	r.usageMode.Store(useMinuteBuckets)
	q.measure(ctx, r, res)
	r.usageMode.Store(useNone)
	return ctx.Err()
}

// queryProject is the project whose month of usage is read back.
type queryProject struct {
	c       *mgmtClient
	servers []string
	nodes   []*simNode
}

// queryRequests is how many times each kind of usage query is timed.
const queryRequests = 100

// queryProject makes the project of QueryKeys keys: its token, servers
// (100 keys each) and keys.
func (r *fleetRun) queryProject(ctx context.Context) (*queryProject, error) {
	if _, err := r.cp.admin(ctx, "projects", "create", "--name", "usage-query"); err != nil {
		return nil, err
	}
	tok, err := r.cp.admin(ctx, "tokens", "create", "--project", "usage-query", "--name", "query")
	if err != nil {
		return nil, err
	}
	base := r.clients[0]
	c := &mgmtClient{index: -1, token: tok, urls: base.urls, http: base.http, prop: base.prop, live: base.live, limit: base.limit}
	q := &queryProject{c: c}
	perServer := 100
	servers := (r.cfg.QueryKeys + perServer - 1) / perServer
	for i := range servers {
		c.live.Add(1) // never deleted
		id, err := c.deploymentServer(ctx, fmt.Sprintf("usage-query-%d", i))
		if err != nil {
			return nil, err
		}
		q.servers = append(q.servers, id)
		for k := range min(perServer, r.cfg.QueryKeys-i*perServer) {
			if err := c.apiKey(ctx, id, fmt.Sprintf("key-%d", k)); err != nil {
				return nil, err
			}
		}
	}
	return q, nil
}

// backfill has the project's nodes report QueryDays days of usage.
func (q *queryProject) backfill(ctx context.Context, r *fleetRun) error {
	for _, n := range r.nodes {
		n.mu.Lock()
		srv := n.desired.Server
		n.mu.Unlock()
		if srv != nil && slices.Contains(q.servers, srv.ID) {
			q.nodes = append(q.nodes, n)
		}
	}
	if len(q.nodes) != len(q.servers) {
		return fmt.Errorf("usage: %d of the query project's %d servers found on nodes", len(q.nodes), len(q.servers))
	}
	for _, n := range q.nodes {
		if err := n.backfill(ctx, r.cfg.QueryDays, 10); err != nil {
			return err
		}
	}
	return nil
}

// measure times each kind of query and checks the days before today.
func (q *queryProject) measure(ctx context.Context, r *fleetRun, res *UsageBenchResult) {
	now := time.Now().UTC()
	today := now.Truncate(24 * time.Hour)
	start := today.AddDate(0, 0, -r.cfg.QueryDays)
	res.Query = map[string]bench.Dist{}
	for _, groupBy := range []string{"", "server", "api_key"} {
		v := url.Values{"start": {start.Format(time.RFC3339)}, "end": {now.Format(time.RFC3339)}, "granularity": {"day"}}
		name := "ungrouped"
		if groupBy != "" {
			v.Set("group_by", groupBy)
			name = groupBy
		}
		var lat []time.Duration
		for range queryRequests {
			var u usageAnswer
			t0 := time.Now()
			at, err := q.c.do(ctx, http.MethodGet, "/v1/usage?"+v.Encode(), nil, http.StatusOK, &u)
			if err != nil {
				res.QueryErrors++
				if len(res.Errors) < 5 {
					res.Errors = append(res.Errors, err.Error())
				}
				continue
			}
			lat = append(lat, at.Sub(t0))
			if groupBy == "" {
				res.QueryChecked = u.pastDaysAre(today, uint64(10*r.cfg.QueryKeys))
			}
		}
		res.Query[name] = bench.Summarize(lat)
	}
}

// usageAnswer is the part of GET /v1/usage the bench reads.
type usageAnswer struct {
	Data []struct {
		Start   time.Time `json:"start"`
		Results []struct {
			Requests uint64 `json:"requests"`
		} `json:"results"`
	} `json:"data"`
}

// pastDaysAre reports whether every day before today has want requests.
func (u usageAnswer) pastDaysAre(today time.Time, want uint64) bool {
	n := 0
	for _, b := range u.Data {
		if !b.Start.Before(today) {
			continue
		}
		n++
		if len(b.Results) != 1 || b.Results[0].Requests != want {
			return false
		}
	}
	return n > 0
}

// fillWithKeys gives every node a deployment server with an API key: the
// clients make servers until the fleet is full, then a key for each server
// they hold that has none.
func (r *fleetRun) fillWithKeys(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(r.clients))
	for i, c := range r.clients {
		wg.Go(func() {
			for ctx.Err() == nil && errs[i] == nil {
				if c.live.Add(1) > c.limit {
					c.live.Add(-1)
					break
				}
				c.seq++
				id, err := c.deploymentServer(ctx, fmt.Sprintf("fleet-c%d-use-%d", c.index, c.seq))
				if err != nil {
					c.live.Add(-1)
					errs[i] = err
					break
				}
				c.servers = append(c.servers, &ownServer{id: id, nextPort: 1000})
			}
			for _, s := range c.servers {
				if errs[i] != nil || ctx.Err() != nil {
					break
				}
				if err := c.apiKey(ctx, s.id, "bench"); err != nil && !isBare(err) {
					errs[i] = err
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// isBare is the 409 of an API key on a bare server.
func isBare(err error) bool {
	var ae *apiStatusError
	return errors.As(err, &ae) && ae.status == http.StatusConflict && strings.Contains(ae.body, "API keys are for deployment servers")
}

// deploymentServer creates a deployment server and returns its ID.
func (c *mgmtClient) deploymentServer(ctx context.Context, name string) (string, error) {
	body := serverBody(name)
	var out struct {
		ID string `json:"id"`
	}
	at, err := c.do(ctx, http.MethodPost, "/v1/servers", body, http.StatusCreated, &out)
	if err != nil {
		return "", fmt.Errorf("usage: create a deployment server: %w", err)
	}
	c.prop.answered(out.ID, change{kind: changeCreate, answered: at})
	return out.ID, nil
}

// apiKey issues an API key of server.
func (c *mgmtClient) apiKey(ctx context.Context, server, name string) error {
	_, err := c.do(ctx, http.MethodPost, "/v1/servers/"+server+"/api-keys", map[string]any{"name": name}, http.StatusCreated, nil)
	if err != nil {
		return fmt.Errorf("usage: create an API key: %w", err)
	}
	return nil
}
