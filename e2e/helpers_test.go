package e2e

// Helpers every e2e test uses: one way to start a child process (hearthd,
// hearth-control, sshd), capture its output, wait for a log line or a
// readiness probe, and stop, kill or restart it; the two daemons' clients;
// and small shared utilities.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/sshdtest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
)

var (
	listenRe        = regexp.MustCompile(`msg="deployment API listening" addr=(\S+)`)
	metricsRe       = regexp.MustCompile(`msg="metrics listening" addr=(\S+)`)
	controlListenRe = regexp.MustCompile(`msg="control plane serving" listen=(\S+) url=(\S+)`)
	keyRe           = regexp.MustCompile(`hearth_live_[A-Za-z0-9]+`)
)

// probe is a readiness check, polled until it passes.
type probe struct {
	what   string // what it waits for, for the failure message
	within time.Duration
	check  func(p *proc) error
}

// procSpec says how to start a child process.
type procSpec struct {
	argv   []string   // program and arguments
	prefix []string   // command to run argv under, e.g. ip netns exec NS
	env    []string   // KEY=VALUE added to the test's environment
	files  []*os.File // passed as fd 3 onwards
	ready  []probe    // awaited in order before startProc returns
}

// proc is one running child process; its stdout and stderr go to log.
type proc struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	log    *proctest.LogBuffer
	exited <-chan struct{} // closed once the child is reaped
}

// maxLog bounds a child's kept output. Tests find log lines by offset
// (logLen, findLog), so it is far above what any test's child writes.
const maxLog = 64 << 20

// startProc starts a child that is stopped (SIGTERM, then SIGKILL) when the
// test ends and SIGKILLed should the test binary die, and waits for its
// readiness probes. Its log is printed if the test failed.
func startProc(t *testing.T, name string, s procSpec) *proc {
	t.Helper()
	argv := append(slices.Clone(s.prefix), s.argv...)
	p := &proc{t: t, name: name, log: &proctest.LogBuffer{Max: maxLog}}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if len(s.env) > 0 {
		p.cmd.Env = append(os.Environ(), s.env...)
	}
	p.cmd.ExtraFiles = s.files
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// A grandchild that inherited the output must not hold up Wait.
	p.cmd.WaitDelay = 2 * time.Second
	// proctest.Start keeps the child's Pdeathsig tied to a thread of its
	// own, not to whichever thread (maybe one in a namespace) called us.
	exited, err := proctest.Start(p.cmd)
	if err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p.exited = exited
	t.Cleanup(func() {
		early := false
		select {
		case <-p.exited:
			early = true
		default:
		}
		p.stop()
		if t.Failed() {
			if early {
				t.Logf("%s had exited before the test ended: %v", name, p.cmd.ProcessState)
			}
			t.Logf("%s (pid %d) log:\n%s", name, p.cmd.Process.Pid, p.logs())
		}
	})
	for _, r := range s.ready {
		p.await(r)
	}
	return p
}

func (p *proc) logs() string { return p.log.String() }

func (p *proc) logLen() int { return len(p.logs()) }

// stop sends SIGTERM and waits; after 15 s it kills.
func (p *proc) stop() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		p.kill()
	}
}

// kill ends the process with SIGKILL: no drain, no close of its store.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// await polls r until it passes; the test fails if it does not within its
// time or the process exits first.
func (p *proc) await(r probe) {
	p.t.Helper()
	err := proctest.WaitReady(p.name+": "+r.what, p.exited, r.within, func() error { return r.check(p) })
	if err == nil {
		return
	}
	select {
	case <-p.exited:
		// The whole output is in by now: check it once more.
		if r.check(p) == nil {
			return
		}
		p.t.Fatalf("%s exited (%v) before %s:\n%s", p.name, p.cmd.ProcessState, r.what, p.logs())
	default:
	}
	p.t.Fatalf("%v:\n%s", err, p.logs())
}

// findLog returns the submatches of the first complete log line after the
// first `after` bytes that matches re, or nil.
func (p *proc) findLog(re *regexp.Regexp, after int) []string {
	l := p.logs()
	l = l[min(after, len(l)):]
	l = l[:strings.LastIndexByte(l, '\n')+1] // a line still being written may match too early
	for line := range strings.Lines(l) {
		if m := re.FindStringSubmatch(line); m != nil {
			return m
		}
	}
	return nil
}

// waitLog waits until a log line after the first `after` bytes (logLen
// marks a point) matches re, and returns its submatches.
func (p *proc) waitLog(re *regexp.Regexp, after int, within time.Duration) []string {
	p.t.Helper()
	var m []string
	p.await(probe{what: "log line matching " + re.String(), within: within, check: func(p *proc) error {
		if m = p.findLog(re, after); m == nil {
			return errors.New("not logged")
		}
		return nil
	}})
	return m
}

// probeClient bounds one readiness request: a hung one must not outlast the
// probe's deadline.
var probeClient = &http.Client{Timeout: 5 * time.Second}

// getOK is a readiness check: GET url answers 200.
func getOK(url string) error {
	resp, err := probeClient.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d", url, resp.StatusCode)
	}
	return nil
}

// hearthd is one running `hearthd serve` process.
type hearthd struct {
	*proc
	t        *testing.T
	bin      string
	stateDir string
	root     string // http://host:port
	url      string // deployment URL (…/api/v1)
	secret   string // an API key issued before start ("" if the state came from elsewhere)
	opts     hearthdOpts
}

// hearthdOpts says how to start hearthd. Without them: listen and serve
// metrics on free loopback ports (never the default metrics port, which
// processes running at once would share), a fresh state directory with an
// API key issued before the start, debug logs, and return once the listen
// address is logged.
type hearthdOpts struct {
	args     []string   // serve flags after the defaults; a repeated flag overrides
	env      []string   // KEY=VALUE for the daemon only
	prefix   []string   // command to run hearthd under, e.g. ip netns exec NS
	files    []*os.File // passed as fd 3 onwards
	stateDir string     // an existing state directory: no key is issued
	secret   string     // the key already in stateDir, if any
	ready    bool       // also wait until /readyz answers 200 (the model is warm)
	probe    *probe     // readiness instead of the logged listen address and ready (root stays unset)
}

// startHearthd starts `hearthd serve` as o says.
func startHearthd(t *testing.T, o hearthdOpts) *hearthd {
	t.Helper()
	h := &hearthd{t: t, bin: binary(t, "hearthd"), stateDir: o.stateDir, secret: o.secret}
	if h.stateDir == "" {
		// No daemon yet: the CLI writes straight into the state.
		h.stateDir = t.TempDir()
		h.secret = h.createKey("e2e")
	}
	o.stateDir, o.secret = h.stateDir, h.secret
	h.opts = o
	argv := append([]string{h.bin, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--state-dir", h.stateDir, "--log-level", "debug"}, o.args...)
	ready := []probe{{what: "listen address logged", within: 30 * time.Second, check: func(p *proc) error {
		m := p.findLog(listenRe, 0)
		if m == nil {
			return errors.New("not logged")
		}
		h.root = "http://" + m[1]
		h.url = h.root + "/api/v1"
		return nil
	}}}
	if o.ready {
		ready = append(ready, h.readyProbe(120*time.Second))
	}
	if o.probe != nil {
		ready = []probe{*o.probe}
	}
	name := "hearthd"
	if len(o.prefix) > 0 {
		name = "hearthd (under " + strings.Join(o.prefix, " ") + ")"
	}
	h.proc = startProc(t, name, procSpec{argv: argv, prefix: o.prefix, env: o.env, files: o.files, ready: ready})
	return h
}

func (h *hearthd) readyProbe(within time.Duration) probe {
	return probe{what: "/readyz 200", within: within, check: func(*proc) error { return getOK(h.root + "/readyz") }}
}

// waitReady waits until /readyz answers 200.
func (h *hearthd) waitReady(within time.Duration) {
	h.t.Helper()
	h.await(h.readyProbe(within))
}

// restart starts hearthd again on the same state directory with args
// (none: the same as before) and returns once it listens; it does not wait
// for readiness.
func (h *hearthd) restart(args ...string) *hearthd {
	h.t.Helper()
	o := h.opts
	o.ready = false
	if len(args) > 0 {
		o.args = args
	}
	return startHearthd(h.t, o)
}

// keysCLI runs `hearthd keys …` against this node's state directory.
func (h *hearthd) keysCLI(args ...string) string {
	h.t.Helper()
	full := append([]string{h.bin, "keys"}, args...)
	return runCmd(h.t, append(full, "--state-dir", h.stateDir)...)
}

func (h *hearthd) createKey(name string) string {
	h.t.Helper()
	out := h.keysCLI("create", "--name", name)
	key := keyRe.FindString(out)
	if key == "" {
		h.t.Fatalf("no key in %q", out)
	}
	return key
}

// keyID returns the ID of the key named name in `hearthd keys list`
// output, or "".
func keyID(list, name string) string {
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == name {
			return f[0]
		}
	}
	return ""
}

func (h *hearthd) client(key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(h.url), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// attached starts hearthd attached to the shared Ollama and waits until it
// is ready.
func attached(t *testing.T) (*hearthd, *ollamatest.Instance) {
	inst := shared.ollama.Get(t)
	return attachedTo(t, inst), inst
}

// attachedTo starts hearthd in front of inst, serving its model.
func attachedTo(t *testing.T, inst *ollamatest.Instance) *hearthd {
	return startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL}})
}

func userParams(model, prompt string, maxTokens int64) openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:     model,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(prompt)},
		MaxTokens: openai.Int(maxTokens),
	}
}

// postChat sends a chat request with a raw body and returns the response.
func postChat(t *testing.T, h *hearthd, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", h.url+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("chat: %v", err)
	}
	return resp
}

// controlPlane is one running `hearth-control serve` process.
type controlPlane struct {
	*proc
	t        *testing.T
	bin      string
	stateDir string
	url      string   // http://host:port, or https:// when args serve TLS
	token    string   // a management API token of the default project
	args     []string // serve flags after the defaults
	// client is the management API's client: the default one, or one
	// trusting the test CA of a control plane serving TLS.
	client *http.Client
}

// noRateLimit lifts the management API's per-token rate limit, for tests
// that send far more than a customer may.
var noRateLimit = []string{"--rate-limit", "100000", "--rate-burst", "100000"}

// startControl starts the control plane on a free loopback port and a fresh
// state directory, with args after the defaults. The first API token is
// made before the process starts (straight into the state).
func startControl(t *testing.T, args ...string) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, bin: binary(t, "hearth-control"), stateDir: t.TempDir(), args: args, client: http.DefaultClient}
	c.token = strings.TrimSpace(c.cli("tokens", "create", "--project", "default", "--name", "e2e"))
	c.launch("127.0.0.1:0")
	return c
}

func (c *controlPlane) launch(listen string) {
	c.t.Helper()
	argv := append([]string{c.bin, "serve", "--listen", listen, "--metrics-listen", "127.0.0.1:0",
		"--state-dir", c.stateDir, "--log-level", "debug",
		"--public-deployment-url-template", "http://{name}.deploy.test/api/v1"}, c.args...)
	c.proc = startProc(c.t, "hearth-control", procSpec{argv: argv, ready: []probe{{what: "listen address logged",
		within: 30 * time.Second, check: func(p *proc) error {
			m := p.findLog(controlListenRe, 0)
			if m == nil {
				return errors.New("not logged")
			}
			c.url = m[2]
			return nil
		}}}})
}

// restart starts a new process on the same state, token and address, so
// clients find it where the old one was.
func (c *controlPlane) restart() *controlPlane {
	c.t.Helper()
	n := &controlPlane{t: c.t, bin: c.bin, stateDir: c.stateDir, token: c.token, args: c.args, client: c.client}
	u, err := url.Parse(c.url)
	if err != nil {
		c.t.Fatal(err)
	}
	n.launch(u.Host)
	return n
}

// cli runs a hearth-control command against this state directory and
// returns its standard output.
func (c *controlPlane) cli(args ...string) string {
	c.t.Helper()
	full := append([]string{c.bin}, args...)
	full = append(full, "--state-dir", c.stateDir)
	// On a shared database the commands work on it, not on a Pebble state.
	for i, a := range c.args {
		if a == "--database-url" && i+1 < len(c.args) {
			full = append(full, "--database-url", c.args[i+1])
		}
	}
	return runCmd(c.t, full...)
}

func (c *controlPlane) api(method, path string, in, out any) int {
	c.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.url+path, body)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.client.Do(req)
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

func (c *controlPlane) mustCreate(path string, body any) string {
	c.t.Helper()
	var out struct{ ID string }
	if code := c.api("POST", path, body, &out); code != http.StatusCreated || out.ID == "" {
		c.t.Fatalf("POST %s: %d", path, code)
	}
	return out.ID
}

// enrollmentToken issues a token for n nodes.
func (c *controlPlane) enrollmentToken(n int) string {
	c.t.Helper()
	return strings.TrimSpace(c.cli("enrollment-tokens", "create", "--uses", strconv.Itoa(n), "--ttl", "1h"))
}

type nodeInfo struct {
	ID       string `json:"id"`
	ServerID string `json:"server_id"`
	Revision uint64 `json:"revision"`
	Observed *struct {
		FirewallRevision uint64 `json:"firewall_revision"`
		SSHKeysRevision  uint64 `json:"ssh_keys_revision"`
		RuntimeHealthy   bool   `json:"runtime_healthy"`
	} `json:"observed"`
}

func (c *controlPlane) nodes() []nodeInfo {
	c.t.Helper()
	var n []nodeInfo
	if err := json.Unmarshal([]byte(c.cli("nodes", "list")), &n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

// node returns the enrolled node's record by ID.
func (c *controlPlane) node(id string) nodeInfo {
	c.t.Helper()
	for _, n := range c.nodes() {
		if n.ID == id {
			return n
		}
	}
	c.t.Fatalf("no node %s", id)
	return nodeInfo{}
}

// applied waits until node id has applied its current desired revision
// and returns that revision.
func (c *controlPlane) applied(id string, within time.Duration) uint64 {
	c.t.Helper()
	var rev uint64
	testutil.WaitFor(c.t, within, "node "+id+" applied its desired state", func() bool {
		n := c.node(id)
		rev = n.Revision
		return n.Observed != nil && n.Observed.FirewallRevision == n.Revision && n.Observed.SSHKeysRevision == n.Revision
	})
	return rev
}

// runCmd runs a command to completion and returns its standard output; the
// test fails, showing standard error, if it fails.
func runCmd(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, ee.Stderr)
		}
		t.Fatalf("%s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

// startMockRuntime serves the bench mock runtime (an Ollama look-alike with
// synthetic tokens) on loopback for the test.
func startMockRuntime(t *testing.T, model string, cfg bench.MockConfig) *bench.MockServer {
	t.Helper()
	m, err := bench.StartMock("127.0.0.1:0", model, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// tinyModelFiles writes the tiny test model and its template.
func tinyModelFiles(t *testing.T) (gguf, tmpl string) {
	t.Helper()
	dir := t.TempDir()
	gguf = filepath.Join(dir, "tiny.gguf")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{}); err != nil {
		t.Fatal(err)
	}
	tmpl = filepath.Join(dir, "tiny.template")
	if err := os.WriteFile(tmpl, []byte(tinymodel.Template), 0o644); err != nil {
		t.Fatal(err)
	}
	return gguf, tmpl
}

// genPubKey returns a fresh ssh-ed25519 public key line with comment.
func genPubKey(t *testing.T, comment string) string {
	t.Helper()
	_, line := sshdtest.NewSigner(t)
	return line + " " + comment
}
