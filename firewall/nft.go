package firewall

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"sigs.k8s.io/knftables"
)

// TableName is the nftables table (family inet) hearth owns.
const TableName = "hearth"

// DefaultDriftInterval is how often Run checks the table when
// Config.DriftInterval is zero.
const DefaultDriftInterval = 10 * time.Second

// Config configures NFT.
type Config struct {
	// ControlPlane lists the control-plane endpoints (address and TCP port).
	// New outbound connections to them are always accepted, so no rule set
	// can cut the node off from the control plane.
	ControlPlane []netip.AddrPort
	// DriftInterval is how often Run checks and repairs the table
	// (default DefaultDriftInterval).
	DriftInterval time.Duration
	// Logger receives drift and failure reports (default: discard).
	Logger *slog.Logger
	// Backend talks to nftables. It must be bound to family inet and table
	// TableName. Nil means knftables.New, which runs the nft binary; tests
	// pass a knftables.Fake or a backend bound to a network namespace.
	Backend knftables.Interface
}

// Stats counts what NFT has done. The metrics package reads it.
type Stats struct {
	Applies        uint64    // successful Apply calls
	ApplyFailures  uint64    // Apply calls rejected by validation or by nft
	DriftRepairs   uint64    // times the table was found changed and re-applied
	DriftFailures  uint64    // drift checks or repairs that failed
	Rules          int       // rules in force (last successful Apply)
	LastApply      time.Time // last successful write of the table (Apply or repair); zero if never
	LastSuccess    time.Time // last time the table was known to hold the desired rules
	LastDriftCheck time.Time // last completed drift check
}

// NFT enforces rules with nftables. It is safe for concurrent use.
type NFT struct {
	nft          knftables.Interface
	controlPlane []netip.AddrPort
	interval     time.Duration
	log          *slog.Logger
	now          func() time.Time

	mu       sync.Mutex
	applied  bool
	rules    []Rule           // last applied, canonical
	expected []nftRule        // what the table must hold
	handles  map[string][]int // rule handles per chain right after the last write
	stats    Stats
}

var _ Firewall = (*NFT)(nil)

// New returns an NFT. It does not touch the firewall until Apply.
func New(cfg Config) (*NFT, error) {
	for _, ap := range cfg.ControlPlane {
		if !ap.IsValid() || ap.Port() == 0 || ap.Addr().Zone() != "" {
			return nil, fmt.Errorf("firewall: invalid control-plane endpoint %q", ap.String())
		}
	}
	if cfg.DriftInterval < 0 {
		return nil, fmt.Errorf("firewall: negative drift interval %v", cfg.DriftInterval)
	}
	n := &NFT{
		nft:          cfg.Backend,
		controlPlane: slices.Clone(cfg.ControlPlane),
		interval:     cfg.DriftInterval,
		log:          cfg.Logger,
		now:          time.Now,
	}
	if n.interval == 0 {
		n.interval = DefaultDriftInterval
	}
	if n.log == nil {
		n.log = slog.New(slog.DiscardHandler)
	}
	if n.nft == nil {
		nft, err := knftables.New(knftables.InetFamily, TableName)
		if err != nil {
			return nil, fmt.Errorf("firewall: nftables unavailable: %w", err)
		}
		n.nft = nft
	}
	return n, nil
}

// Apply validates rules and replaces the table's contents with them in one
// transaction. On any error the previous rules stay in force.
func (n *NFT) Apply(ctx context.Context, rules []Rule) error {
	canon, err := CanonicalizeAll(rules)
	n.mu.Lock()
	defer n.mu.Unlock()
	if err != nil {
		n.stats.ApplyFailures++
		return fmt.Errorf("firewall: %w", err)
	}
	if err := n.write(ctx, canon); err != nil {
		n.stats.ApplyFailures++
		return err
	}
	n.stats.Applies++
	return nil
}

// write replaces the table's contents and records what it now holds.
// n.mu must be held.
func (n *NFT) write(ctx context.Context, canon []Rule) error {
	tx := n.nft.NewTransaction()
	expected := buildTransaction(tx, canon, n.controlPlane)
	if err := n.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("firewall: apply nftables transaction: %w", err)
	}
	now := n.now()
	n.applied = true
	n.rules = canon
	n.expected = expected
	n.handles = nil
	n.stats.Rules = len(canon)
	n.stats.LastApply = now
	n.stats.LastSuccess = now

	// Remember the rule handles: any later edit of a rule gives it a new
	// handle, which is how Repair tells our rules from look-alikes.
	drift, handles, err := n.inspect(ctx)
	switch {
	case err != nil:
		n.log.Warn("firewall: reading back applied table failed", "err", err)
	case drift != "":
		n.log.Warn("firewall: table changed right after apply", "drift", drift)
	default:
		n.handles = handles
	}
	return nil
}

// Repair checks that the table holds exactly what was last applied and
// re-applies it if not. It reports whether it re-applied. Before the first
// successful Apply (or after Remove) it does nothing.
func (n *NFT) Repair(ctx context.Context) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.applied {
		return false, nil
	}
	drift, handles, err := n.inspect(ctx)
	if err != nil {
		n.stats.DriftFailures++
		return false, fmt.Errorf("firewall: check table: %w", err)
	}
	n.stats.LastDriftCheck = n.now()
	if drift == "" {
		if n.handles == nil {
			n.handles = handles
		}
		n.stats.LastSuccess = n.stats.LastDriftCheck
		return false, nil
	}
	n.log.Warn("firewall: table drifted, re-applying", "drift", drift, "rules", len(n.rules))
	if err := n.write(ctx, n.rules); err != nil {
		n.stats.DriftFailures++
		return false, fmt.Errorf("firewall: repair drift (%s): %w", drift, err)
	}
	n.stats.DriftRepairs++
	return true, nil
}

// Run repairs drift every DriftInterval until ctx is done.
func (n *NFT) Run(ctx context.Context) error {
	t := time.NewTicker(n.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if _, err := n.Repair(ctx); err != nil && ctx.Err() == nil {
				n.log.Error("firewall: drift repair failed", "err", err)
			}
		}
	}
}

// Remove deletes the hearth table (if present) and stops drift repair until
// the next Apply. Other tables are untouched.
func (n *NFT) Remove(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	tx := n.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := n.nft.Run(ctx, tx); err != nil {
		return fmt.Errorf("firewall: remove table: %w", err)
	}
	n.applied = false
	n.rules, n.expected, n.handles = nil, nil, nil
	n.stats.Rules = 0
	return nil
}

// Rules returns the rules in force (canonical), as of the last successful Apply.
func (n *NFT) Rules() []Rule {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.rules)
}

// Stats returns a snapshot of the counters.
func (n *NFT) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// inspect compares the table with n.expected. It returns a non-empty drift
// description if they differ, and the rule handles per chain. n.mu must be held.
func (n *NFT) inspect(ctx context.Context) (drift string, handles map[string][]int, err error) {
	objs, err := n.nft.ListAll(ctx)
	if knftables.IsNotFound(err) {
		return "table missing", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("list table: %w", err)
	}
	chains := slices.Clone(objs["chain"])
	slices.Sort(chains)
	if !slices.Equal(chains, []string{chainInput, chainOutput}) {
		return fmt.Sprintf("chains are %v", chains), nil, nil
	}
	for _, kind := range []string{"set", "map", "counter", "flowtable"} {
		if len(objs[kind]) > 0 {
			return fmt.Sprintf("unexpected %s %v", kind, objs[kind]), nil, nil
		}
	}

	rules, err := n.nft.ListRules(ctx, "")
	if knftables.IsNotFound(err) {
		return "table missing", nil, nil
	}
	if err != nil {
		return "", nil, fmt.Errorf("list rules: %w", err)
	}
	comments := map[string][]string{}
	handles = map[string][]int{}
	for _, r := range rules {
		c := ""
		if r.Comment != nil {
			c = *r.Comment
		}
		comments[r.Chain] = append(comments[r.Chain], c)
		h := -1
		if r.Handle != nil {
			h = *r.Handle
		}
		handles[r.Chain] = append(handles[r.Chain], h)
	}
	want := map[string][]string{}
	for _, r := range n.expected {
		want[r.chain] = append(want[r.chain], r.comment)
	}
	for _, ch := range []string{chainInput, chainOutput} {
		if !slices.Equal(comments[ch], want[ch]) {
			return fmt.Sprintf("rules of chain %s changed", ch), nil, nil
		}
		if n.handles != nil && !slices.Equal(handles[ch], n.handles[ch]) {
			return fmt.Sprintf("rules of chain %s replaced", ch), nil, nil
		}
	}
	return "", handles, nil
}
