package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/cockroachdb/pebble/vfs"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/internal/backoff"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
	"github.com/hearthd/hearth/store"
)

// The node agent's tests run the real control plane (in-memory Pebble)
// inside a synctest bubble and reach it through an in-process transport:
// long-polls, report intervals, health rechecks and retry backoffs all run
// on the bubble's clock. A test says how much time passes, and what has
// happened by then does not depend on how loaded the machine is.

// controlURL is never dialled (the transport is in-process); the agent
// derives the IP it reports from it.
const controlURL = "http://127.0.0.1:8400"

// ctlPlane is the control plane. It can be stopped and started again with
// the same state; while it is down the transport refuses connections.
type ctlPlane struct {
	t     *testing.T
	fs    vfs.FS
	token string
	mod   func(*control.Config)

	mu       sync.Mutex
	st       *store.Store
	srv      *control.Server
	h        http.Handler
	stopping context.Context // cancelled on stop: ends open long-polls
	stopFn   context.CancelFunc
	inflight sync.WaitGroup
	done     chan struct{}
	reports  atomic.Int64 // observed states posted by nodes
}

var errRefused = errors.New("dial tcp 127.0.0.1:8400: connect: connection refused")

func startCtl(t *testing.T) *ctlPlane { return startCtlWith(t, nil) }

// startCtlWith starts the control plane with its configuration changed by
// mod.
func startCtlWith(t *testing.T, mod func(*control.Config)) *ctlPlane {
	c := &ctlPlane{t: t, fs: vfs.NewMem(), mod: mod}
	c.start()
	tok, err := control.CreateAPIToken(c.st, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c.token = tok.Token
	t.Cleanup(c.stop)
	return c
}

func (c *ctlPlane) start() {
	c.t.Helper()
	st, err := store.Open("db", store.Options{FS: c.fs})
	if err != nil {
		c.t.Fatal(err)
	}
	// A generous management rate limit: tests check status as often as
	// they like.
	cfg := control.Config{Store: st, SweepInterval: 50 * time.Millisecond, RateLimit: 1e6, RateBurst: 1e6, NodeRateLimit: 1e6, NodeRateBurst: 1e6}
	if c.mod != nil {
		c.mod(&cfg)
	}
	srv, err := control.New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	c.mu.Lock()
	c.st, c.srv, c.h, c.stopping, c.stopFn, c.done = st, srv, srv.Handler(), ctx, cancel, done
	c.mu.Unlock()
}

func (c *ctlPlane) stop() {
	c.mu.Lock()
	st := c.st
	c.h = nil
	c.mu.Unlock()
	if st == nil {
		return
	}
	c.stopFn()
	c.inflight.Wait()
	<-c.done
	if err := st.Close(); err != nil {
		c.t.Errorf("close store: %v", err)
	}
	c.mu.Lock()
	c.st = nil
	c.mu.Unlock()
}

func (c *ctlPlane) store() *store.Store {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st
}

// RoundTrip serves req in process. A request still open when the control
// plane stops fails as a dropped connection would.
func (c *ctlPlane) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	h, stopping := c.h, c.stopping
	if h != nil {
		c.inflight.Add(1)
	}
	c.mu.Unlock()
	if h == nil {
		return nil, errRefused
	}
	defer c.inflight.Done()
	if req.Method == http.MethodPost && req.URL.Path == nodeapi.PathObserved {
		c.reports.Add(1)
	}
	ctx, cancel := context.WithCancel(req.Context())
	defer cancel()
	defer context.AfterFunc(stopping, cancel)()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req.WithContext(ctx))
	if stopping.Err() != nil {
		return nil, errors.New("connection reset by peer")
	}
	return rec.Result(), nil
}

func (c *ctlPlane) enrollmentToken() string {
	c.t.Helper()
	et, err := control.CreateEnrollmentToken(c.store(), 1, time.Hour, time.Now())
	if err != nil {
		c.t.Fatal(err)
	}
	return et.Token
}

// api calls the management API and decodes the answer into out.
func (c *ctlPlane) api(method, path string, in, out any) int {
	c.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req := httptest.NewRequest(method, controlURL+path, body)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.RoundTrip(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("decode %s: %v", b, err)
		}
	}
	return resp.StatusCode
}

func (c *ctlPlane) serverStatus(id string) string {
	c.t.Helper()
	var s struct{ Status string }
	if code := c.api("GET", "/v1/servers/"+id, nil, &s); code == http.StatusNotFound {
		return "gone"
	}
	return s.Status
}

// createServer asks for a server until the agent's node is in the pool.
func (c *ctlPlane) createServer(body map[string]any) string {
	c.t.Helper()
	base := map[string]any{"name": "web", "chip": "m4", "ram": 32, "storage": 100, "stack": "bare", "billing": "monthly"}
	for k, v := range body {
		base[k] = v
	}
	var srv struct{ ID string }
	within(c.t, time.Minute, "server created", func() bool { return c.api("POST", "/v1/servers", base, &srv) == 201 })
	return srv.ID
}

// within lets bubble time pass in small steps until cond holds, failing
// once more than d of it has passed.
func within(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	start := time.Now()
	for {
		synctest.Wait()
		if cond() {
			return
		}
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// pass lets d of bubble time pass with everything settled after it.
func pass(d time.Duration) {
	time.Sleep(d)
	synctest.Wait()
}

type agentRun struct {
	agent    *agent.Node
	enf      *agent.Enforcer
	fw       *firewall.Fake
	keys     *sshkeys.Fake
	apiKeys  *fakeAPIKeys
	models   *fakeModels
	runtime  *agent.Runtime
	received atomic.Int64
	cancel   context.CancelFunc
	done     chan error
	once     sync.Once
	err      error
}

// stop ends Run and returns its error; it may be called more than once.
func (r *agentRun) stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
	})
	return r.err
}

func nodeConfig(t *testing.T, ctl *ctlPlane) agent.NodeConfig {
	return agent.NodeConfig{ControlURL: controlURL, EnrollmentToken: ctl.enrollmentToken(), Hostname: "n1",
		Hardware:       nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000},
		CredentialPath: filepath.Join(t.TempDir(), "node.cred"), HTTPClient: &http.Client{Transport: ctl}}
}

// defaultModel is what the agent's runtime serves when no model is
// ordered; the fake runtime has it, and "tiny", from the start.
const defaultModel = "node-default"

func startAgent(t *testing.T, cfg agent.NodeConfig, healthy *atomic.Bool) *agentRun {
	t.Helper()
	return startAgentLogged(t, cfg, healthy, nil)
}

// startAgentLogged is startAgent with the agent logging to log.
func startAgentLogged(t *testing.T, cfg agent.NodeConfig, healthy *atomic.Bool, log *slog.Logger) *agentRun {
	t.Helper()
	r := &agentRun{fw: &firewall.Fake{}, keys: sshkeys.NewFake(), apiKeys: newFakeAPIKeys(),
		models: newFakeModels(defaultModel, "tiny"), done: make(chan error, 1)}
	health := func(context.Context) error {
		if healthy != nil && !healthy.Load() {
			return errors.New("model not loaded")
		}
		return nil
	}
	if cfg.ReportInterval == 0 {
		cfg.ReportInterval = 50 * time.Millisecond
	}
	cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 200*time.Millisecond
	cfg.OnReceive = func(nodeapi.Desired) { r.received.Add(1) }
	cfg.Usage = r.apiKeys.Usage
	r.runtime = agent.NewRuntime(r.models, agent.RuntimeConfig{Default: defaultModel,
		Backoff: backoff.Backoff{Min: 10 * time.Millisecond, Max: 200 * time.Millisecond}}, nil)
	r.enf = agent.NewEnforcer(agent.Concerns{Firewall: r.fw, SSHKeys: r.keys, APIKeys: r.apiKeys, Runtime: r.runtime}, nil)
	r.agent = agent.NewNode(cfg, r.enf, health, log)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	rtDone := make(chan error, 1)
	go func() { rtDone <- r.runtime.Run(ctx) }()
	go func() {
		err := r.agent.Run(ctx)
		<-rtDone
		r.done <- err
	}()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func rulesOf(fw *firewall.Fake) []firewall.Rule {
	r, _ := fw.Rules()
	return r
}

func TestNodeAgentFollowsTheControlPlane(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		healthy := &atomic.Bool{}
		cfg := nodeConfig(t, ctl)
		run := startAgent(t, cfg, healthy)

		// Enrolled: the credential is stored privately and the node offers capacity.
		synctest.Wait()
		if fi, err := os.Stat(cfg.CredentialPath); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("credential: %v %v", fi, err)
		}
		var key struct{ ID string }
		pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL a@test"
		if code := ctl.api("POST", "/v1/ssh-keys", map[string]any{"name": "a", "public_key": pub}, &key); code != 201 {
			t.Fatalf("create key: %d", code)
		}
		srv := ctl.createServer(map[string]any{"stack": "deployment", "model": "tiny", "ssh_key_ids": []string{key.ID}})
		// Keys applied, but the runtime is unhealthy: still provisioning,
		// however long that lasts.
		synctest.Wait()
		if k, _ := run.keys.Keys(); len(k) != 1 || k[0].ID != key.ID {
			t.Fatalf("keys %v", k)
		}
		pass(10 * time.Second)
		if s := ctl.serverStatus(srv); s != "provisioning" || !run.enf.Enforced() {
			t.Fatalf("status %q with an unhealthy runtime (enforced %v)", s, run.enf.Enforced())
		}
		healthy.Store(true)
		within(t, time.Second, "running once healthy", func() bool { return ctl.serverStatus(srv) == "running" })
		var full struct{ IP *string }
		ctl.api("GET", "/v1/servers/"+srv, nil, &full)
		if full.IP == nil || *full.IP != "127.0.0.1" {
			t.Fatalf("reported ip %v", full.IP)
		}

		// A rule added through the API is applied at once: the long-poll
		// wakes, no timer stands in between (no bubble time passes).
		start := time.Now()
		if code := ctl.api("POST", "/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound",
			"protocol": "tcp", "port_range": "22", "action": "allow"}, nil); code != 201 {
			t.Fatalf("create rule: %d", code)
		}
		synctest.Wait()
		if r := rulesOf(run.fw); len(r) != 1 || r[0].PortRange != "22" || time.Since(start) != 0 {
			t.Fatalf("rules %v after %v", r, time.Since(start))
		}

		// Deleting the key removes it from the node, at once too.
		if code := ctl.api("DELETE", "/v1/ssh-keys/"+key.ID, nil, nil); code != 204 {
			t.Fatalf("delete key: %d", code)
		}
		synctest.Wait()
		if k, _ := run.keys.Keys(); len(k) != 0 {
			t.Fatalf("keys after delete: %v", k)
		}

		// Deleting the server wipes the node and returns it to the pool.
		if code := ctl.api("DELETE", "/v1/servers/"+srv, nil, nil); code != 204 {
			t.Fatalf("delete server: %d", code)
		}
		within(t, time.Second, "server gone", func() bool { return ctl.serverStatus(srv) == "gone" })
		if r := rulesOf(run.fw); len(r) != 0 {
			t.Fatalf("rules after wipe: %v", r)
		}
		synctest.Wait()
		if d, ok := run.agent.Desired(); !ok || d.Server != nil || d.Wipe {
			t.Fatalf("desired after the wipe: %+v", d)
		}
		if code := ctl.api("POST", "/v1/servers", map[string]any{"name": "again", "chip": "m4", "ram": 32, "storage": 100,
			"stack": "bare", "billing": "monthly"}, nil); code != 201 {
			t.Fatalf("node not back in the pool: %d", code)
		}
		// Every desired state received was counted, once: enrollment,
		// server, key, rule, key deleted, wipe, back in the pool, again.
		synctest.Wait()
		nodes, err := control.ListNodes(ctl.store())
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes %v %v", nodes, err)
		}
		if got := run.received.Load(); got < 6 || uint64(got) > nodes[0].Revision {
			t.Fatalf("%d desired states counted, node at revision %d", got, nodes[0].Revision)
		}
		if err := run.stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
	})
}

func TestNodeAgentReportsApplyErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		run := startAgent(t, nodeConfig(t, ctl), nil)
		run.fw.FailWith(errors.New("nft: permission denied"))
		srv := ctl.createServer(nil)
		synctest.Wait()
		if o := run.agent.Observed(); o.FirewallError != "nft: permission denied" {
			t.Fatalf("observed %+v", o)
		}
		var view struct {
			Enforcement struct {
				Firewall struct {
					Status string
					Error  *string
				}
			}
		}
		ctl.api("GET", "/v1/servers/"+srv, nil, &view)
		if fw := view.Enforcement.Firewall; fw.Status != control.EnforcementFailed || fw.Error == nil || *fw.Error != "nft: permission denied" {
			t.Fatalf("the control plane shows the firewall as %+v", fw)
		}
		pass(10 * time.Second)
		if s := ctl.serverStatus(srv); s != "provisioning" || run.enf.Enforced() {
			t.Fatalf("status %q while the firewall fails (enforced %v)", s, run.enf.Enforced())
		}
		// Once the firewall works again the agent retries on its own,
		// within its longest backoff.
		run.fw.FailWith(nil)
		within(t, 250*time.Millisecond, "running after retry", func() bool { return ctl.serverStatus(srv) == "running" })
		if !run.enf.Enforced() {
			t.Fatal("running but not enforced")
		}
	})
}

// A runtime that becomes healthy is reported at once, not a whole report
// interval later: the server turns running as soon as the model is loaded.
func TestNodeAgentReportsRecoveredHealthPromptly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		healthy := &atomic.Bool{}
		cfg := nodeConfig(t, ctl)
		cfg.ReportInterval, cfg.HealthRecheck = time.Hour, 20*time.Millisecond
		run := startAgent(t, cfg, healthy)
		srv := ctl.createServer(nil)
		synctest.Wait()
		if _, ok := run.fw.Rules(); !ok {
			t.Fatal("desired state not applied")
		}
		pass(10 * time.Second)
		if s := ctl.serverStatus(srv); s != "provisioning" {
			t.Fatalf("status %q with an unhealthy runtime", s)
		}
		healthy.Store(true)
		// One health recheck later, not ReportInterval (an hour).
		within(t, 20*time.Millisecond, "running once healthy", func() bool { return ctl.serverStatus(srv) == "running" })
	})
}

// A restart of the runtime is on the server at once (ReportNow), not a
// report interval later: restarting while it runs, then healthy, with the
// last restart's time and reason; a runtime that fails its health check
// is degraded.
func TestNodeAgentReportsRuntimeRestartsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		healthy := &atomic.Bool{}
		healthy.Store(true)
		cfg := nodeConfig(t, ctl)
		cfg.ReportInterval, cfg.HealthRecheck = time.Hour, 20*time.Millisecond
		var mu sync.Mutex
		var restarting bool
		var last *nodeapi.RuntimeRestart
		cfg.RuntimeRestarts = func() (bool, *nodeapi.RuntimeRestart) {
			mu.Lock()
			defer mu.Unlock()
			return restarting, last
		}
		run := startAgent(t, cfg, healthy)
		srv := ctl.createServer(nil)
		within(t, time.Second, "running", func() bool { return ctl.serverStatus(srv) == "running" })
		type health struct {
			Enforcement struct {
				Runtime struct {
					Health      string
					LastRestart *struct{ At, Reason string } `json:"last_restart"`
				}
			}
		}
		get := func() health {
			var h health
			ctl.api("GET", "/v1/servers/"+srv, nil, &h)
			return h
		}
		if h := get(); h.Enforcement.Runtime.Health != "healthy" || h.Enforcement.Runtime.LastRestart != nil {
			t.Fatalf("before: %+v", h)
		}
		at := time.Now().UTC().Truncate(time.Second)
		mu.Lock()
		restarting, last = true, &nodeapi.RuntimeRestart{At: at, Reason: "wedged: test"}
		mu.Unlock()
		run.agent.ReportNow()
		within(t, 10*time.Millisecond, "restarting reported", func() bool {
			r := get().Enforcement.Runtime
			return r.Health == "restarting" && r.LastRestart != nil && r.LastRestart.Reason == "wedged: test" &&
				r.LastRestart.At == at.Format(time.RFC3339)
		})
		mu.Lock()
		restarting = false
		mu.Unlock()
		run.agent.ReportNow()
		within(t, 10*time.Millisecond, "healthy again", func() bool { return get().Enforcement.Runtime.Health == "healthy" })
		healthy.Store(false)
		run.agent.ReportNow()
		within(t, 10*time.Millisecond, "degraded", func() bool { return get().Enforcement.Runtime.Health == "degraded" })
	})
}

// An unchanged observed state is posted every ReportRefresh, not every
// ReportInterval (the long-polls keep the node known to be alive); a change
// is posted at once or by the next interval, and the report time the
// management API shows is never older than ReportRefresh. With a 10 s
// interval, "running within 1 s" also needs the model's load, which lands
// while the apply's report is in flight, to wake the reporter.
func TestNodeAgentPostsUnchangedStateOnlyOnRefresh(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		cfg := nodeConfig(t, ctl)
		cfg.ReportInterval, cfg.ReportRefresh = 10*time.Second, time.Minute
		run := startAgent(t, cfg, nil)
		srv := ctl.createServer(map[string]any{"stack": "deployment", "model": "tiny"})
		within(t, time.Second, "running", func() bool { return ctl.serverStatus(srv) == "running" })
		var key struct{ ID string }
		if code := ctl.api("POST", "/v1/servers/"+srv+"/api-keys", map[string]any{"name": "app"}, &key); code != 201 {
			t.Fatalf("create API key: %d", code)
		}
		pass(30 * time.Second)

		start, reports0 := time.Now(), ctl.reports.Load()
		for time.Since(start) < 5*time.Minute {
			pass(5 * time.Second)
			at := ctl.server(srv).Enforcement.ReportedAt
			if at == nil {
				t.Fatal("no reported_at")
			}
			reported, err := time.Parse(time.RFC3339, *at)
			if err != nil {
				t.Fatal(err)
			}
			// reported_at has whole seconds.
			if age := time.Since(reported); age > cfg.ReportRefresh+time.Second {
				t.Fatalf("reported_at %s is %v old, want at most %v", *at, age, cfg.ReportRefresh)
			}
		}
		// 30 intervals in five minutes; a refresh every 40–60 s (RefreshAfter).
		if n := ctl.reports.Load() - reports0; n < 4 || n > 7 {
			t.Fatalf("%d reports of an unchanged state in 5 minutes, want 5–7 (one per ReportRefresh, jittered)", n)
		}

		// Usage is a change: on the node's control plane within an interval.
		run.apiKeys.use(key.ID)
		reports0 = ctl.reports.Load()
		pass(cfg.ReportInterval)
		var k struct{ Requests uint64 }
		ctl.api("GET", "/v1/servers/"+srv+"/api-keys/"+key.ID, nil, &k)
		if k.Requests != 1 || ctl.reports.Load()-reports0 != 1 {
			t.Fatalf("after one interval: %d requests on the key, %d reports", k.Requests, ctl.reports.Load()-reports0)
		}
	})
}

// A failed apply is retried with backoff, not only every report interval.
func TestNodeAgentRetriesFailedApplyPromptly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		cfg := nodeConfig(t, ctl)
		cfg.ReportInterval = time.Hour
		run := startAgent(t, cfg, nil)
		run.keys.SetErr(errors.New("authorized_keys: read-only file system"))
		srv := ctl.createServer(nil)
		// Backoff from 10 ms, doubling (with jitter) to 200 ms: at least
		// five retries within a second, where the report interval would
		// allow none.
		pass(time.Second)
		if _, failures := run.keys.Syncs(); failures < 5 {
			t.Fatalf("%d failed syncs in a second", failures)
		}
		if s := ctl.serverStatus(srv); s != "provisioning" {
			t.Fatalf("status %q while keys fail", s)
		}
		run.keys.SetErr(nil)
		within(t, 250*time.Millisecond, "running after a prompt retry", func() bool { return ctl.serverStatus(srv) == "running" })
	})
}

func TestNodeAgentKeepsStateWhileControlPlaneIsAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtl(t)
		cfg := nodeConfig(t, ctl)
		run := startAgent(t, cfg, nil)
		srv := ctl.createServer(nil)
		ctl.api("POST", "/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound",
			"protocol": "tcp", "port_range": "443", "action": "allow"}, nil)
		within(t, time.Second, "running", func() bool { return ctl.serverStatus(srv) == "running" })
		if r := rulesOf(run.fw); len(r) != 1 {
			t.Fatalf("rules %v", r)
		}
		applies := len(run.fw.Applied())

		// The control plane goes away: the node keeps its rules and applies
		// nothing new.
		ctl.stop()
		pass(30 * time.Second)
		if r := rulesOf(run.fw); len(r) != 1 || r[0].PortRange != "443" {
			t.Fatalf("rules while the control plane is away: %v", r)
		}
		if n := len(run.fw.Applied()); n != applies {
			t.Fatalf("%d applies while the control plane was away", n-applies)
		}
		// hearthd restarts meanwhile: the new agent enforces the stored state
		// before the control plane answers, without enrolling again.
		if err := run.stop(); err != nil {
			t.Fatal(err)
		}
		cfg.EnrollmentToken = ""
		run2 := startAgent(t, cfg, nil)
		synctest.Wait()
		if r := rulesOf(run2.fw); len(r) != 1 || r[0].PortRange != "443" || !run2.enf.Enforced() {
			t.Fatalf("stored state not enforced: %v", r)
		}
		if run2.received.Load() != 0 {
			t.Fatal("the stored state was counted as received from the control plane")
		}

		// The control plane comes back; a change made there converges
		// within the agent's longest backoff.
		ctl.start()
		if code := ctl.api("POST", "/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound",
			"protocol": "udp", "port_range": "53", "action": "allow"}, nil); code != 201 {
			t.Fatalf("create rule: %d", code)
		}
		within(t, 250*time.Millisecond, "converged after restart", func() bool { return len(rulesOf(run2.fw)) == 2 })
		if !slices.ContainsFunc(rulesOf(run2.fw), func(r firewall.Rule) bool { return r.PortRange == "53" }) {
			t.Fatal("new rule missing")
		}
		nodes, err := control.ListNodes(ctl.store())
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes %v %v: the restarted agent must reuse its credential", nodes, err)
		}
		rev := nodes[0].Revision
		within(t, time.Second, "observed revision reported", func() bool {
			nodes, _ := control.ListNodes(ctl.store())
			return nodes[0].Observed != nil && nodes[0].Observed.FirewallRevision == rev
		})
	})
}

func TestNodeAgentNeedsCredentialOrToken(t *testing.T) {
	a := agent.NewNode(agent.NodeConfig{ControlURL: "http://127.0.0.1:1", CredentialPath: filepath.Join(t.TempDir(), "c")},
		agent.NewEnforcer(agent.Concerns{Firewall: &firewall.Fake{}, SSHKeys: sshkeys.NewFake()}, nil), nil, nil)
	if err := a.Run(t.Context()); err == nil {
		t.Fatal("Run without credential or enrollment token succeeded")
	}
}

// TestNodeAgentRateLimitedIsNotUnreachable: a control plane that answers
// 429 is there: the agent says it was asked to slow down (never that the
// control plane is unreachable), waits what the answer's Retry-After asks
// and then goes on following it.
func TestNodeAgentRateLimitedIsNotUnreachable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtlWith(t, func(c *control.Config) { c.NodeRateLimit, c.NodeRateBurst = 0.1, 2 })
		var logs testutil.SyncBuffer
		startAgentLogged(t, nodeConfig(t, ctl), nil, slog.New(slog.NewTextHandler(&logs, nil)))
		// The first poll and report take the bucket; the next poll is
		// refused for the 10 s the bucket takes to refill one request.
		within(t, time.Second, "refused", func() bool { return strings.Contains(logs.String(), "slow down") })
		srv := ctl.createServer(nil)
		within(t, time.Minute, "running after the Retry-After", func() bool { return ctl.serverStatus(srv) == "running" })
		if strings.Contains(logs.String(), "unreachable") {
			t.Fatalf("a 429 was logged as the control plane unreachable:\n%s", logs.String())
		}
		if !strings.Contains(logs.String(), "retry_in=10s") {
			t.Fatalf("the wait is not the Retry-After:\n%s", logs.String())
		}
	})
}
