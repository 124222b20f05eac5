package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/daemon"
	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
	"github.com/hearthd/hearth/store"
)

// ctlPlane is an in-process control plane on a loopback port that can be
// stopped and started again at the same address with the same state.
type ctlPlane struct {
	t      *testing.T
	dir    string
	addr   string
	st     *store.Store
	hs     *http.Server
	cancel context.CancelFunc
	done   chan struct{}
	token  string
}

func startCtl(t *testing.T) *ctlPlane {
	c := &ctlPlane{t: t, dir: t.TempDir(), addr: "127.0.0.1:0"}
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
	st, err := store.Open(filepath.Join(c.dir, "db"), store.Options{})
	if err != nil {
		c.t.Fatal(err)
	}
	srv, err := control.New(control.Config{Store: st, SweepInterval: 50 * time.Millisecond})
	if err != nil {
		c.t.Fatal(err)
	}
	var ln net.Listener
	for i := 0; ; i++ { // the old port may linger briefly after a stop
		if ln, err = net.Listen("tcp", c.addr); err == nil || i == 50 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatal(err)
	}
	c.addr = ln.Addr().String()
	c.st = st
	c.hs = &http.Server{Handler: srv.Handler()}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel, c.done = cancel, make(chan struct{})
	go func() { _ = c.hs.Serve(ln) }()
	go func() { defer close(c.done); _ = srv.Run(ctx) }()
}

func (c *ctlPlane) stop() {
	if c.st == nil {
		return
	}
	_ = c.hs.Close() // also ends open long-polls
	c.cancel()
	<-c.done
	if err := c.st.Close(); err != nil {
		c.t.Errorf("close store: %v", err)
	}
	c.st = nil
}

func (c *ctlPlane) url() string { return "http://" + c.addr }

func (c *ctlPlane) enrollmentToken() string {
	c.t.Helper()
	et, err := control.CreateEnrollmentToken(c.st, 1, time.Hour, time.Now())
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
	req, _ := http.NewRequest(method, c.url()+path, body)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
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
	var s struct{ Status string }
	if code := c.api("GET", "/v1/servers/"+id, nil, &s); code == http.StatusNotFound {
		return "gone"
	}
	return s.Status
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type agentRun struct {
	agent  *daemon.NodeAgent
	fw     *firewall.Fake
	keys   *sshkeys.Fake
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop ends Run and returns its error; it may be called more than once.
func (r *agentRun) stop() error {
	r.once.Do(func() {
		r.cancel()
		r.err = <-r.done
	})
	return r.err
}

func startAgent(t *testing.T, cfg daemon.NodeConfig, healthy *atomic.Bool) *agentRun {
	t.Helper()
	r := &agentRun{fw: &firewall.Fake{}, keys: sshkeys.NewFake(), done: make(chan error, 1)}
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
	r.agent = daemon.NewNodeAgent(cfg, r.fw, r.keys, health, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- r.agent.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop() })
	return r
}

func rulesOf(fw *firewall.Fake) []firewall.Rule {
	r, _ := fw.Rules()
	return r
}

func TestNodeAgentFollowsTheControlPlane(t *testing.T) {
	ctl := startCtl(t)
	healthy := &atomic.Bool{}
	dir := t.TempDir()
	cfg := daemon.NodeConfig{ControlURL: ctl.url(), EnrollmentToken: ctl.enrollmentToken(), Hostname: "n1",
		Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000}, CredentialPath: filepath.Join(dir, "node.cred")}
	run := startAgent(t, cfg, healthy)

	// Enrolled: the credential is stored privately and the node offers capacity.
	waitFor(t, 5*time.Second, "enrollment", func() bool { _, err := os.Stat(cfg.CredentialPath); return err == nil })
	if fi, _ := os.Stat(cfg.CredentialPath); fi.Mode().Perm() != 0o600 {
		t.Fatalf("credential mode %v", fi.Mode().Perm())
	}
	var key struct{ ID string }
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL a@test"
	if code := ctl.api("POST", "/v1/ssh-keys", map[string]any{"name": "a", "public_key": pub}, &key); code != 201 {
		t.Fatalf("create key: %d", code)
	}
	var srv struct{ ID string }
	waitFor(t, 5*time.Second, "server created", func() bool {
		return ctl.api("POST", "/v1/servers", map[string]any{"name": "web", "chip": "m4", "ram": 32, "storage": 100,
			"stack": "deployment", "model": "tiny", "billing": "monthly", "ssh_key_ids": []string{key.ID}}, &srv) == 201
	})
	// Keys applied, but the runtime is unhealthy: still provisioning.
	waitFor(t, 5*time.Second, "keys applied", func() bool { k, _ := run.keys.Keys(); return len(k) == 1 && k[0].ID == key.ID })
	time.Sleep(150 * time.Millisecond)
	if s := ctl.serverStatus(srv.ID); s != "provisioning" {
		t.Fatalf("status %q with an unhealthy runtime", s)
	}
	healthy.Store(true)
	waitFor(t, 5*time.Second, "running", func() bool { return ctl.serverStatus(srv.ID) == "running" })
	var full struct{ IP *string }
	ctl.api("GET", "/v1/servers/"+srv.ID, nil, &full)
	if full.IP == nil || *full.IP != "127.0.0.1" {
		t.Fatalf("reported ip %v", full.IP)
	}

	// A rule added through the API is applied in under a second.
	start := time.Now()
	if code := ctl.api("POST", "/v1/servers/"+srv.ID+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "tcp", "port_range": "22", "action": "allow"}, nil); code != 201 {
		t.Fatalf("create rule: %d", code)
	}
	waitFor(t, time.Second, "rule applied within 1s", func() bool {
		r := rulesOf(run.fw)
		return len(r) == 1 && r[0].PortRange == "22"
	})
	t.Logf("rule applied %v after the API answered", time.Since(start))

	// Deleting the key removes it from the node.
	if code := ctl.api("DELETE", "/v1/ssh-keys/"+key.ID, nil, nil); code != 204 {
		t.Fatalf("delete key: %d", code)
	}
	waitFor(t, time.Second, "key removed", func() bool { k, _ := run.keys.Keys(); return len(k) == 0 })

	// Deleting the server wipes the node and returns it to the pool.
	if code := ctl.api("DELETE", "/v1/servers/"+srv.ID, nil, nil); code != 204 {
		t.Fatalf("delete server: %d", code)
	}
	waitFor(t, 5*time.Second, "server gone", func() bool { return ctl.serverStatus(srv.ID) == "gone" })
	if r := rulesOf(run.fw); len(r) != 0 {
		t.Fatalf("rules after wipe: %v", r)
	}
	waitFor(t, time.Second, "empty desired state after the wipe", func() bool {
		d, ok := run.agent.Desired()
		return ok && d.Server == nil && !d.Wipe
	})
	if code := ctl.api("POST", "/v1/servers", map[string]any{"name": "again", "chip": "m4", "ram": 32, "storage": 100,
		"stack": "bare", "billing": "monthly"}, nil); code != 201 {
		t.Fatalf("node not back in the pool: %d", code)
	}
	if err := run.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestNodeAgentReportsApplyErrors(t *testing.T) {
	ctl := startCtl(t)
	dir := t.TempDir()
	cfg := daemon.NodeConfig{ControlURL: ctl.url(), EnrollmentToken: ctl.enrollmentToken(), Hostname: "n1",
		Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000}, CredentialPath: filepath.Join(dir, "node.cred")}
	run := startAgent(t, cfg, nil)
	run.fw.FailWith(errors.New("nft: permission denied"))
	var srv struct{ ID string }
	waitFor(t, 5*time.Second, "server created", func() bool {
		return ctl.api("POST", "/v1/servers", map[string]any{"name": "web", "chip": "m4", "ram": 32, "storage": 100,
			"stack": "bare", "billing": "monthly"}, &srv) == 201
	})
	waitFor(t, 5*time.Second, "error observed", func() bool { return run.agent.Observed().FirewallError != "" })
	time.Sleep(150 * time.Millisecond)
	if s := ctl.serverStatus(srv.ID); s != "provisioning" {
		t.Fatalf("status %q while the firewall fails", s)
	}
	// Once the firewall works again the agent retries on its own.
	run.fw.FailWith(nil)
	waitFor(t, 5*time.Second, "running after retry", func() bool { return ctl.serverStatus(srv.ID) == "running" })
}

// A runtime that becomes healthy is reported at once, not a whole report
// interval later: the server turns running as soon as the model is loaded.
func TestNodeAgentReportsRecoveredHealthPromptly(t *testing.T) {
	ctl := startCtl(t)
	healthy := &atomic.Bool{}
	dir := t.TempDir()
	cfg := daemon.NodeConfig{ControlURL: ctl.url(), EnrollmentToken: ctl.enrollmentToken(), Hostname: "n1",
		Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000}, CredentialPath: filepath.Join(dir, "node.cred"),
		ReportInterval: time.Hour, HealthRecheck: 20 * time.Millisecond}
	run := startAgent(t, cfg, healthy)
	var srv struct{ ID string }
	waitFor(t, 5*time.Second, "server created", func() bool {
		return ctl.api("POST", "/v1/servers", map[string]any{"name": "web", "chip": "m4", "ram": 32, "storage": 100,
			"stack": "bare", "billing": "monthly"}, &srv) == 201
	})
	waitFor(t, 5*time.Second, "desired state applied", func() bool { _, ok := run.fw.Rules(); return ok })
	time.Sleep(100 * time.Millisecond)
	if s := ctl.serverStatus(srv.ID); s != "provisioning" {
		t.Fatalf("status %q with an unhealthy runtime", s)
	}
	healthy.Store(true)
	// Far less than ReportInterval (an hour).
	waitFor(t, 5*time.Second, "running once healthy", func() bool { return ctl.serverStatus(srv.ID) == "running" })
}

// A failed apply is retried with backoff, not only every report interval.
func TestNodeAgentRetriesFailedApplyPromptly(t *testing.T) {
	ctl := startCtl(t)
	dir := t.TempDir()
	cfg := daemon.NodeConfig{ControlURL: ctl.url(), EnrollmentToken: ctl.enrollmentToken(), Hostname: "n1",
		Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000}, CredentialPath: filepath.Join(dir, "node.cred"),
		ReportInterval: time.Hour}
	run := startAgent(t, cfg, nil)
	run.keys.SetErr(errors.New("authorized_keys: read-only file system"))
	var srv struct{ ID string }
	waitFor(t, 5*time.Second, "server created", func() bool {
		return ctl.api("POST", "/v1/servers", map[string]any{"name": "web", "chip": "m4", "ram": 32, "storage": 100,
			"stack": "bare", "billing": "monthly"}, &srv) == 201
	})
	waitFor(t, 5*time.Second, "several failed syncs", func() bool { _, failures := run.keys.Syncs(); return failures >= 3 })
	if s := ctl.serverStatus(srv.ID); s != "provisioning" {
		t.Fatalf("status %q while keys fail", s)
	}
	run.keys.SetErr(nil)
	waitFor(t, 5*time.Second, "running after a prompt retry", func() bool { return ctl.serverStatus(srv.ID) == "running" })
}

func TestNodeAgentKeepsStateWhileControlPlaneIsAway(t *testing.T) {
	ctl := startCtl(t)
	dir := t.TempDir()
	cfg := daemon.NodeConfig{ControlURL: ctl.url(), EnrollmentToken: ctl.enrollmentToken(), Hostname: "n1",
		Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000}, CredentialPath: filepath.Join(dir, "node.cred")}
	run := startAgent(t, cfg, nil)
	var srv struct{ ID string }
	waitFor(t, 5*time.Second, "server created", func() bool {
		return ctl.api("POST", "/v1/servers", map[string]any{"name": "web", "chip": "m4", "ram": 32, "storage": 100,
			"stack": "bare", "billing": "monthly"}, &srv) == 201
	})
	ctl.api("POST", "/v1/servers/"+srv.ID+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "tcp", "port_range": "443", "action": "allow"}, nil)
	waitFor(t, 5*time.Second, "running", func() bool { return ctl.serverStatus(srv.ID) == "running" })
	waitFor(t, time.Second, "rule applied", func() bool { return len(rulesOf(run.fw)) == 1 })
	applies := len(run.fw.Applied())

	// The control plane goes away: the node keeps its rules and applies
	// nothing new.
	ctl.stop()
	time.Sleep(300 * time.Millisecond)
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
	waitFor(t, time.Second, "stored state enforced", func() bool {
		r := rulesOf(run2.fw)
		return len(r) == 1 && r[0].PortRange == "443"
	})

	// The control plane comes back; a change made there converges.
	ctl.start()
	if code := ctl.api("POST", "/v1/servers/"+srv.ID+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "udp", "port_range": "53", "action": "allow"}, nil); code != 201 {
		t.Fatalf("create rule: %d", code)
	}
	waitFor(t, 5*time.Second, "converged after restart", func() bool { return len(rulesOf(run2.fw)) == 2 })
	nodes, err := control.ListNodes(ctl.st)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes %v %v: the restarted agent must reuse its credential", nodes, err)
	}
	rev := nodes[0].Revision
	waitFor(t, 5*time.Second, "observed revision reported", func() bool {
		nodes, _ := control.ListNodes(ctl.st)
		return nodes[0].Observed != nil && nodes[0].Observed.FirewallRevision == rev
	})
	if !slices.ContainsFunc(rulesOf(run2.fw), func(r firewall.Rule) bool { return r.PortRange == "53" }) {
		t.Fatal("new rule missing")
	}
}

func TestNodeAgentNeedsCredentialOrToken(t *testing.T) {
	a := daemon.NewNodeAgent(daemon.NodeConfig{ControlURL: "http://127.0.0.1:1", CredentialPath: filepath.Join(t.TempDir(), "c")},
		&firewall.Fake{}, sshkeys.NewFake(), nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.Run(ctx); err == nil {
		t.Fatal("Run without credential or enrollment token succeeded")
	}
}
