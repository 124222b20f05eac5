// Package controltest runs a real hearth-control process for tests of its
// clients (the client package, the hearth CLI), and fake nodes that enroll
// in it through the node protocol and report what a real node would, so
// that servers reach running, updating and gone without a hearthd.
package controltest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
	"github.com/hearthd/hearth/internal/certreload/certtest"
	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/nodeapi"
)

// Binaries are this module's commands, each built on first use (tests
// that need none build none) into a directory of the test binary's own.
type Binaries struct {
	dir   string
	mu    sync.Mutex
	built map[string]string
}

// Main runs a test binary's tests with b, removing what b built after:
//
//	var bins controltest.Binaries
//
//	func TestMain(m *testing.M) { os.Exit(controltest.Main(m, &bins)) }
func Main(m *testing.M, b *Binaries) int {
	dir, err := os.MkdirTemp("", "hearth-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	b.dir = dir
	return m.Run()
}

// Path returns the path of ./cmd/<name>, building it the first time.
func (b *Binaries) Path(t testing.TB, name string) string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.built[name]; ok {
		return p
	}
	if b.dir == "" {
		t.Fatal("controltest.Binaries used without controltest.Main")
	}
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatalf("go env GOMOD: %v", err)
	}
	bin := filepath.Join(b.dir, name)
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/"+name)
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(out)))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	if b.built == nil {
		b.built = map[string]string{}
	}
	b.built[name] = bin
	return bin
}

// TLSArgs issues a certificate for 127.0.0.1 from a new test CA and
// returns the serve flags that make hearth-control use it, and a file
// with the CA's certificate for its clients.
func TLSArgs(t testing.TB) (args []string, caFile string) {
	t.Helper()
	ca := certtest.NewCA(t)
	certs := certtest.NewDir(t)
	certPEM, keyPEM := ca.Issue(t, 2, time.Now().Add(time.Hour))
	certs.Renew(t, certPEM, keyPEM)
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return []string{"--tls-cert", certs.Cert(), "--tls-key", certs.Key()}, caFile
}

var urlRe = regexp.MustCompile(`msg="control plane serving" listen=\S+ url=(\S+)`)

// Control is one running `hearth-control serve`.
type Control struct {
	URL      string // http://127.0.0.1:port, or https:// when args give a certificate
	Token    string // a read-write management API token of the default project, made before the start
	StateDir string

	t      testing.TB
	bin    string
	dbURL  string // --database-url from args: the CLI works on that database
	log    *proctest.LogBuffer
	cmd    *exec.Cmd
	exited <-chan struct{}
}

// Start runs hearth-control on a free loopback port with a fresh
// state directory, no metrics listener and the deployment URL template
// http://{name}.deploy.test/api/v1; args come after these defaults, so a
// repeated flag overrides (--tls-cert and --tls-key make it serve HTTPS).
// It is stopped when the test ends; its log is printed if the test failed.
func Start(t testing.TB, b *Binaries, args ...string) *Control {
	t.Helper()
	bin := b.Path(t, "hearth-control")
	c := &Control{t: t, bin: bin, StateDir: t.TempDir(), log: &proctest.LogBuffer{Max: 8 << 20}}
	for i, a := range args {
		if a == "--database-url" && i+1 < len(args) {
			c.dbURL = args[i+1]
		}
	}
	c.Token = c.NewToken("default", "test", false)
	argv := append([]string{"serve", "--listen", "127.0.0.1:0", "--metrics-listen", "",
		"--state-dir", c.StateDir, "--log-level", "debug",
		"--public-deployment-url-template", "http://{name}.deploy.test/api/v1"}, args...)
	c.cmd = exec.Command(bin, argv...)
	c.cmd.Stdout, c.cmd.Stderr = c.log, c.log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := proctest.Start(c.cmd)
	if err != nil {
		t.Fatal(err)
	}
	c.exited = exited
	t.Cleanup(c.stop)
	err = proctest.WaitReady("hearth-control", exited, 30*time.Second, func() error {
		m := urlRe.FindStringSubmatch(c.log.String())
		if m == nil {
			return errors.New("listen address not logged")
		}
		c.URL = m[1]
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, c.log.String())
	}
	return c
}

func (c *Control) stop() {
	select {
	case <-c.exited:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.exited:
		case <-time.After(15 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
		}
	}
	if c.t.Failed() {
		c.t.Logf("hearth-control log:\n%s", c.log.Tail(64<<10))
	}
}

// Log is the process's output so far.
func (c *Control) Log() string { return c.log.String() }

// CLI runs a hearth-control command on this state directory (through the
// admin socket while the server runs) and returns its standard output.
func (c *Control) CLI(args ...string) string {
	c.t.Helper()
	args = append(args, "--state-dir", c.StateDir)
	if c.dbURL != "" {
		args = append(args, "--database-url", c.dbURL)
	}
	cmd := exec.Command(c.bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.t.Fatalf("hearth-control %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// NewToken issues a management API token of a project (ID or name; the
// state's first project is "default"), read-only if asked.
func (c *Control) NewToken(project, name string, readOnly bool) string {
	c.t.Helper()
	args := []string{"tokens", "create", "--project", project, "--name", name}
	if readOnly {
		args = append(args, "--read-only")
	}
	return strings.TrimSpace(c.CLI(args...))
}

// NewProject creates a project and returns a read-write token of it.
func (c *Control) NewProject(name string) string {
	c.t.Helper()
	c.CLI("projects", "create", "--name", name)
	return c.NewToken(name, name, false)
}

// Node is a fake node: it enrolls, long-polls its desired state and
// reports it applied at once — firewall rules, SSH keys and API keys at
// the desired revision, a healthy runtime serving the ordered model — as a
// hearthd that converges instantly would. Held, it keeps serving the model
// it served before (none at first), as a node still pulling would, and
// does not report a wipe done.
type Node struct {
	ID string

	t      testing.TB
	client *nodeapi.Client
	cancel context.CancelFunc
	done   chan struct{}

	// reporting orders the reports: each is computed and sent under it,
	// so the last one sent says the latest.
	reporting sync.Mutex
	mu        sync.Mutex
	desired   *nodeapi.Desired
	held      bool
	model     string // served, and the revision at which it was ordered
	modelAt   uint64
	// progress is the pull a held node reports; buckets its usage
	// buckets not yet accepted, numbered from seq.
	progress *nodeapi.PullProgress
	buckets  []nodeapi.UsageBucket
	seq      uint64
}

// NodeOptions says how a fake node behaves.
type NodeOptions struct {
	Hardware nodeapi.Hardware // default: chip cpu, 16 GB RAM, 100 GB storage
	// Hold starts the node holding its model: a server assigned to it
	// does not run until Release.
	Hold bool
	// ControlURL is the node's control plane URL, or comma-separated
	// list of replicas; default this Control's URL.
	ControlURL string
}

// StartNode enrolls a fake node and runs it until the test ends.
func (c *Control) StartNode(o NodeOptions) *Node {
	c.t.Helper()
	if o.Hardware == (nodeapi.Hardware{}) {
		o.Hardware = nodeapi.Hardware{Chip: "cpu", RAM: 16, Storage: 100}
	}
	enroll := strings.TrimSpace(c.CLI("enrollment-tokens", "create", "--uses", "1", "--ttl", "1h"))
	if o.ControlURL == "" {
		o.ControlURL = c.URL
	}
	n := &Node{t: c.t, client: nodeapi.NewClient(o.ControlURL, nil), held: o.Hold, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	resp, err := n.client.Enroll(ctx, enroll, nodeapi.EnrollRequest{Hostname: "fake-node", Hardware: o.Hardware})
	if err != nil {
		cancel()
		c.t.Fatalf("enroll fake node: %v", err)
	}
	n.ID = resp.NodeID
	n.client.SetCredential(resp.Credential)
	go n.run(ctx)
	c.t.Cleanup(func() {
		cancel()
		<-n.done
		n.client.CloseIdleConnections()
	})
	return n
}

func (n *Node) run(ctx context.Context) {
	defer close(n.done)
	bo := backoff.Backoff{Min: 10 * time.Millisecond, Max: 500 * time.Millisecond}
	var after uint64
	for ctx.Err() == nil {
		d, changed, err := n.client.Desired(ctx, after, nodeapi.DefaultWait)
		if err == nil && changed {
			after = d.Revision
			n.mu.Lock()
			n.desired = &d
			n.mu.Unlock()
			err = n.report(ctx)
		}
		if err != nil {
			if ctx.Err() == nil {
				n.t.Logf("fake node %s: %v", n.ID, err)
			}
			_ = backoff.Sleep(ctx, bo.Next())
			continue
		}
		bo.Reset()
	}
}

// report posts what the node applied for its last desired state.
func (n *Node) report(ctx context.Context) error {
	n.reporting.Lock()
	defer n.reporting.Unlock()
	n.mu.Lock()
	d := n.desired
	if d == nil {
		n.mu.Unlock()
		return nil
	}
	if !n.held {
		n.model, n.modelAt = d.Model, d.Revision
	}
	o := nodeapi.Observed{
		Revision: d.Revision, IP: "203.0.113.7", RuntimeHealthy: true,
		RuntimeRevision: n.modelAt, RuntimeModel: n.model,
		FirewallRevision: d.Revision, SSHKeysRevision: d.Revision, APIKeysRevision: d.Revision,
		Wiped: d.Wipe && !n.held, UsageBuckets: slices.Clone(n.buckets),
	}
	if n.held {
		o.RuntimeProgress = n.progress
	}
	n.mu.Unlock()
	if err := n.client.ReportObserved(ctx, o); err != nil {
		return err
	}
	n.mu.Lock()
	n.buckets = n.buckets[len(o.UsageBuckets):]
	n.mu.Unlock()
	return nil
}

// Use reports that key was used now: requests requests of prompt and
// completion tokens each, with a time to first token of ttft.
func (n *Node) Use(key string, requests, tokens uint64, ttft time.Duration) {
	n.t.Helper()
	n.mu.Lock()
	n.seq++
	b := nodeapi.UsageBucket{Seq: n.seq, KeyID: key, Minute: time.Now().UTC().Truncate(time.Minute), Requests: requests,
		PromptTokens: tokens, CompletionTokens: tokens}
	if ttft > 0 {
		b.TTFT = make([]uint64, nodeapi.TTFTBin(ttft)+1)
		b.TTFT[len(b.TTFT)-1] = requests
	}
	n.buckets = append(n.buckets, b)
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.report(ctx); err != nil {
		n.t.Fatalf("fake node %s: report usage: %v", n.ID, err)
	}
}

// Pull makes a held node report a model pull that far along.
func (n *Node) Pull(completed, total int64) {
	n.t.Helper()
	n.mu.Lock()
	n.progress = &nodeapi.PullProgress{Status: "pulling", Completed: completed, Total: total}
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.report(ctx); err != nil {
		n.t.Fatalf("fake node %s: report the pull: %v", n.ID, err)
	}
}

// Hold makes the node keep serving the model it serves now and not report
// a wipe done.
func (n *Node) Hold() {
	n.mu.Lock()
	n.held = true
	n.mu.Unlock()
}

// Release makes the node serve the ordered model (and finish a wipe) and
// reports it before returning.
func (n *Node) Release() {
	n.t.Helper()
	n.mu.Lock()
	n.held = false
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.report(ctx); err != nil {
		n.t.Fatalf("fake node %s: report on release: %v", n.ID, err)
	}
}
