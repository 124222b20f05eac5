package fleet

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/nodeapi"
)

// fleetChip is the chip every simulated node offers and every server asks
// for: one capacity pool, so every create considers the whole fleet.
const fleetChip = "bench"

// nodeRetry is how long a simulated node waits after a failed request, as
// the agent's first backoff step.
const nodeRetry = 500 * time.Millisecond

// nodeCounters are what the simulated fleet did, counted as it happens.
type nodeCounters struct {
	polls        atomic.Int64 // long-polls answered with a desired state
	emptyPolls   atomic.Int64 // long-polls that ended with 204
	reports      atomic.Int64 // observed states accepted (204)
	pollErrors   atomic.Int64
	reportErrors atomic.Int64
	connected    atomic.Int64 // nodes whose first report was accepted
	// live counts servers from the moment a client asks for one until
	// their node's wipe report is accepted, so clients never ask for more
	// than the fleet holds.
	live  atomic.Int64
	wipes atomic.Int64
	// buckets counts the usage buckets of reports accepted.
	buckets atomic.Int64
	errMu   sync.Mutex
	errors  []string // first few error messages
}

func (c *nodeCounters) fail(err error) {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	if len(c.errors) < 10 {
		c.errors = append(c.errors, err.Error())
	}
}

func (c *nodeCounters) errorSamples() []string {
	c.errMu.Lock()
	defer c.errMu.Unlock()
	return append([]string(nil), c.errors...)
}

// simNode is one simulated node: it speaks the node protocol like the agent
// (one goroutine long-polls the desired state, another reports the
// observed state after every change and every report interval) and
// converges at once: whatever it receives it reports as applied, with a
// healthy runtime.
type simNode struct {
	index int
	// poller long-polls; client enrolls and reports. They use separate
	// connection pools (see fleetTransports), so a long-poll never waits
	// for a connection behind reports, as on a real node, where every
	// request can open its own.
	poller *nodeapi.Client
	client *nodeapi.Client
	ip     string
	id     string
	prop   *propagation
	count  *nodeCounters

	kick chan struct{} // wakes the reporter; buffered 1
	// every and refresh are the agent's ReportInterval and ReportRefresh.
	every, refresh time.Duration
	// usageMode says how the node's API keys are used (fleetusage.go).
	usageMode *atomic.Int32

	mu        sync.Mutex
	desired   nodeapi.Desired
	received  bool             // desired is set
	reported  bool             // a report was accepted
	wipedSent string           // the server whose wipe report was accepted
	accepted  nodeapi.Observed // the last report accepted
	refreshAt time.Time        // when to post it again if unchanged
	use       simUsage         // its keys' use (fleetusage.go)

	// Used by the poller only: what the node has seen so far.
	server   string
	rules    map[string]bool
	wipeSeen bool
}

func newSimNode(i int, baseURL string, polls, others *http.Client, prop *propagation, count *nodeCounters, every, refresh time.Duration,
	usageMode *atomic.Int32) *simNode {
	return &simNode{
		index: i, poller: nodeapi.NewClient(baseURL, polls), client: nodeapi.NewClient(baseURL, others), prop: prop, count: count,
		every: every, refresh: refresh, usageMode: usageMode,
		ip:   fmt.Sprintf("10.%d.%d.%d", 64+(i>>16)&63, (i>>8)&255, i&255),
		kick: make(chan struct{}, 1),
	}
}

// hardware varies RAM and storage over the fleet so that a capacity pick
// has something to choose; every node fits the benchmark's servers.
func (n *simNode) hardware() nodeapi.Hardware {
	return nodeapi.Hardware{Chip: fleetChip, RAM: []int{16, 32, 64, 128}[n.index%4], Storage: []int{256, 512, 1024}[n.index%3]}
}

// enroll exchanges the enrollment token for the node's credential.
func (n *simNode) enroll(ctx context.Context, token string) error {
	resp, err := n.client.Enroll(ctx, token, nodeapi.EnrollRequest{
		Hostname: fmt.Sprintf("fleet-%05d", n.index), Hardware: n.hardware()})
	if err != nil {
		return err
	}
	n.id = resp.NodeID
	n.client.SetCredential(resp.Credential)
	n.poller.SetCredential(resp.Credential)
	return nil
}

// run follows the control plane until ctx ends.
func (n *simNode) run(ctx context.Context, wait time.Duration) {
	var wg sync.WaitGroup
	wg.Go(func() { n.reporter(ctx) })
	n.poll(ctx, wait)
	wg.Wait()
}

func (n *simNode) poll(ctx context.Context, wait time.Duration) {
	var after uint64
	for ctx.Err() == nil {
		d, changed, err := n.poller.Desired(ctx, after, wait)
		at := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.count.pollErrors.Add(1)
			n.count.fail(err)
			sleepCtx(ctx, nodeRetry)
			continue
		}
		if !changed {
			n.count.emptyPolls.Add(1)
			continue
		}
		n.count.polls.Add(1)
		after = d.Revision
		n.see(d, at)
		n.mu.Lock()
		n.desired, n.received = d, true
		n.mu.Unlock()
		select {
		case n.kick <- struct{}{}:
		default:
		}
	}
}

// see tells the propagation tracker what is new in d.
func (n *simNode) see(d nodeapi.Desired, at time.Time) {
	srv := ""
	if d.Server != nil {
		srv = d.Server.ID
	}
	var seen []sighting
	if srv != n.server {
		n.server, n.rules, n.wipeSeen = srv, map[string]bool{}, false
		if srv != "" {
			seen = append(seen, sighting{kind: changeCreate})
		}
	}
	if srv == "" {
		return
	}
	if d.Wipe {
		// A wipe state has no rules; that is not a rule deletion.
		if !n.wipeSeen {
			n.wipeSeen = true
			seen = append(seen, sighting{kind: changeDelete})
		}
	} else {
		now := make(map[string]bool, len(d.FirewallRules))
		for _, r := range d.FirewallRules {
			now[r.ID] = true
			if !n.rules[r.ID] {
				seen = append(seen, sighting{kind: changeRuleAdd, rule: r.ID})
			}
		}
		for id := range n.rules {
			if !now[id] {
				seen = append(seen, sighting{kind: changeRuleDelete, rule: id})
			}
		}
		n.rules = now
	}
	n.prop.saw(srv, seen, at)
}

// observed is what the node reports: everything of its last desired state
// applied (the ordered model served), the runtime healthy, a wipe done as
// soon as it was asked for, and its keys' use.
func (n *simNode) observed() (o nodeapi.Observed, server string, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.received {
		return o, "", false
	}
	d := n.desired
	if d.Server != nil {
		server = d.Server.ID
	}
	return nodeapi.Observed{Revision: d.Revision, IP: n.ip, RuntimeHealthy: true,
		RuntimeRevision: d.Revision, RuntimeModel: d.Model, FirewallRevision: d.Revision, SSHKeysRevision: d.Revision,
		APIKeysRevision: d.Revision, Wiped: d.Wipe, Usage: n.use.totals(), UsageBuckets: n.use.waiting()}, server, true
}

// reporter reports after every received change and, as the agent does,
// every n.every if the state changed or a refresh is due (ticking from a
// random phase, as a fleet of agents started at different times would),
// and retries a failed report.
func (n *simNode) reporter(ctx context.Context) {
	reportEvery := n.every
	phase := time.NewTimer(rand.N(reportEvery) + time.Millisecond)
	defer phase.Stop()
	var tick <-chan time.Time
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		case <-retry:
		case <-phase.C:
			t := time.NewTicker(reportEvery)
			defer t.Stop()
			tick = t.C
		case <-tick:
			// A node whose keys are in use has new usage at every tick,
			// as the agent's report of a busy deployment does.
			if !n.useKeys() && n.unchanged() {
				continue
			}
		}
		retry = nil
		if err := n.report(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			n.count.reportErrors.Add(1)
			n.count.fail(err)
			retry = time.After(nodeRetry)
		}
	}
}

// unchanged reports whether the state to report is the one last accepted
// and not due for a refresh (the agent's rule, agent.NodeConfig.ReportRefresh).
func (n *simNode) unchanged() bool {
	o, _, ok := n.observed()
	n.mu.Lock()
	defer n.mu.Unlock()
	return ok && n.reported && reflect.DeepEqual(o, n.accepted) && time.Now().Before(n.refreshAt)
}

// report posts the observed state once and accounts for it.
func (n *simNode) report(ctx context.Context) error {
	o, server, ok := n.observed()
	if !ok {
		return nil
	}
	if err := n.client.ReportObserved(ctx, o); err != nil {
		return err
	}
	n.count.reports.Add(1)
	n.count.buckets.Add(int64(len(o.UsageBuckets)))
	n.mu.Lock()
	n.use.accepted(o.UsageBuckets)
	first := !n.reported
	n.reported, n.accepted = true, o
	n.refreshAt = time.Now().Add(agent.RefreshAfter(n.every, n.refresh))
	wiped := o.Wiped && server != "" && n.wipedSent != server
	if wiped {
		n.wipedSent = server
	}
	n.mu.Unlock()
	if first {
		n.count.connected.Add(1)
	}
	if wiped {
		// The control plane removed the server and returned the node to
		// the pool in this report's change.
		n.count.wipes.Add(1)
		n.count.live.Add(-1)
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
