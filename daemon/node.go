package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
)

// NodeConfig configures the node agent: the part of hearthd that enrolls
// with the control plane and enforces the desired state it hands down.
type NodeConfig struct {
	// ControlURL is the control plane's base URL, e.g. http://10.0.0.1:8400.
	ControlURL string
	// EnrollmentToken is used once, when no credential is stored yet.
	EnrollmentToken string
	// Hostname is reported at enrollment. Default os.Hostname().
	Hostname string
	// Hardware is what this node offers to the capacity pool.
	Hardware nodeapi.Hardware
	// CredentialPath is where the node credential is kept (mode 0600).
	CredentialPath string
	// StatePath is where the last desired state is kept so a restarted
	// node enforces it before the control plane answers. Default
	// "desired.json" next to CredentialPath.
	StatePath string
	// IP is the address reported for the server. Default: the local
	// address this host uses to reach ControlURL.
	IP string
	// HTTPClient talks to the control plane. Default: a client without an
	// overall timeout (long-polls bound themselves).
	HTTPClient *http.Client
	// PollWait is how long each desired-state long-poll may wait on the
	// control plane. Default 30 s.
	PollWait time.Duration
	// ReportInterval is how often health is re-checked, failed applies are
	// retried and the observed state is re-posted. Default 10 s.
	ReportInterval time.Duration
	// HealthRecheck is how often health is re-checked while the last report
	// said unhealthy, so the server turns running as soon as the model is
	// loaded rather than up to a ReportInterval later. Default 1 s.
	HealthRecheck time.Duration
	// MinBackoff and MaxBackoff bound the exponential, jittered retry delay
	// while the control plane is away. Defaults 500 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// OnDesired, if set, is called after each desired state is applied
	// (for example to switch the deployment's model).
	OnDesired func(nodeapi.Desired)
}

// NodeAgent keeps a node's firewall and SSH keys at the control plane's
// desired state and reports what it applied.
type NodeAgent struct {
	cfg    NodeConfig
	fw     firewall.Firewall
	keys   sshkeys.Keys
	health func(context.Context) error
	log    *slog.Logger
	client *nodeapi.Client

	applyMu sync.Mutex // one apply at a time

	mu      sync.Mutex
	desired *nodeapi.Desired
	obs     nodeapi.Observed

	report chan struct{} // wakes the reporter; buffered 1

	lastSync atomic.Int64 // unix nanoseconds of the last answer from the control plane
}

// LastSync is when the control plane last answered a desired-state poll
// (zero before the first answer); metrics report the lag since then.
func (a *NodeAgent) LastSync() time.Time {
	ns := a.lastSync.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// NewNodeAgent builds an agent. health reports whether the model runtime is
// healthy; a nil health is always healthy.
func NewNodeAgent(cfg NodeConfig, fw firewall.Firewall, keys sshkeys.Keys, health func(context.Context) error, logger *slog.Logger) *NodeAgent {
	if cfg.StatePath == "" && cfg.CredentialPath != "" {
		cfg.StatePath = filepath.Join(filepath.Dir(cfg.CredentialPath), "desired.json")
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = nodeapi.DefaultWait * time.Second
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = 10 * time.Second
	}
	if cfg.HealthRecheck <= 0 {
		cfg.HealthRecheck = min(time.Second, cfg.ReportInterval)
	}
	if cfg.MinBackoff <= 0 {
		cfg.MinBackoff = 500 * time.Millisecond
	}
	if cfg.MaxBackoff < cfg.MinBackoff {
		cfg.MaxBackoff = max(30*time.Second, cfg.MinBackoff)
	}
	if health == nil {
		health = func(context.Context) error { return nil }
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &NodeAgent{
		cfg: cfg, fw: fw, keys: keys, health: health, log: logger.With("component", "node-agent"),
		client: nodeapi.NewClient(cfg.ControlURL, cfg.HTTPClient),
		report: make(chan struct{}, 1),
	}
}

// Desired returns the desired state currently enforced, if any.
func (a *NodeAgent) Desired() (nodeapi.Desired, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.desired == nil {
		return nodeapi.Desired{}, false
	}
	return *a.desired, true
}

// Observed returns the observed state as last computed.
func (a *NodeAgent) Observed() nodeapi.Observed {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.obs
}

// nodeCredential is the credential file's content.
type nodeCredential struct {
	NodeID     string `json:"node_id"`
	Credential string `json:"credential"`
	ControlURL string `json:"control_url"`
}

// Run enforces the locally stored desired state at once, enrolls if needed,
// then follows the control plane until ctx ends. While the control plane is
// away the last state stays in force and requests are retried with backoff.
func (a *NodeAgent) Run(ctx context.Context) error {
	if a.cfg.CredentialPath == "" {
		return errors.New("node agent: CredentialPath is required")
	}
	if d, err := a.loadDesired(); err != nil {
		a.log.Warn("ignoring unreadable local desired state", "path", a.cfg.StatePath, "err", err)
	} else if d != nil {
		a.log.Info("enforcing last known desired state", "revision", d.Revision)
		a.apply(ctx, *d, false)
	}
	cred, err := a.credential(ctx)
	if err != nil {
		return err
	}
	a.client.SetCredential(cred.Credential)
	a.log.Info("node agent connected", "node", cred.NodeID, "control_url", a.cfg.ControlURL)

	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		a.reporter(ctx)
	}()
	a.poll(ctx)
	wg.Wait()
	return nil
}

// credential loads the stored node credential or enrolls for one.
func (a *NodeAgent) credential(ctx context.Context) (nodeCredential, error) {
	var c nodeCredential
	b, err := os.ReadFile(a.cfg.CredentialPath)
	if err == nil {
		if err := json.Unmarshal(b, &c); err != nil || c.Credential == "" {
			return c, fmt.Errorf("node credential %s is corrupt", a.cfg.CredentialPath)
		}
		return c, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return c, fmt.Errorf("read node credential: %w", err)
	}
	if a.cfg.EnrollmentToken == "" {
		return c, fmt.Errorf("no node credential at %s and no enrollment token to enroll with", a.cfg.CredentialPath)
	}
	host := a.cfg.Hostname
	if host == "" {
		if host, err = os.Hostname(); err != nil {
			return c, fmt.Errorf("hostname: %w", err)
		}
	}
	bo := a.newBackoff()
	for {
		resp, err := a.client.Enroll(ctx, a.cfg.EnrollmentToken, nodeapi.EnrollRequest{Hostname: host, Hardware: a.cfg.Hardware})
		if err == nil {
			c = nodeCredential{NodeID: resp.NodeID, Credential: resp.Credential, ControlURL: a.cfg.ControlURL}
			b, _ := json.Marshal(c)
			if err := writeNodeFile(a.cfg.CredentialPath, b, 0o600); err != nil {
				return c, fmt.Errorf("store node credential: %w", err)
			}
			a.log.Info("node enrolled", "node", c.NodeID)
			return c, nil
		}
		var apiErr *nodeapi.Error
		if errors.As(err, &apiErr) && apiErr.Status < 500 && apiErr.Status != http.StatusTooManyRequests {
			return c, fmt.Errorf("enrollment refused: %w", err)
		}
		d := bo.next()
		a.log.Warn("enrollment failed; retrying", "err", err, "in", d)
		if !nodeSleep(ctx, d) {
			return c, ctx.Err()
		}
	}
}

// poll follows the desired state by revision.
func (a *NodeAgent) poll(ctx context.Context) {
	bo := a.newBackoff()
	for ctx.Err() == nil {
		after := uint64(0)
		if d, ok := a.Desired(); ok {
			after = d.Revision
		}
		d, changed, err := a.client.Desired(ctx, after, a.cfg.PollWait)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			wait := bo.next()
			a.log.Warn("control plane unreachable; keeping the last desired state", "err", err, "retry_in", wait)
			nodeSleep(ctx, wait)
			continue
		}
		bo.reset()
		a.lastSync.Store(time.Now().UnixNano())
		if changed {
			a.apply(ctx, d, true)
		}
	}
}

// apply enforces d: firewall rules and SSH keys (both emptied on wipe), and
// records the outcome for the next report.
func (a *NodeAgent) apply(ctx context.Context, d nodeapi.Desired, persist bool) {
	a.applyMu.Lock()
	defer a.applyMu.Unlock()
	if persist {
		if b, err := json.Marshal(d); err != nil {
			a.log.Error("encode desired state", "err", err)
		} else if err := writeNodeFile(a.cfg.StatePath, b, 0o600); err != nil {
			a.log.Error("persist desired state", "err", err)
		}
	}
	var rules []firewall.Rule
	var keys []sshkeys.Key
	if !d.Wipe {
		rules = make([]firewall.Rule, 0, len(d.FirewallRules))
		for _, r := range d.FirewallRules {
			rules = append(rules, firewall.Rule{ID: r.ID, Direction: r.Direction, Protocol: r.Protocol, PortRange: r.PortRange,
				Source: r.Source, Destination: r.Destination, Action: r.Action, Description: r.Description})
		}
		keys = make([]sshkeys.Key, 0, len(d.SSHKeys))
		for _, k := range d.SSHKeys {
			keys = append(keys, sshkeys.Key{ID: k.ID, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint})
		}
	}
	fwErr := a.fw.Apply(ctx, rules)
	if fwErr != nil {
		a.log.Error("apply firewall rules", "revision", d.Revision, "err", fwErr)
	}
	keysErr := a.keys.Sync(ctx, keys)
	if keysErr != nil {
		a.log.Error("sync SSH keys", "revision", d.Revision, "err", keysErr)
	}
	a.mu.Lock()
	a.desired = &d
	a.obs.Revision = d.Revision
	if fwErr == nil {
		a.obs.FirewallRevision, a.obs.FirewallError = d.Revision, ""
	} else {
		a.obs.FirewallError = fwErr.Error()
	}
	if keysErr == nil {
		a.obs.SSHKeysRevision, a.obs.SSHKeysError = d.Revision, ""
	} else {
		a.obs.SSHKeysError = keysErr.Error()
	}
	a.obs.Wiped = d.Wipe && fwErr == nil && keysErr == nil
	a.mu.Unlock()
	if fwErr == nil && keysErr == nil {
		a.log.Info("desired state applied", "revision", d.Revision, "rules", len(rules), "keys", len(keys), "wipe", d.Wipe)
	}
	if a.cfg.OnDesired != nil {
		a.cfg.OnDesired(d)
	}
	select {
	case a.report <- struct{}{}:
	default:
	}
}

// reporter posts the observed state after every apply and every
// ReportInterval, re-checking health. While the runtime is reported
// unhealthy it also reports as soon as it recovers, and while an apply has
// failed it retries it with backoff (MinBackoff to MaxBackoff), so a
// transient failure heals in about a second.
func (a *NodeAgent) reporter(ctx context.Context) {
	tick := time.NewTicker(a.cfg.ReportInterval)
	defer tick.Stop()
	bo, applyBo := a.newBackoff(), a.newBackoff()
	var retry, recheck, reapply <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.report:
		case <-retry:
		case <-recheck:
			hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := a.health(hctx)
			cancel()
			if err != nil {
				recheck = time.After(a.cfg.HealthRecheck)
				continue
			}
		case <-reapply:
			a.reapplyFailed(ctx)
		case <-tick.C:
			a.reapplyFailed(ctx)
		}
		retry, recheck, reapply = nil, nil, nil
		o := a.observe(ctx)
		if !o.RuntimeHealthy {
			recheck = time.After(a.cfg.HealthRecheck)
		}
		if o.FirewallError != "" || o.SSHKeysError != "" {
			reapply = time.After(applyBo.next())
		} else {
			applyBo.reset()
		}
		if err := a.client.ReportObserved(ctx, o); err != nil {
			if ctx.Err() != nil {
				return
			}
			wait := bo.next()
			a.log.Warn("report observed state failed", "err", err, "retry_in", wait)
			retry = time.After(wait)
			continue
		}
		bo.reset()
	}
}

// reapplyFailed applies the current desired state again if its last apply
// failed.
func (a *NodeAgent) reapplyFailed(ctx context.Context) {
	a.mu.Lock()
	failed := a.desired != nil && (a.obs.FirewallError != "" || a.obs.SSHKeysError != "")
	d := a.desired
	a.mu.Unlock()
	if failed {
		a.apply(ctx, *d, false)
		<-a.report // apply signalled the report about to be sent
	}
}

// observe completes the observed state with health and address.
func (a *NodeAgent) observe(ctx context.Context) nodeapi.Observed {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	herr := a.health(hctx)
	cancel()
	ip := a.cfg.IP
	if ip == "" {
		ip = nodeLocalIP(a.cfg.ControlURL)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.obs.IP = ip
	a.obs.RuntimeHealthy, a.obs.RuntimeError = herr == nil, ""
	if herr != nil {
		a.obs.RuntimeError = herr.Error()
	}
	return a.obs
}

func (a *NodeAgent) loadDesired() (*nodeapi.Desired, error) {
	b, err := os.ReadFile(a.cfg.StatePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", a.cfg.StatePath, err)
	}
	var d nodeapi.Desired
	if err := json.Unmarshal(b, &d); err != nil {
		return nil, fmt.Errorf("decode %s: %w", a.cfg.StatePath, err)
	}
	return &d, nil
}

// nodeLocalIP returns the local address the kernel would use to reach the
// control plane. Connecting a UDP socket sends no packet.
func nodeLocalIP(controlURL string) string {
	u, err := url.Parse(controlURL)
	if err != nil || u.Hostname() == "" {
		return ""
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	c, err := net.Dial("udp", net.JoinHostPort(u.Hostname(), port))
	if err != nil {
		return ""
	}
	defer c.Close()
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok {
		return a.IP.String()
	}
	return ""
}

type nodeBackoff struct {
	min, max time.Duration
	cur      time.Duration
}

func (a *NodeAgent) newBackoff() *nodeBackoff {
	return &nodeBackoff{min: a.cfg.MinBackoff, max: a.cfg.MaxBackoff}
}

// next doubles the delay up to max and returns it with "equal jitter" (half
// fixed, half random) so that many nodes do not retry in lockstep.
func (b *nodeBackoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

func (b *nodeBackoff) reset() { b.cur = 0 }

func nodeSleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// writeNodeFile replaces path with data: write a temporary file, sync,
// rename, sync the directory, so a crash leaves the old or the new file,
// never a torn one.
func writeNodeFile(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("chmod %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename to %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
