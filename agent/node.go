package agent

import (
	"bytes"
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

	"github.com/hearthd/hearth/internal/backoff"
	"github.com/hearthd/hearth/nodeapi"
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
	// retried and the observed state is re-posted if it changed (usage,
	// health, an error). Default 10 s.
	ReportInterval time.Duration
	// ReportRefresh is how long an unchanged observed state may go without
	// being posted again. The node's liveness comes from its long-polls, so
	// re-posting the same state every ReportInterval would only cost the
	// control plane a request per node per interval; at least every
	// ReportRefresh it is posted anyway, so that the report time the
	// management API shows stays recent and a control plane restored from a
	// backup learns the node's state. Default 60 s; at least ReportInterval.
	ReportRefresh time.Duration
	// HealthRecheck is how often health is re-checked while the last report
	// said unhealthy, so the server turns running as soon as the model is
	// loaded rather than up to a ReportInterval later. Default 1 s.
	HealthRecheck time.Duration
	// MinBackoff and MaxBackoff bound the exponential, jittered retry delay
	// while the control plane is away. Defaults 500 ms and 30 s.
	MinBackoff, MaxBackoff time.Duration
	// OnReceive, if set, is called for each new desired state received
	// from the control plane, before it is applied (metrics count them).
	OnReceive func(nodeapi.Desired)
	// Usage, if set, returns the cumulative use of each managed API key,
	// reported with every observed state.
	Usage func() []nodeapi.KeyUsage
	// UsageBuckets, if set, returns up to limit of the usage buckets not
	// yet accepted by the control plane, oldest first, and whether more
	// wait; they go with the next report, and UsageAccepted is told the
	// last sequence number of a report the control plane accepted.
	UsageBuckets  func(limit int) (buckets []nodeapi.UsageBucket, more bool, err error)
	UsageAccepted func(seq uint64) error
	// ModelInfo, if set, returns what the runtime says of the served
	// model (context length, capabilities), reported with every observed
	// state.
	ModelInfo func() (contextLength int, capabilities []string)
	// RuntimeRestarts, if set, reports whether hearthd is restarting the
	// runtime now, and its last restart (nil if none), reported with every
	// observed state: the runtime's state is restarting while one runs,
	// else healthy or degraded as the health check says.
	RuntimeRestarts func() (restarting bool, last *nodeapi.RuntimeRestart)
}

// Node keeps a node at the control plane's desired state through its
// Enforcer and reports what is in force, with the runtime's health.
type Node struct {
	cfg    NodeConfig
	enf    *Enforcer
	health func(context.Context) error
	log    *slog.Logger
	client *nodeapi.Client

	mu        sync.Mutex
	desired   *nodeapi.Desired // the last one received (or loaded at start)
	ip        string           // as last reported
	healthErr error            // as last reported; errNotChecked before

	report chan struct{} // wakes the reporter; buffered 1

	lastSync atomic.Int64 // unix nanoseconds of the last answer from the control plane
}

var errNotChecked = errors.New("runtime health not checked yet")

// LastSync is when the control plane last answered a desired-state poll
// (zero before the first answer); metrics report the lag since then.
func (a *Node) LastSync() time.Time {
	ns := a.lastSync.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// NewNode builds a node agent applying through enf. health reports whether
// the model runtime is healthy; a nil health is always healthy.
func NewNode(cfg NodeConfig, enf *Enforcer, health func(context.Context) error, logger *slog.Logger) *Node {
	if cfg.StatePath == "" && cfg.CredentialPath != "" {
		cfg.StatePath = filepath.Join(filepath.Dir(cfg.CredentialPath), "desired.json")
	}
	if cfg.PollWait <= 0 {
		cfg.PollWait = nodeapi.DefaultWait
	}
	if cfg.ReportInterval <= 0 {
		cfg.ReportInterval = 10 * time.Second
	}
	if cfg.ReportRefresh <= 0 {
		cfg.ReportRefresh = 60 * time.Second
	}
	cfg.ReportRefresh = max(cfg.ReportRefresh, cfg.ReportInterval)
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
	return &Node{
		cfg: cfg, enf: enf, health: health, log: logger.With("component", "node-agent"),
		client:    nodeapi.NewClient(cfg.ControlURL, cfg.HTTPClient),
		report:    make(chan struct{}, 1),
		healthErr: errNotChecked,
	}
}

// Desired returns the last desired state received from the control plane
// (or restored from disk at start), if any; Observed says how much of it
// is in force.
func (a *Node) Desired() (nodeapi.Desired, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.desired == nil {
		return nodeapi.Desired{}, false
	}
	return *a.desired, true
}

// Observed returns the observed state to report: what the enforcer has in
// force, with the health and address last checked and the API keys' usage.
func (a *Node) Observed() nodeapi.Observed {
	o := a.enf.Observed()
	var usage []nodeapi.KeyUsage
	if a.cfg.Usage != nil {
		usage = a.cfg.Usage()
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	n := nodeapi.Observed{
		Revision:         o.Revision,
		IP:               a.ip,
		RuntimeHealthy:   a.healthErr == nil,
		RuntimeRevision:  o.Runtime.Revision,
		RuntimeModel:     o.Runtime.Model,
		FirewallRevision: o.Firewall.Revision,
		FirewallError:    o.Firewall.Error,
		SSHKeysRevision:  o.SSHKeys.Revision,
		SSHKeysError:     o.SSHKeys.Error,
		APIKeysRevision:  o.APIKeys.Revision,
		APIKeysError:     o.APIKeys.Error,
		Usage:            usage,
	}
	if a.cfg.ModelInfo != nil {
		n.RuntimeContextLength, n.RuntimeCapabilities = a.cfg.ModelInfo()
	}
	n.RuntimeState = nodeapi.RuntimeHealthy
	if a.healthErr != nil {
		n.RuntimeState = nodeapi.RuntimeDegraded
	}
	if a.cfg.RuntimeRestarts != nil {
		var restarting bool
		restarting, n.RuntimeLastRestart = a.cfg.RuntimeRestarts()
		if restarting {
			n.RuntimeState = nodeapi.RuntimeRestarting
		}
	}
	if p := o.Runtime.Progress; p.Status != "" {
		n.RuntimeProgress = &nodeapi.PullProgress{Status: p.Status, Completed: p.Completed, Total: p.Total}
	}
	// Why the ordered model is not served comes first; then why the one
	// served does not answer.
	switch {
	case o.Runtime.Error != "":
		n.RuntimeError = o.Runtime.Error
	case a.healthErr != nil:
		n.RuntimeError = a.healthErr.Error()
	}
	// The wipe is done once the wiping revision is in force for all the
	// tenant's data.
	n.Wiped = a.desired != nil && a.desired.Wipe && a.desired.Revision == o.Revision && o.TenantInForce(o.Revision)
	return n
}

// ReportNow has the observed state re-checked and posted at once (if it
// changed), as after an apply: the runtime's health changed.
func (a *Node) ReportNow() {
	select {
	case a.report <- struct{}{}:
	default:
	}
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
func (a *Node) Run(ctx context.Context) error {
	if a.cfg.CredentialPath == "" {
		return errors.New("node agent: CredentialPath is required")
	}
	if d, err := a.loadDesired(); err != nil {
		a.log.Warn("ignoring unreadable local desired state", "path", a.cfg.StatePath, "err", err)
	} else if d != nil {
		a.log.Info("enforcing last known desired state", "revision", d.Revision)
		a.apply(ctx, *d, false)
	}
	defer a.client.CloseIdleConnections()
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
func (a *Node) credential(ctx context.Context) (nodeCredential, error) {
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
		d := bo.Next()
		a.log.Warn("enrollment failed; retrying", "err", err, "in", d)
		if err := backoff.Sleep(ctx, d); err != nil {
			return c, err
		}
	}
}

// poll follows the desired state by revision.
func (a *Node) poll(ctx context.Context) {
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
			wait := a.retryWait(bo, err)
			if nodeapi.IsRateLimited(err) {
				a.log.Warn("control plane asked this node to slow down; polling again after its Retry-After", "retry_in", wait)
			} else {
				a.log.Warn("control plane unreachable; keeping the last desired state", "err", err, "retry_in", wait)
			}
			_ = backoff.Sleep(ctx, wait) // the loop ends when ctx does
			continue
		}
		bo.Reset()
		a.lastSync.Store(time.Now().UnixNano())
		if changed {
			if a.cfg.OnReceive != nil {
				a.cfg.OnReceive(d)
			}
			a.apply(ctx, d, true)
		}
	}
}

// apply enforces d through the enforcer (a wipe is the empty desired
// state), keeps it for the next start if persist, and wakes the reporter.
func (a *Node) apply(ctx context.Context, d nodeapi.Desired, persist bool) {
	if persist {
		if b, err := json.Marshal(d); err != nil {
			a.log.Error("encode desired state", "err", err)
		} else if err := writeNodeFile(a.cfg.StatePath, b, 0o600); err != nil {
			a.log.Error("persist desired state", "err", err)
		}
	}
	want := Desired{Revision: d.Revision, Model: d.Model, Wipe: d.Wipe}
	if !d.Wipe {
		want.FirewallRules, want.SSHKeys, want.APIKeys = d.FirewallRules, d.SSHKeys, d.APIKeys
	}
	o := a.enf.Apply(ctx, want)
	a.mu.Lock()
	a.desired = &d
	a.mu.Unlock()
	if d.Wipe && o.TenantInForce(d.Revision) {
		a.log.Info("server wiped: its rules, SSH keys, API keys and usage are removed", "revision", d.Revision)
	}
	a.ReportNow()
}

// reporter posts the observed state after every apply, every change the
// enforcer makes on its own (the model served, a pull's progress) and every
// ReportInterval if it changed (or ReportRefresh passed), re-checking
// health. While the runtime is reported unhealthy it also reports as soon
// as it recovers, and while an apply has failed it retries it with backoff
// (MinBackoff to MaxBackoff), so a transient failure heals in about a
// second.
func (a *Node) reporter(ctx context.Context) {
	tick := time.NewTicker(a.cfg.ReportInterval)
	defer tick.Stop()
	bo, applyBo := a.newBackoff(), a.newBackoff()
	var retry, recheck, reapply <-chan time.Time
	// The last state the control plane accepted, as posted, and when it is
	// to be posted again if unchanged.
	var (
		accepted  []byte
		refreshAt time.Time
	)
	// Taken before each observation, so that a change made while a report
	// is being observed or posted wakes the next round (a channel taken
	// after it would be the next change's).
	changed := a.enf.Changed()
	for {
		periodic := false
		select {
		case <-ctx.Done():
			return
		case <-a.report:
		case <-changed:
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
			a.enf.Retry(ctx)
		case <-tick.C:
			a.enf.Retry(ctx)
			periodic = true
		}
		retry, recheck, reapply = nil, nil, nil
		changed = a.enf.Changed()
		o := a.observe(ctx)
		if !o.RuntimeHealthy {
			recheck = time.After(a.cfg.HealthRecheck)
		}
		if a.enf.Observed().Failed() {
			reapply = time.After(applyBo.Next())
		} else {
			applyBo.Reset()
		}
		// Usage buckets waiting go with the report; a wipe is reported
		// with the last of them, so the tenant's use reaches the control
		// plane before its server is gone.
		buckets, more := a.pendingUsage()
		if more {
			o.Wiped = false
		}
		// The body is compared as the control plane would read it,
		// without the buckets: they are posted whenever there are any.
		body, err := json.Marshal(o)
		if err != nil {
			a.log.Error("encode observed state", "err", err)
			continue
		}
		if periodic && len(buckets) == 0 && bytes.Equal(body, accepted) && time.Now().Before(refreshAt) {
			continue
		}
		o.UsageBuckets = buckets
		if err := a.client.ReportObserved(ctx, o); err != nil {
			accepted = nil
			if ctx.Err() != nil {
				return
			}
			wait := a.retryWait(bo, err)
			if nodeapi.IsRateLimited(err) {
				a.log.Warn("control plane asked this node to slow down; reporting again after its Retry-After", "retry_in", wait)
			} else {
				a.log.Warn("report observed state failed", "err", err, "retry_in", wait)
			}
			retry = time.After(wait)
			continue
		}
		accepted, refreshAt = body, time.Now().Add(RefreshAfter(a.cfg.ReportInterval, a.cfg.ReportRefresh))
		bo.Reset()
		if len(buckets) > 0 {
			if err := a.cfg.UsageAccepted(buckets[len(buckets)-1].Seq); err != nil {
				a.log.Error("drop reported usage buckets", "err", err)
			}
		}
		if more {
			a.ReportNow()
		}
	}
}

// pendingUsage returns the usage buckets to report, and whether more wait
// for another report.
func (a *Node) pendingUsage() ([]nodeapi.UsageBucket, bool) {
	if a.cfg.UsageBuckets == nil || a.cfg.UsageAccepted == nil {
		return nil, false
	}
	b, more, err := a.cfg.UsageBuckets(nodeapi.MaxUsageBuckets)
	if err != nil {
		a.log.Error("read usage buckets", "err", err)
		return nil, false
	}
	return b, more
}

// RefreshAfter is how long after an accepted post an unchanged observed
// state is posted again: refresh less up to a quarter of it at random, so
// that nodes that posted together (say, once the control plane was back)
// spread out instead of posting in waves, and less half an interval, for
// the tick that falls due then comes a little before the time has passed.
func RefreshAfter(interval, refresh time.Duration) time.Duration {
	return refresh - rand.N(refresh/4+1) - interval/2
}

// observe checks health and address and returns the observed state.
func (a *Node) observe(ctx context.Context) nodeapi.Observed {
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	herr := a.health(hctx)
	cancel()
	ip := a.cfg.IP
	if ip == "" {
		ip = nodeLocalIP(a.client.BaseURL())
	}
	a.mu.Lock()
	a.ip, a.healthErr = ip, herr
	a.mu.Unlock()
	return a.Observed()
}

// retryWait is how long to wait before trying again after err: what a
// control plane that is there and rate-limits the node asks for (its
// Retry-After, not a growing backoff), else the next backoff, or longer
// if the control plane asked for longer.
func (a *Node) retryWait(bo *backoff.Backoff, err error) time.Duration {
	if nodeapi.IsRateLimited(err) {
		return max(nodeapi.RetryAfter(err), a.cfg.MinBackoff)
	}
	return max(bo.Next(), nodeapi.RetryAfter(err))
}

// newBackoff returns a retry backoff from MinBackoff to MaxBackoff,
// jittered so that many nodes do not retry in lockstep.
func (a *Node) newBackoff() *backoff.Backoff {
	return &backoff.Backoff{Min: a.cfg.MinBackoff, Max: a.cfg.MaxBackoff, Jitter: true}
}

func (a *Node) loadDesired() (*nodeapi.Desired, error) {
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
