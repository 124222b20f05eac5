package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/nodeapi"
)

// Backends of the fleet benchmark.
const (
	BackendPebble   = "pebble"
	BackendPostgres = "postgres"
)

// fdReserve is the descriptors each process keeps for everything but the
// fleet's connections: listeners, the admin socket, Pebble's files, the
// PostgreSQL pool, /proc reads, profiles.
const fdReserve = 256

// FleetConfig is one fleet benchmark run: one control plane (a backend and
// a number of replicas) driven by a simulated fleet and management
// clients.
type FleetConfig struct {
	ControlBin string // hearth-control
	WorkDir    string // the control plane's state directories
	Backend    string // BackendPebble or BackendPostgres
	// Replicas is the number of `hearth-control serve` processes on one
	// PostgreSQL database (1 with Pebble). Nodes are spread over them
	// round-robin, and every management client sends its requests to them
	// in turn: a client-side load balancer.
	Replicas int
	// DatabaseURL is a PostgreSQL superuser URL; the run makes a fresh
	// database on that server. Empty: a private server (internal/pgtest),
	// whose CPU is measured with the control plane's.
	DatabaseURL string

	// Nodes is the fleet size asked for; the run uses fewer if the
	// open-file limit cannot hold them (see FleetNodes).
	Nodes             int
	Clients           int // concurrent management API clients
	EnrollConcurrency int // enrolments in flight during the burst
	// CreateDuration bounds the create phase, which also ends after
	// MaxCreates servers.
	CreateDuration time.Duration
	MaxCreates     int
	ChurnDuration  time.Duration // creates, rule changes and deletes
	RulesPerServer int           // firewall rules a client keeps per server (default rulesPerServer)
	IdleDuration   time.Duration // the fleet connected, no API traffic
	// ReportDuration and ReportConcurrency shape the report burst: that
	// many nodes' observed states posted back to back.
	ReportDuration    time.Duration
	ReportConcurrency int
	// ReportInterval, ReportRefresh and PollWait are the simulated agents'
	// (the agent's defaults: 10 s, 60 s and 30 s): a changed state is
	// posted at the next interval, an unchanged one every ReportRefresh.
	ReportInterval time.Duration
	ReportRefresh  time.Duration
	PollWait       time.Duration
	// UsageDuration is each usage phase's length (fleetusage.go); 0
	// skips them. QueryKeys and QueryDays shape the usage query's project
	// (defaults 1 000 and 30).
	UsageDuration time.Duration
	QueryKeys     int
	QueryDays     int
	// SettleTimeout bounds the enrolment burst until every node has
	// reported; DrainTimeout the wait for the last changes to reach their
	// nodes.
	SettleTimeout time.Duration
	DrainTimeout  time.Duration

	ProfileDir string    // CPU and heap profiles per phase (ControlBin must be a profiling build)
	ControlLog io.Writer // the control plane's output; nil discards it
	// LatencyDir receives each load phase's requests, one CSV line each
	// (opRecorder.latencyCSV): when the tail happened, not only how long.
	LatencyDir  string
	ControlArgs []string // extra `hearth-control serve` arguments
	// NoFile is the open-file limit of this process, which the control
	// plane inherits.
	NoFile uint64
	Log    *slog.Logger
}

func (c *FleetConfig) defaults() {
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	if c.RulesPerServer <= 0 {
		c.RulesPerServer = rulesPerServer
	}
	if c.Backend == "" {
		c.Backend = BackendPebble
	}
	c.Replicas = max(c.Replicas, 1)
	if c.Nodes <= 0 {
		c.Nodes = 10000
	}
	if c.Clients <= 0 {
		c.Clients = 32
	}
	if c.EnrollConcurrency <= 0 {
		c.EnrollConcurrency = 256
	}
	if c.ReportConcurrency <= 0 {
		c.ReportConcurrency = 64
	}
	if c.QueryKeys <= 0 {
		c.QueryKeys = 1000
	}
	if c.QueryDays <= 0 {
		c.QueryDays = 30
	}
	set(&c.CreateDuration, 15*time.Second)
	set(&c.ChurnDuration, 20*time.Second)
	set(&c.IdleDuration, 60*time.Second)
	set(&c.ReportDuration, 5*time.Second)
	set(&c.ReportInterval, 10*time.Second)
	set(&c.ReportRefresh, 60*time.Second)
	c.ReportRefresh = max(c.ReportRefresh, c.ReportInterval)
	set(&c.PollWait, nodeapi.DefaultWait)
	set(&c.SettleTimeout, 10*time.Minute)
	set(&c.DrainTimeout, 30*time.Second)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
}

// Variant names the control plane setup: "pebble", "postgres" or
// "postgres ×2".
func (c FleetConfig) Variant() string {
	if c.Backend == BackendPostgres && c.Replicas > 1 {
		return fmt.Sprintf("%s ×%d", c.Backend, c.Replicas)
	}
	return c.Backend
}

func (c FleetConfig) fileStem() string {
	if c.Backend == BackendPostgres {
		return fmt.Sprintf("%s-%d", c.Backend, c.Replicas)
	}
	return c.Backend
}

// fleetHeadroom is the connections beyond one per node that the fleet may
// open at once: enrolments or burst reports in flight, and reports the
// agents send while their long-poll is open.
func fleetHeadroom(c FleetConfig) int {
	return max(c.EnrollConcurrency, c.ReportConcurrency) + 64
}

// FleetNodes is how many nodes fit an open-file limit of noFile (0:
// unknown, all fit). Every node holds one long-poll connection, which is
// one descriptor in this process and one in the control plane (the kernel
// gives each process its own limit; one-process-per-side is what bounds
// it). Both also need clients' connections, headroom for requests beside
// the long-polls, and fdReserve.
func FleetNodes(requested int, noFile uint64, clients, headroom int) int {
	if noFile == 0 {
		return requested
	}
	fit := int(noFile) - fdReserve - clients - headroom
	return max(min(requested, fit), 1)
}

// fleetTransports returns the nodes' HTTP clients: one for long-polls, with
// a connection for every node on its replica, and one for enrolments and
// reports, with every descriptor the open-file limit leaves (a real node
// may have a report in flight beside its long-poll; a pool too small for
// that would hold polls back and show as propagation delay).
func fleetTransports(cfg FleetConfig, nodes, replicas int) (polls, others *http.Client) {
	perReplica := (nodes + replicas - 1) / replicas
	polls = &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: perReplica, MaxConnsPerHost: perReplica,
		IdleConnTimeout: 2 * cfg.PollWait, DisableCompression: true}}
	rest := 0 // no limit known
	if cfg.NoFile > 0 {
		rest = max((int(cfg.NoFile)-fdReserve-cfg.Clients-nodes)/replicas, 1)
	}
	others = &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: max(rest, 1024), MaxConnsPerHost: rest,
		IdleConnTimeout: 2 * cfg.ReportInterval, DisableCompression: true}}
	return polls, others
}

// FleetResult is what one fleet run measured.
type FleetResult struct {
	Variant  string `json:"variant"`
	Backend  string `json:"backend"`
	Replicas int    `json:"replicas"`
	// Error is why the variant did not run (e.g. a backend the control
	// plane does not support yet).
	Error          string  `json:"error,omitempty"`
	NodesRequested int     `json:"nodes_requested"`
	NodesFit       int     `json:"nodes_fit"`
	Nodes          int     `json:"nodes_enrolled"`
	Clients        int     `json:"clients"`
	OpenFileLimit  uint64  `json:"open_file_limit"`
	LoadAvgStart   string  `json:"loadavg_start"`
	LoadAvgEnd     string  `json:"loadavg_end"`
	Enroll         OpStats `json:"enroll"`
	// SettleS is the time from the start of the enrolment burst until
	// every node had its desired state and its first report was accepted.
	SettleS float64 `json:"settle_s"`
	// Create is the create-only phase, Churn the mixed one.
	Create      map[string]OpStats `json:"create_phase"`
	Churn       map[string]OpStats `json:"churn_phase"`
	Propagation PropagationResult  `json:"propagation"`
	Reports     ReportResult       `json:"reports"`
	Idle        IdleResult         `json:"idle"`
	// Phases is the CPU each phase cost.
	Phases map[string]PhaseCPU `json:"phases"`
	// RSS of the replicas (summed): highest sampled every 100 ms, VmHWM and
	// at the end.
	RSSPeak int64       `json:"rss_peak_bytes"`
	RSSHWM  int64       `json:"rss_hwm_bytes"`
	RSSEnd  int64       `json:"rss_end_bytes"`
	Fleet   FleetCounts `json:"fleet"`
	// Usage is the usage phases' (fleetusage.go), if they ran.
	Usage    *UsageBenchResult `json:"usage,omitempty"`
	Profiles []string          `json:"profiles,omitempty"`
	Config   FleetSummary      `json:"config"`
}

// FleetSummary is the run's shape, for the report.
type FleetSummary struct {
	CreateS           float64 `json:"create_s"`
	ChurnS            float64 `json:"churn_s"`
	IdleS             float64 `json:"idle_s"`
	ReportS           float64 `json:"report_burst_s"`
	MaxCreates        int     `json:"max_creates"`
	ReportInterval    string  `json:"report_interval"`
	ReportRefresh     string  `json:"report_refresh"`
	PollWait          string  `json:"poll_wait"`
	ReportConcurrency int     `json:"report_concurrency"`
	EnrollConcurrency int     `json:"enroll_concurrency"`
}

// ReportResult is the observed-state ingestion.
type ReportResult struct {
	// ChurnPerSecond and IdlePerSecond are what the fleet offered and the
	// control plane accepted in those phases.
	ChurnPerSecond float64 `json:"churn_per_second"`
	IdlePerSecond  float64 `json:"idle_per_second"`
	// Burst is ReportConcurrency nodes reporting back to back, beside the
	// fleet's periodic reports; BurstPerSecond counts both: the most
	// reports the control plane ingests per second.
	Burst          OpStats `json:"burst"`
	BurstPerSecond float64 `json:"burst_per_second"`
}

// IdleResult is the cost of a connected fleet with no API traffic: the
// agents' long-polls renewing and their periodic reports.
type IdleResult struct {
	Seconds     float64 `json:"seconds"`
	ControlCPUS float64 `json:"control_cpu_s"`
	PgCPUS      float64 `json:"postgres_cpu_s,omitempty"`
	// CPUmsPerNodeMinute is (control plane + PostgreSQL) CPU per node per
	// minute, in milliseconds.
	CPUmsPerNodeMinute float64 `json:"cpu_ms_per_node_per_minute"`
	PollsPerSecond     float64 `json:"polls_per_second"`
	ReportsPerSecond   float64 `json:"reports_per_second"`
}

// PhaseCPU is the CPU used during one phase.
type PhaseCPU struct {
	Seconds     float64 `json:"seconds"`
	ControlCPUS float64 `json:"control_cpu_s"`
	PgCPUS      float64 `json:"postgres_cpu_s,omitempty"`
	BenchCPUS   float64 `json:"bench_cpu_s"`
	// OtherCPUS is what the rest of the machine used meanwhile (busy time
	// in /proc/stat minus the three above): other work on the shared
	// cores, which the phase's numbers compete with.
	OtherCPUS float64 `json:"other_cpu_s"`
	// RSSPeak is the replicas' highest summed RSS during the phase.
	RSSPeak int64 `json:"rss_peak_bytes"`
}

// FleetCounts is what the simulated nodes did over the whole run.
type FleetCounts struct {
	Polls        int64    `json:"polls_with_state"`
	EmptyPolls   int64    `json:"polls_empty"`
	Reports      int64    `json:"reports"`
	PollErrors   int64    `json:"poll_errors"`
	ReportErrors int64    `json:"report_errors"`
	Wipes        int64    `json:"wipes"`
	ErrorSamples []string `json:"error_samples,omitempty"`
}

// fleetRun is the state of one RunFleet.
type fleetRun struct {
	cfg      FleetConfig
	cp       *ControlPlane
	procs    *procSampler
	prop     *propagation
	count    *nodeCounters
	nodes    []*simNode // enrolled
	clients  []*mgmtClient
	res      *FleetResult
	profiles sync.WaitGroup
	profMu   sync.Mutex
	// usageMode is how the fleet's nodes use their API keys (fleetusage.go).
	usageMode atomic.Int32
}

// RunFleet runs the fleet benchmark once. A backend the control plane
// cannot run on is ErrBackendUnsupported.
func RunFleet(ctx context.Context, cfg FleetConfig) (res FleetResult, err error) {
	cfg.defaults()
	res = FleetResult{Variant: cfg.Variant(), Backend: cfg.Backend, Replicas: cfg.Replicas, NodesRequested: cfg.Nodes,
		Clients: cfg.Clients, OpenFileLimit: cfg.NoFile, LoadAvgStart: loadAvg(), Phases: map[string]PhaseCPU{}}
	res.NodesFit = FleetNodes(1<<30, cfg.NoFile, cfg.Clients, fleetHeadroom(cfg))
	nodes := min(cfg.Nodes, res.NodesFit)
	if cfg.MaxCreates <= 0 {
		cfg.MaxCreates = max(nodes/2, 1)
	}
	res.Config = FleetSummary{CreateS: cfg.CreateDuration.Seconds(), ChurnS: cfg.ChurnDuration.Seconds(),
		IdleS: cfg.IdleDuration.Seconds(), ReportS: cfg.ReportDuration.Seconds(), MaxCreates: cfg.MaxCreates,
		ReportInterval: cfg.ReportInterval.String(), ReportRefresh: cfg.ReportRefresh.String(), PollWait: cfg.PollWait.String(),
		ReportConcurrency: cfg.ReportConcurrency, EnrollConcurrency: cfg.EnrollConcurrency}
	defer func() { res.LoadAvgEnd = loadAvg() }()

	opts := ControlOptions{Bin: cfg.ControlBin, WorkDir: filepath.Join(cfg.WorkDir, cfg.fileStem()), Replicas: cfg.Replicas,
		Pprof: cfg.ProfileDir != "", Extra: cfg.ControlArgs, Log: cfg.ControlLog}
	pgPID := 0
	switch cfg.Backend {
	case BackendPebble:
		if cfg.Replicas > 1 {
			return res, errors.New("pebble: one replica only (embedded Pebble allows one process)")
		}
	case BackendPostgres:
		url, pid, stop, err := fleetDatabase(ctx, cfg)
		if err != nil {
			return res, err
		}
		defer stop()
		opts.DatabaseURL, pgPID = url, pid
	default:
		return res, fmt.Errorf("unknown backend %q (pebble or postgres)", cfg.Backend)
	}
	if err := bench.EnsureDir(opts.WorkDir); err != nil {
		return res, err
	}
	cp, err := StartControlPlane(ctx, opts)
	if err != nil {
		return res, err
	}
	defer cp.Stop()
	r := &fleetRun{cfg: cfg, cp: cp, prop: newPropagation(), count: &nodeCounters{}, res: &res}
	r.procs = newProcSampler(cp.PIDs(), pgPID)
	defer r.procs.Close()
	err = r.run(ctx, nodes)
	r.profiles.Wait()
	if err == nil && cp.Exited() {
		err = errors.New("a control plane replica exited during the run")
	}
	if stopErr := cp.Stop(); err == nil && stopErr != nil {
		err = fmt.Errorf("stop control plane: %w", stopErr)
	}
	return res, err
}

// fleetDatabase makes the PostgreSQL database a run uses, on
// cfg.DatabaseURL's server or a private one, after checking that the
// control plane can use it at all.
func fleetDatabase(ctx context.Context, cfg FleetConfig) (url string, pgPID int, stop func(), err error) {
	ok, err := SupportsDatabaseURL(ctx, cfg.ControlBin)
	if err != nil {
		return "", 0, nil, err
	}
	if !ok {
		return "", 0, nil, fmt.Errorf("PostgreSQL: %w (hearth-control serve has no --database-url)", ErrBackendUnsupported)
	}
	server, stop := cfg.DatabaseURL, func() {}
	if server == "" {
		pg, err := pgtest.New()
		if err != nil {
			return "", 0, nil, fmt.Errorf("private PostgreSQL: %w", err)
		}
		server, pgPID, stop = pg.URL(), pg.PID(), pg.Close
	}
	name := fmt.Sprintf("hearth_fleet_%d_%d", time.Now().Unix(), rand.IntN(1e6))
	url, err = createDatabase(ctx, server, name)
	if err != nil {
		stop()
		return "", 0, nil, err
	}
	return url, pgPID, stop, nil
}

func (r *fleetRun) run(ctx context.Context, nodes int) error {
	cfg, res := r.cfg, r.res
	urls := r.cp.URLs()
	pollHTTP, nodeHTTP := fleetTransports(cfg, nodes, len(urls))
	defer pollHTTP.CloseIdleConnections()
	defer nodeHTTP.CloseIdleConnections()
	mgmtHTTP := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		MaxIdleConnsPerHost: cfg.Clients, DisableCompression: true}}
	defer mgmtHTTP.CloseIdleConnections()

	token, err := r.cp.EnrollmentToken(ctx, nodes)
	if err != nil {
		return err
	}
	for i := range cfg.Clients {
		tok, err := r.cp.APIToken(ctx, fmt.Sprintf("fleet-%d", i))
		if err != nil {
			return err
		}
		r.clients = append(r.clients, &mgmtClient{index: i, token: tok, urls: urls, next: i, http: mgmtHTTP,
			prop: r.prop, live: &r.count.live, limit: int64(nodes - cfg.Clients),
			rng: rand.New(rand.NewPCG(uint64(i), 1)), rules: cfg.RulesPerServer})
	}

	nodeCtx, stopNodes := context.WithCancel(ctx)
	var fleet sync.WaitGroup
	defer func() {
		stopNodes()
		fleet.Wait()
	}()
	cfg.Log.Info("fleet: enrolment burst", "variant", res.Variant, "nodes", nodes)
	if err := r.enroll(ctx, nodeCtx, &fleet, nodes, token, urls, pollHTTP, nodeHTTP); err != nil {
		return err
	}
	if len(r.nodes) == 0 {
		return fmt.Errorf("no node enrolled: %v", res.Enroll.ErrorSamples)
	}

	cfg.Log.Info("fleet: create phase", "variant", res.Variant, "max_creates", cfg.MaxCreates)
	maxCreates := int64(cfg.MaxCreates)
	res.Create = r.load(ctx, "create", mixCreate, cfg.CreateDuration, func() bool { return r.count.live.Load() >= maxCreates })
	reports0 := r.count.reports.Load()
	cfg.Log.Info("fleet: churn phase", "variant", res.Variant)
	churnStart := time.Now()
	res.Churn = r.load(ctx, "churn", mixChurn, cfg.ChurnDuration, func() bool { return false })
	res.Reports.ChurnPerSecond = float64(r.count.reports.Load()-reports0) / time.Since(churnStart).Seconds()
	r.profile(ctx, "churn", "heap", "/debug/pprof/heap")
	r.profile(ctx, "churn", "goroutine", "/debug/pprof/goroutine")

	r.drain(ctx)
	res.Propagation = r.prop.result()
	// Reports the churn held back finish, and the fleet is back to its
	// periodic pattern, before the idle measurement starts.
	sleepCtx(ctx, cfg.ReportInterval)
	if err := ctx.Err(); err != nil {
		return err
	}
	cfg.Log.Info("fleet: idle", "variant", res.Variant, "for", cfg.IdleDuration)
	r.idle(ctx)
	cfg.Log.Info("fleet: report burst", "variant", res.Variant)
	r.reportBurst(ctx)
	if cfg.UsageDuration > 0 {
		cfg.Log.Info("fleet: usage", "variant", res.Variant)
		if err := r.usage(ctx); err != nil {
			return err
		}
	}

	res.RSSPeak = r.procs.peakRSS()
	res.RSSEnd, res.RSSHWM = r.procs.memory()
	res.RSSPeak = max(res.RSSPeak, res.RSSEnd)
	c := r.count
	res.Fleet = FleetCounts{Polls: c.polls.Load(), EmptyPolls: c.emptyPolls.Load(), Reports: c.reports.Load(),
		PollErrors: c.pollErrors.Load(), ReportErrors: c.reportErrors.Load(), Wipes: c.wipes.Load(),
		ErrorSamples: c.errorSamples()}
	return ctx.Err()
}

// phase measures the CPU of whatever runs between its call and the call of
// the function it returns.
func (r *fleetRun) phase(name string) func() {
	start, bench0, machine0 := time.Now(), bench.SelfCPU(), machineBusy()
	ctl0, pg0 := r.procs.cpu()
	r.procs.takePhasePeak()
	return func() {
		ctl, pg := r.procs.cpu()
		r.procs.sample() // a phase may end between two samples
		p := PhaseCPU{Seconds: time.Since(start).Seconds(), ControlCPUS: (ctl - ctl0).Seconds(),
			PgCPUS: (pg - pg0).Seconds(), BenchCPUS: (bench.SelfCPU() - bench0).Seconds(), RSSPeak: r.procs.takePhasePeak()}
		if m := machineBusy(); m > 0 && machine0 > 0 {
			p.OtherCPUS = max((m-machine0).Seconds()-p.ControlCPUS-p.PgCPUS-p.BenchCPUS, 0)
		}
		r.res.Phases[name] = p
	}
}

// enroll enrolls every node, EnrollConcurrency at a time, and starts each
// node's agent loops as soon as it has its credential; it returns once
// every enrolled node has reported (or SettleTimeout passed).
func (r *fleetRun) enroll(ctx, nodeCtx context.Context, fleet *sync.WaitGroup, n int, token string, urls []string, polls, others *http.Client) error {
	cfg := r.cfg
	done := r.phase("enroll")
	var (
		next atomic.Int64
		mu   sync.Mutex
		wg   sync.WaitGroup
		rec  opRecorder
	)
	start := time.Now()
	for range min(cfg.EnrollConcurrency, n) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n && ctx.Err() == nil; i = int(next.Add(1) - 1) {
				node := newSimNode(i, urls[i%len(urls)], polls, others, r.prop, r.count, cfg.ReportInterval, cfg.ReportRefresh,
					&r.usageMode)
				t0 := time.Now()
				if err := node.enroll(ctx, token); err != nil {
					rec.fail(opOnly, fmt.Errorf("enroll node %d: %w", i, err))
					continue
				}
				rec.ok(opOnly, time.Since(t0))
				mu.Lock()
				r.nodes = append(r.nodes, node)
				mu.Unlock()
				fleet.Go(func() { node.run(nodeCtx, cfg.PollWait) })
			}
		})
	}
	wg.Wait()
	r.res.Enroll = rec.stats(time.Since(start))[opNames[opOnly]]
	r.res.Nodes = len(r.nodes)
	deadline := time.Now().Add(cfg.SettleTimeout)
	for r.count.connected.Load() < int64(len(r.nodes)) {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d nodes reported within %v", r.count.connected.Load(), len(r.nodes), cfg.SettleTimeout)
		}
		if r.cp.Exited() {
			return errors.New("the control plane exited during the enrolment burst")
		}
		sleepCtx(ctx, 20*time.Millisecond)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	r.res.SettleS = time.Since(start).Seconds()
	done()
	return nil
}

// load runs every management client with mix for d or until stop.
func (r *fleetRun) load(ctx context.Context, name string, mix [3]int, d time.Duration, stop func() bool) map[string]OpStats {
	done := r.phase(name)
	r.cpuProfile(ctx, name, d)
	var rec opRecorder
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	for _, c := range r.clients {
		wg.Go(func() { c.loop(ctx, &rec, mix, deadline, stop) })
	}
	wg.Wait()
	done()
	if dir := r.cfg.LatencyDir; dir != "" {
		path := filepath.Join(dir, fmt.Sprintf("%s.%s.latency.csv", r.cfg.fileStem(), name))
		if err := os.WriteFile(path, rec.latencyCSV(start), 0o644); err != nil {
			r.cfg.Log.Warn("fleet: latency log", "err", err)
		}
	}
	return rec.stats(time.Since(start))
}

// drain waits until every answered change has reached its node.
func (r *fleetRun) drain(ctx context.Context) {
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	for ctx.Err() == nil && time.Now().Before(deadline) {
		if pending, _ := r.prop.counts(); pending == 0 {
			return
		}
		sleepCtx(ctx, 20*time.Millisecond)
	}
}

// idle measures the connected fleet with no management traffic.
func (r *fleetRun) idle(ctx context.Context) {
	done := r.phase("idle")
	r.cpuProfile(ctx, "idle", r.cfg.IdleDuration)
	polls0 := r.count.polls.Load() + r.count.emptyPolls.Load()
	reports0 := r.count.reports.Load()
	start := time.Now()
	sleepCtx(ctx, r.cfg.IdleDuration)
	done()
	p := r.res.Phases["idle"]
	secs := time.Since(start).Seconds()
	r.res.Idle = IdleResult{Seconds: p.Seconds, ControlCPUS: p.ControlCPUS, PgCPUS: p.PgCPUS,
		PollsPerSecond:   float64(r.count.polls.Load()+r.count.emptyPolls.Load()-polls0) / secs,
		ReportsPerSecond: float64(r.count.reports.Load()-reports0) / secs}
	if n := len(r.nodes); n > 0 && p.Seconds > 0 {
		r.res.Idle.CPUmsPerNodeMinute = (p.ControlCPUS + p.PgCPUS) * 1000 / float64(n) / (p.Seconds / 60)
	}
	r.res.Reports.IdlePerSecond = r.res.Idle.ReportsPerSecond
}

// reportBurst has ReportConcurrency nodes at a time post their observed
// state back to back.
func (r *fleetRun) reportBurst(ctx context.Context) {
	done := r.phase("report_burst")
	var rec opRecorder
	reports0 := r.count.reports.Load()
	start := time.Now()
	deadline := start.Add(r.cfg.ReportDuration)
	var wg sync.WaitGroup
	workers := min(r.cfg.ReportConcurrency, len(r.nodes))
	for w := range workers {
		wg.Go(func() {
			for i := w; ctx.Err() == nil && time.Now().Before(deadline); i += workers {
				n := r.nodes[i%len(r.nodes)]
				t0 := time.Now()
				if err := n.report(ctx); err != nil {
					rec.fail(opOnly, err)
					continue
				}
				rec.ok(opOnly, time.Since(t0))
			}
		})
	}
	wg.Wait()
	done()
	elapsed := time.Since(start)
	r.res.Reports.Burst = rec.stats(elapsed)[opNames[opOnly]]
	r.res.Reports.BurstPerSecond = float64(r.count.reports.Load()-reports0) / elapsed.Seconds()
}

// cpuProfile takes a CPU profile of every replica during the phase that
// starts now and lasts d (up to 30 s of it, ending before the phase does).
func (r *fleetRun) cpuProfile(ctx context.Context, phase string, d time.Duration) {
	secs := min(int((d-500*time.Millisecond)/time.Second), 30)
	if secs < 1 {
		return
	}
	r.profile(ctx, phase, "cpu", fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs))
}

// profile saves a pprof endpoint of every replica (in the background) as
// <variant>.<phase>.r<replica>.<kind>.pprof in ProfileDir.
func (r *fleetRun) profile(ctx context.Context, phase, kind, path string) {
	if r.cfg.ProfileDir == "" {
		return
	}
	for i, rep := range r.cp.Replicas {
		if rep.PprofURL == "" {
			continue
		}
		file := filepath.Join(r.cfg.ProfileDir, fmt.Sprintf("%s.%s.r%d.%s.pprof", r.cfg.fileStem(), phase, i, kind))
		r.profiles.Go(func() {
			if err := bench.FetchProfile(ctx, rep.PprofURL+path, file, 2*time.Minute); err != nil {
				r.cfg.Log.Warn("fleet: profile", "file", file, "err", err)
				return
			}
			r.profMu.Lock()
			r.res.Profiles = append(r.res.Profiles, file)
			r.profMu.Unlock()
		})
	}
}

// machineBusy is the CPU time all processes on the machine have used
// (/proc/stat: user, nice, system, irq, softirq and steal), or 0 if
// unknown.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / bench.UserHZ
}

// loadAvg is /proc/loadavg's first three fields.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
