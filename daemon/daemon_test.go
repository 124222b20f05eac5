package daemon

import (
	"bufio"
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

	dto "github.com/prometheus/client_model/go"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/sealbox"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/llm/ollama"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/sshkeys"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/systemd"
)

// testRuntime is the fake runtime with what start-up needs: EnsureModel,
// and a Warm held until warmOpen is closed. Its first stream is held after
// one token until streamOpen is closed, and every stream is announced on
// started.
type testRuntime struct {
	*fake.Runtime
	ensures, warms, unloads atomic.Int64
	warmOpen                chan struct{}
	streamOpen              chan struct{}
	started                 chan *fake.StreamInfo
	chats                   atomic.Int64
	heldDone                atomic.Bool // the held stream gave its final event

	mu     sync.Mutex
	models []string // every ForModel
}

// ForModel is the runtime itself: the fake serves any model.
func (r *testRuntime) ForModel(model string) modelRuntime {
	r.mu.Lock()
	r.models = append(r.models, model)
	r.mu.Unlock()
	return r
}

func (r *testRuntime) Unload(context.Context) error {
	r.unloads.Add(1)
	return nil
}

func newTestRuntime() *testRuntime {
	return &testRuntime{Runtime: fake.New(fake.Config{Tokens: []string{"x"}, TokenCount: 5}),
		warmOpen: make(chan struct{}), streamOpen: make(chan struct{}), started: make(chan *fake.StreamInfo, 8)}
}

func (r *testRuntime) EnsureModel(context.Context, ollama.ModelSource) error {
	r.ensures.Add(1)
	return nil
}

func (r *testRuntime) Warm(ctx context.Context) (time.Duration, error) {
	r.warms.Add(1)
	select {
	case <-r.warmOpen:
		return time.Millisecond, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (r *testRuntime) Chat(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	s, err := r.Runtime.Chat(ctx, req)
	if err != nil {
		return nil, err
	}
	r.started <- r.LastStream()
	if r.chats.Add(1) > 1 {
		return s, nil
	}
	return &heldStream{Stream: s, ctx: ctx, open: r.streamOpen, done: &r.heldDone}, nil
}

// heldStream waits for open before its second event.
type heldStream struct {
	llm.Stream
	ctx  context.Context
	open <-chan struct{}
	done *atomic.Bool
	n    int
}

func (s *heldStream) Recv() (llm.Event, error) {
	if s.n++; s.n == 2 {
		select {
		case <-s.open:
		case <-s.ctx.Done():
		}
	}
	ev, err := s.Stream.Recv()
	if err == nil && ev.Done {
		s.done.Store(true)
	}
	return ev, err
}

// testNode is a node run by runNode with the test runtime, a standalone
// desired-state file and a real authorized_keys writer.
type testNode struct {
	nd       *node
	rt       *testRuntime
	notify   *systemd.Fake
	cfg      Config
	base     string // http://host:port
	cancel   context.CancelFunc
	done     chan error
	keysFile string
	once     sync.Once
	err      error
}

func startNode(t *testing.T, extra ...func(*node) component) *testNode {
	t.Helper()
	return startNodeWith(t, nil, extra...)
}

// startNodeWith is startNode with the configuration changed by mod.
func startNodeWith(t *testing.T, mod func(*Config), extra ...func(*node) component) *testNode {
	t.Helper()
	return startNodeOpts(t, mod, nil, extra...)
}

// startNodeOpts is startNodeWith with the options changed by modOpts.
func startNodeOpts(t *testing.T, mod func(*Config), modOpts func(*options), extra ...func(*node) component) *testNode {
	t.Helper()
	dir := t.TempDir()
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL a@test"
	desired := filepath.Join(dir, "desired.json")
	if err := os.WriteFile(desired, []byte(`{"ssh_keys": ["`+pub+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := Defaults()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.DesiredStateFile = desired
	cfg.AuthorizedKeysFile = filepath.Join(dir, "authorized_keys")
	cfg.ShutdownTimeout = time.Minute
	if mod != nil {
		mod(&cfg)
	}

	tn := &testNode{rt: newTestRuntime(), notify: &systemd.Fake{}, cfg: cfg, done: make(chan error, 1), keysFile: cfg.AuthorizedKeysFile}
	built := make(chan *node, 1)
	opts := options{
		runtime:    func(Config, *slog.Logger) (modelRuntime, error) { return tn.rt, nil },
		watchEvery: 10 * time.Millisecond,
		extra: append([]func(*node) component{func(nd *node) component {
			built <- nd
			return component{name: "test probe", phase: phaseBack, run: func(ctx context.Context) error { <-ctx.Done(); return nil }}
		}}, extra...),
	}
	if modOpts != nil {
		modOpts(&opts)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tn.cancel = cancel
	t.Cleanup(func() { _ = tn.stop() })
	go func() { tn.done <- runNode(ctx, cfg, "test", slog.New(slog.DiscardHandler), tn.notify, opts) }()
	select {
	case tn.nd = <-built:
	case err := <-tn.done:
		t.Fatalf("runNode: %v", err)
	}
	tn.base = "http://" + tn.nd.ln.Addr().String()
	return tn
}

// stop stops the node (if it is not stopped yet) and returns runNode's
// error.
func (tn *testNode) stop() error {
	tn.once.Do(func() {
		tn.cancel()
		select {
		case tn.err = <-tn.done:
		case <-time.After(hangGuard):
			tn.err = errors.New("runNode did not return after its context ended")
		}
	})
	return tn.err
}

func (tn *testNode) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(tn.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// hangGuard bounds the waits for what a node does by itself, so that a
// node that never does it fails its test with what it did instead, not
// the whole test binary at its timeout. Far above any wait that passes.
const hangGuard = 3 * time.Minute

func (tn *testNode) waitFor(t *testing.T, msg string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), hangGuard)
	defer cancel()
	if err := tn.notify.WaitFor(ctx, msg); err != nil {
		t.Fatalf("waiting for %s: %v (sent %q)", msg, err, tn.notify.Messages())
	}
}

// statuses returns the messages sent so far but watchdog pings.
func (tn *testNode) messages() []string {
	return slices.DeleteFunc(tn.notify.Messages(), func(m string) bool { return m == "WATCHDOG=1" })
}

// The node's whole life: /healthz at once and 503 until the model is warm,
// READY=1 only once it is warm and the desired state is applied, a re-warm
// when the runtime loses the model, and on stop STOPPING=1, the drain of a
// live stream, every component stopped — the store last — and no goroutine
// left behind.
func TestNodeLifecycle(t *testing.T) {
	noLeaks(t)
	var rec recorder
	var storeOK atomic.Bool
	tn := startNode(t, func(nd *node) component {
		// Stops behind the API: by then the stream has been drained, and the
		// store is still open.
		return component{name: "behind the API", phase: phaseBack, run: func(ctx context.Context) error {
			<-ctx.Done()
			var v struct{}
			storeOK.Store(errors.Is(nd.st.Get("no such key", &v), store.ErrNotFound))
			rec.add("back, stream done=" + boolString(nd.rt.(*testRuntime).heldDone.Load()))
			return nil
		}}
	}, func(*node) component {
		return component{name: "runtime stand-in", phase: phaseRuntime, run: rec.until("runtime")}
	})

	// Up at once, not ready while the model loads.
	tn.waitFor(t, "STATUS=loading model hearth-tiny")
	if code, body := tn.get(t, "/healthz"); code != 200 || body != `{"status":"ok"}` {
		t.Fatalf("healthz while loading: %d %s", code, body)
	}
	if code, body := tn.get(t, "/readyz"); code != 503 || !strings.Contains(body, "model is loading") {
		t.Fatalf("readyz while loading: %d %s", code, body)
	}
	if tn.notify.Count("READY=1") != 0 {
		t.Fatal("READY=1 before the model is warm")
	}

	// Warm: ready, with the desired state in force.
	close(tn.rt.warmOpen)
	tn.waitFor(t, "READY=1")
	want := []string{"STATUS=loading state", "STATUS=loading model hearth-tiny",
		"STATUS=applying firewall rules and SSH keys", "READY=1"}
	if got := tn.messages(); !slices.Equal(got[:min(len(got), 4)], want) {
		t.Fatalf("sd_notify %q, want %q first", got, want)
	}
	if !tn.nd.enf.Enforced() {
		t.Fatal("READY=1 before the desired state is in force")
	}
	if b, err := os.ReadFile(tn.keysFile); err != nil || !strings.Contains(string(b), "a@test") {
		t.Fatalf("authorized_keys %q %v", b, err)
	}
	tn.waitFor(t, "STATUS=serving hearth-tiny")
	if code, _ := tn.get(t, "/readyz"); code != 200 {
		t.Fatalf("readyz once ready: %d", code)
	}

	// The runtime loses the model: loaded again.
	warms := tn.rt.warms.Load()
	tn.rt.SetConfig(fake.Config{Tokens: []string{"x"}, TokenCount: 5, ReadyErr: llm.ErrUnavailable})
	tn.waitFor(t, "STATUS=reloading model hearth-tiny")
	tn.rt.SetConfig(fake.Config{Tokens: []string{"x"}, TokenCount: 5})
	testutil.WaitFor(t, 10*time.Second, "the model serving again", func() bool {
		return tn.notify.Count("STATUS=serving hearth-tiny") >= 2
	})
	if tn.rt.warms.Load() <= warms || tn.notify.Count("READY=1") != 1 {
		t.Fatalf("re-warm: %d warms (was %d), %d READY=1", tn.rt.warms.Load(), warms, tn.notify.Count("READY=1"))
	}

	// A stream in flight when the node is told to stop finishes.
	secret, _, err := tn.nd.keys.Create("test")
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", tn.base+"/api/v1/chat/completions",
		strings.NewReader(`{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	<-tn.rt.started
	stopped := make(chan error, 1)
	go func() { stopped <- tn.stop() }()
	tn.waitFor(t, "STOPPING=1")
	tn.waitFor(t, "STATUS=draining in-flight requests")
	close(tn.rt.streamOpen)
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, line)
		}
	}
	resp.Body.Close()
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("stream across the drain: %q", events)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("runNode: %v", err)
	}
	if ev := rec.get(); !slices.Equal(ev, []string{"back, stream done=true", "runtime"}) || !storeOK.Load() {
		t.Fatalf("stop order %v, store open while stopping: %v", ev, storeOK.Load())
	}
	// The store is closed: it opens again (Pebble locks an open one).
	st, err := store.Open(filepath.Join(tn.cfg.StateDir, "db"), store.Options{})
	if err != nil {
		t.Fatalf("store after the node stopped: %v", err)
	}
	st.Close()
}

func boolString(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// READY=1 waits for the desired state at most enforcementWait: a control
// plane away at first boot must not keep the deployment down.
func TestWaitEnforcedIsCapped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var logs strings.Builder
		log := slog.New(slog.NewTextHandler(&logs, nil))
		start := time.Now()
		waitEnforced(t.Context(), func() bool { return false }, enforcementWait, log)
		if waited := time.Since(start); waited != enforcementWait || enforcementWait != 30*time.Second {
			t.Fatalf("waited %v for an enforcement that never comes", waited)
		}
		if !strings.Contains(logs.String(), "reporting ready anyway") {
			t.Fatalf("log %q", logs.String())
		}

		var calls atomic.Int64
		start = time.Now()
		waitEnforced(t.Context(), func() bool { return calls.Add(1) == 4 }, enforcementWait, log)
		if waited := time.Since(start); waited != 300*time.Millisecond {
			t.Fatalf("returned %v after start, want at the third recheck (300ms)", waited)
		}

		ctx, cancel := context.WithCancel(t.Context())
		var once sync.Once
		waitEnforced(ctx, func() bool { once.Do(cancel); return false }, enforcementWait, log)
		if time.Since(start) != 300*time.Millisecond {
			t.Fatal("waitEnforced did not return when its context ended")
		}
	})
}

// The unmanaged key writer validates like the real one.
func TestUnmanagedKeysValidate(t *testing.T) {
	if err := (unmanagedKeys{}).Sync(t.Context(), []sshkeys.Key{{ID: "a", PublicKey: "ssh-ed25519 notbase64"}}); err == nil {
		t.Fatal("an invalid key was accepted")
	}
}

// With a control plane, the node agent feeds the same enforcer: READY=1
// waits for the first desired state to be in force, and every desired
// state received is counted (hearth_control_desired_state_deliveries_total,
// on the dashboard).
func TestNodeFollowsTheControlPlane(t *testing.T) {
	noLeaks(t)
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctl, err := control.New(control.Config{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	cp := httptest.NewServer(ctl.Handler())
	defer cp.Close()
	et, err := control.CreateEnrollmentToken(st, 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tn := startNodeWith(t, func(c *Config) {
		c.DesiredStateFile, c.ControlURL, c.EnrollmentToken = "", cp.URL, et.Token
		c.NodeChip, c.NodeRAM, c.NodeStorage = "m4", 64, 1000
	})
	close(tn.rt.warmOpen)
	tn.waitFor(t, "READY=1")
	if !tn.nd.enf.Enforced() {
		t.Fatal("READY=1 before the desired state is in force")
	}
	if got := counterValue(t, tn.nd.m, "hearth_control_desired_state_deliveries_total"); got < 1 {
		t.Fatalf("%v desired states counted after the first was applied", got)
	}
	if err := tn.stop(); err != nil {
		t.Fatalf("runNode: %v", err)
	}
}

func counterValue(t *testing.T, m *metrics.Node, name string) float64 {
	t.Helper()
	return family(t, m, name).GetMetric()[0].GetCounter().GetValue()
}

// family is the gathered metric family name.
func family(t *testing.T, m *metrics.Node, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	t.Fatalf("%s not exported", name)
	return nil
}

// mgmt calls a management API with token.
func mgmt(t *testing.T, base, token, method, path string, in, out any) int {
	t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, base+path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		_ = json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// chatStatus sends a chat for model with key and returns the status.
func (tn *testNode) chatStatus(t *testing.T, key, model string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", tn.base+"/api/v1/chat/completions",
		strings.NewReader(`{"model":"`+model+`","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// A managed node serves the model its server ordered, enforces the API
// keys the management API issues (and reports their use), and a deleted
// server wipes every key on the node, local ones too.
func TestNodeServesTheOrderedModelAndKeys(t *testing.T) {
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctl, err := control.New(control.Config{Store: st, SweepInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	go func() { _ = ctl.Run(cctx) }()
	cp := httptest.NewServer(ctl.Handler())
	defer cp.Close()
	et, err := control.CreateEnrollmentToken(st, 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := control.CreateAPIToken(st, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	api := func(method, path string, in, out any) int { return mgmt(t, cp.URL, tok.Token, method, path, in, out) }
	tn := startNodeWith(t, func(c *Config) {
		c.DesiredStateFile, c.ControlURL, c.EnrollmentToken = "", cp.URL, et.Token
		c.NodeChip, c.NodeRAM, c.NodeStorage = "m4", 64, 1000
	})
	close(tn.rt.warmOpen)
	close(tn.rt.streamOpen) // no stream is held
	tn.waitFor(t, "READY=1")
	local, _, err := tn.nd.keys.Create("break-glass")
	if err != nil {
		t.Fatal(err)
	}

	var srv struct{ ID, Status string }
	testutil.WaitFor(t, 10*time.Second, "server created", func() bool {
		return api("POST", "/v1/servers", map[string]any{"name": "web", "chip": "m4", "ram": 8, "storage": 100,
			"stack": "deployment", "model": "ordered-model", "billing": "monthly"}, &srv) == 201
	})
	testutil.WaitFor(t, 10*time.Second, "server running", func() bool {
		api("GET", "/v1/servers/"+srv.ID, nil, &srv)
		return srv.Status == "running"
	})
	if m := tn.nd.api.Model(); m != "ordered-model" || tn.rt.unloads.Load() != 1 {
		t.Fatalf("serving %q (%d unloads)", m, tn.rt.unloads.Load())
	}
	tn.waitFor(t, "STATUS=serving ordered-model")
	if code := tn.chatStatus(t, local, "hearth-tiny"); code != 404 {
		t.Fatalf("the old model after the switch: %d", code)
	}

	var key struct{ ID, Key string }
	if code := api("POST", "/v1/servers/"+srv.ID+"/api-keys", map[string]any{"name": "app"}, &key); code != 201 {
		t.Fatalf("create API key: %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "the issued key works", func() bool { return tn.chatStatus(t, key.Key, "ordered-model") == 200 })
	if code := tn.chatStatus(t, local, "ordered-model"); code != 200 {
		t.Fatalf("the local key beside managed ones: %d", code)
	}
	testutil.WaitFor(t, 30*time.Second, "usage reported", func() bool {
		var k struct {
			Requests   int
			LastUsedAt *string `json:"last_used_at"`
		}
		api("GET", "/v1/servers/"+srv.ID+"/api-keys/"+key.ID, nil, &k)
		return k.Requests == 1 && k.LastUsedAt != nil
	})
	if code := api("DELETE", "/v1/servers/"+srv.ID+"/api-keys/"+key.ID, nil, nil); code != 204 {
		t.Fatalf("delete API key: %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "the deleted key refused", func() bool { return tn.chatStatus(t, key.Key, "ordered-model") == 401 })

	if code := api("DELETE", "/v1/servers/"+srv.ID, nil, nil); code != 204 {
		t.Fatalf("delete server: %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "server gone", func() bool { return api("GET", "/v1/servers/"+srv.ID, nil, nil) == 404 })
	if code := tn.chatStatus(t, local, "hearth-tiny"); code != 401 || len(tn.nd.keys.List()) != 0 {
		t.Fatalf("the local key after the wipe: %d, keys %+v", code, tn.nd.keys.List())
	}
	// Back in the pool: the node serves its own --model again.
	testutil.WaitFor(t, 10*time.Second, "--model served again", func() bool { return tn.nd.api.Model() == "hearth-tiny" })
	if err := tn.stop(); err != nil {
		t.Fatalf("runNode: %v", err)
	}
}

// A supervised runtime found wedged (the Ollama backend's OnWedged) is
// restarted: the restart and its reason are in the node's report and in
// hearth_runtime_health while it runs (requests are not refused: the
// backend holds them for the restart), the model is loaded again, which
// ends the restart, and the counters and the recovery time count it. A
// runtime hearthd does not supervise is left to the backend to report.
func TestNodeRestartsAWedgedRuntime(t *testing.T) {
	restarting := make(chan string, 1)
	release := make(chan struct{})
	tn := startNodeOpts(t, nil, func(o *options) {
		o.restartRuntime = func(ctx context.Context, reason string) error {
			restarting <- reason
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	close(tn.rt.streamOpen)
	close(tn.rt.warmOpen)
	tn.waitFor(t, "READY=1")
	key, _, err := tn.nd.keys.Create("test")
	if err != nil {
		t.Fatal(err)
	}
	if code := tn.chatStatus(t, key, "hearth-tiny"); code != 200 {
		t.Fatalf("chat before: %d", code)
	}
	warms := tn.rt.warms.Load()
	if st, last := tn.nd.restarts.state(); st || last != nil || tn.nd.runtimeHealth() != "healthy" {
		t.Fatalf("before: restarting %v, last %+v, health %s", st, last, tn.nd.runtimeHealth())
	}

	before := time.Now()
	if !tn.nd.runtimeWedged("test: nothing back") {
		t.Fatal("runtimeWedged = false for a supervised runtime")
	}
	if reason := <-restarting; reason != "test: nothing back" {
		t.Fatalf("restarted for %q", reason)
	}
	st, last := tn.nd.restarts.state()
	if !st || last == nil || last.Reason != "wedged: test: nothing back" || last.At.Before(before.Add(-time.Second)) {
		t.Fatalf("while restarting: restarting %v, last %+v", st, last)
	}
	if h := tn.nd.runtimeHealth(); h != "restarting" {
		t.Fatalf("health while restarting: %s", h)
	}
	tn.waitFor(t, "STATUS=restarting the wedged model runtime")
	if code := tn.chatStatus(t, key, "hearth-tiny"); code == 503 {
		t.Fatal("chat refused while the runtime restarts: requests wait for it")
	}

	close(release)
	testutil.WaitFor(t, 10*time.Second, "the restart over", func() bool { st, _ := tn.nd.restarts.state(); return !st })
	if tn.rt.warms.Load() <= warms {
		t.Fatal("the restart ended without loading the model again")
	}
	if _, last := tn.nd.restarts.state(); last == nil || last.Reason != "wedged: test: nothing back" {
		t.Fatalf("last restart after: %+v", last)
	}
	if h := tn.nd.runtimeHealth(); h != "healthy" {
		t.Fatalf("health after: %s", h)
	}
	if code := tn.chatStatus(t, key, "hearth-tiny"); code != 200 {
		t.Fatalf("chat after: %d", code)
	}
	if v := counterValue(t, tn.nd.m, "hearth_runtime_wedges_total"); v != 1 {
		t.Fatalf("hearth_runtime_wedges_total = %v, want 1", v)
	}
	if v := labelled(t, tn.nd.m, "hearth_runtime_restarts_total", "reason", "wedged"); v != 1 {
		t.Fatalf("hearth_runtime_restarts_total{reason=wedged} = %v, want 1", v)
	}
	if n := histogramCount(t, tn.nd.m, "hearth_runtime_recovery_seconds"); n != 1 {
		t.Fatalf("recoveries observed: %d, want 1", n)
	}

	unsupervised := startNode(t)
	close(unsupervised.rt.warmOpen)
	unsupervised.waitFor(t, "READY=1")
	if unsupervised.nd.runtimeWedged("test: nothing back") {
		t.Fatal("runtimeWedged = true for a runtime hearthd does not supervise")
	}
	if v := counterValue(t, unsupervised.nd.m, "hearth_runtime_wedges_total"); v != 1 {
		t.Fatalf("hearth_runtime_wedges_total = %v, want 1", v)
	}
	if st, last := unsupervised.nd.restarts.state(); st || last != nil {
		t.Fatalf("unsupervised: restarting %v, last %+v", st, last)
	}
}

// The tenant's wipe replaces the node's sealing key with its API keys:
// a reasoning item sealed for the last tenant does not open for the next,
// after a restart either.
func TestWipeReplacesTheSealingKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seal, err := sealbox.Load(st)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := apikeys.Open(st, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := keys.Create("tenant's"); err != nil {
		t.Fatal(err)
	}
	sealed := seal.Seal(nil, []byte("thinking"), nil)
	if err := (managedKeys{keys, seal}).Wipe(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := seal.Open(nil, sealed, nil); err == nil {
		t.Fatal("the last tenant's seal opens after the wipe")
	}
	if n := len(keys.List()); n != 0 {
		t.Fatalf("%d keys after the wipe", n)
	}
	_ = keys.Close()
	_ = st.Close()
	st, err = store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if seal, err = sealbox.Load(st); err != nil {
		t.Fatal(err)
	}
	if _, err := seal.Open(nil, sealed, nil); err == nil {
		t.Fatal("the last tenant's seal opens after the wipe and a restart")
	}
}

// labelled is the value of name's sample with label = value.
func labelled(t *testing.T, m *metrics.Node, name, label, value string) float64 {
	t.Helper()
	for _, s := range family(t, m, name).GetMetric() {
		for _, l := range s.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return s.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("%s{%s=%q} not exported", name, label, value)
	return 0
}

// histogramCount is the sample count of the histogram name.
func histogramCount(t *testing.T, m *metrics.Node, name string) uint64 {
	t.Helper()
	return family(t, m, name).GetMetric()[0].GetHistogram().GetSampleCount()
}
