package agent_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
)

// countingFirewall is a firewall.Fake that counts every Apply, failed ones
// included, and can hold an Apply of a given rule set until released.
type countingFirewall struct {
	firewall.Fake
	mu    sync.Mutex
	calls int
	hold  func([]firewall.Rule) bool // Apply waits on release when it returns true
	held  chan struct{}              // signalled when an Apply is held
	free  chan struct{}              // closed to release held Applies
}

func (f *countingFirewall) Apply(ctx context.Context, rules []firewall.Rule) error {
	f.mu.Lock()
	f.calls++
	hold := f.hold != nil && f.hold(rules)
	f.mu.Unlock()
	if hold {
		f.held <- struct{}{}
		<-f.free
	}
	return f.Fake.Apply(ctx, rules)
}

func (f *countingFirewall) Calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func rule(port string) firewall.Rule {
	return firewall.Rule{Direction: "inbound", Protocol: "tcp", PortRange: port, Action: "allow"}
}

func ports(rules []firewall.Rule) []string {
	out := make([]string, 0, len(rules))
	for _, r := range rules {
		out = append(out, r.PortRange)
	}
	return out
}

func TestEnforcerAppliesEveryConcern(t *testing.T) {
	fw, keys := &countingFirewall{}, sshkeys.NewFake()
	e := agent.NewEnforcer(agent.Concerns{Firewall: fw, SSHKeys: keys}, nil)
	if e.Enforced() {
		t.Fatal("enforced before anything was applied")
	}
	key := sshkeys.Key{ID: "alice", PublicKey: pubKeyLine(t, "alice")}
	o := e.Apply(t.Context(), agent.Desired{Revision: 0, FirewallRules: []firewall.Rule{rule("22")}, SSHKeys: []sshkeys.Key{key}})
	want := agent.Observed{Revision: 0, Firewall: agent.Concern{Revision: 0}, SSHKeys: agent.Concern{Revision: 0}}
	if o != want || e.Observed() != want || !e.Enforced() || !o.InForce(0) || o.Failed() {
		t.Fatalf("after applying revision 0: %+v, enforced %v", o, e.Enforced())
	}
	// Revision 0 is a revision like any other: applied, not skipped.
	if r, ok := fw.Rules(); !ok || len(r) != 1 || r[0].PortRange != "22" {
		t.Fatalf("rules %v (applied %v)", r, ok)
	}
	if k, ok := keys.Keys(); !ok || len(k) != 1 || k[0].ID != "alice" {
		t.Fatalf("keys %v (synced %v)", k, ok)
	}

	// A newer revision replaces both sets; empty sets remove everything.
	o = e.Apply(t.Context(), agent.Desired{Revision: 4})
	if o.Firewall.Revision != 4 || o.SSHKeys.Revision != 4 || !e.Enforced() {
		t.Fatalf("after revision 4: %+v", o)
	}
	if r, _ := fw.Rules(); len(r) != 0 {
		t.Fatalf("rules after an empty desired state: %v", r)
	}
	if k, _ := keys.Keys(); len(k) != 0 {
		t.Fatalf("keys after an empty desired state: %v", k)
	}
	// Applying what is in force again touches nothing.
	calls, syncs := fw.Calls(), first(keys.Syncs())
	e.Apply(t.Context(), agent.Desired{Revision: 4})
	if _, retried := e.Retry(t.Context()); retried || fw.Calls() != calls || first(keys.Syncs()) != syncs {
		t.Fatalf("re-applied a revision in force (retried %v, %d applies, %d syncs)", retried, fw.Calls()-calls, first(keys.Syncs())-syncs)
	}
}

func first(a, _ int) int { return a }

// Each concern keeps its own revision and error: a failing firewall does not
// hold back the keys, and a retry touches only what failed.
func TestEnforcerTracksEachConcernsError(t *testing.T) {
	fw, keys := &countingFirewall{}, sshkeys.NewFake()
	e := agent.NewEnforcer(agent.Concerns{Firewall: fw, SSHKeys: keys}, nil)
	e.Apply(t.Context(), agent.Desired{Revision: 1, FirewallRules: []firewall.Rule{rule("22")}})

	fw.FailWith(errors.New("nft: permission denied"))
	key := sshkeys.Key{ID: "bob", PublicKey: pubKeyLine(t, "bob")}
	o := e.Apply(t.Context(), agent.Desired{Revision: 2, FirewallRules: []firewall.Rule{rule("443")}, SSHKeys: []sshkeys.Key{key}})
	want := agent.Observed{Revision: 2,
		Firewall: agent.Concern{Revision: 1, Error: "nft: permission denied"},
		SSHKeys:  agent.Concern{Revision: 2},
		// Not managed here: in force at every revision.
		APIKeys: agent.Concern{Revision: 2}, Runtime: agent.RuntimeState{Concern: agent.Concern{Revision: 2}}}
	if o != want || e.Enforced() || !o.Failed() || o.InForce(2) {
		t.Fatalf("observed %+v, want %+v (enforced %v)", o, want, e.Enforced())
	}
	if r, _ := fw.Rules(); len(r) != 1 || r[0].PortRange != "22" {
		t.Fatalf("a failed apply changed the rules in force: %v", r)
	}

	// Retries apply the firewall only, until it works.
	calls, syncs := fw.Calls(), first(keys.Syncs())
	for range 3 {
		if _, retried := e.Retry(t.Context()); !retried {
			t.Fatal("a failed concern was not retried")
		}
	}
	if fw.Calls() != calls+3 || first(keys.Syncs()) != syncs {
		t.Fatalf("3 retries: %d firewall applies, %d key syncs", fw.Calls()-calls, first(keys.Syncs())-syncs)
	}
	fw.FailWith(nil)
	o, retried := e.Retry(t.Context())
	if !retried || o.Firewall != (agent.Concern{Revision: 2}) || !e.Enforced() || o.Failed() {
		t.Fatalf("after the firewall recovered: %+v (retried %v)", o, retried)
	}
	if r, _ := fw.Rules(); len(r) != 1 || r[0].PortRange != "443" {
		t.Fatalf("rules %v", r)
	}
	if _, retried := e.Retry(t.Context()); retried {
		t.Fatal("retried with everything in force")
	}
}

// A retry never re-applies a desired state that a newer one replaced, even
// when it was asked for while the newer one was being applied. (The node
// agent used to copy the failed state before re-applying it, and could
// put an old revision back over a new one, then wait a whole long-poll.)
func TestEnforcerRetryNeverAppliesAStaleState(t *testing.T) {
	fw := &countingFirewall{held: make(chan struct{}), free: make(chan struct{})}
	e := agent.NewEnforcer(agent.Concerns{Firewall: fw, SSHKeys: sshkeys.NewFake()}, nil)
	fw.FailWith(errors.New("nft: busy"))
	e.Apply(t.Context(), agent.Desired{Revision: 1, FirewallRules: []firewall.Rule{rule("22")}})
	fw.FailWith(nil)

	// Revision 2 is being applied (held inside the firewall) when a retry
	// of the failed revision 1 is asked for.
	fw.hold = func(r []firewall.Rule) bool { return len(r) == 1 && r[0].PortRange == "443" }
	applied := make(chan agent.Observed)
	go func() {
		applied <- e.Apply(context.Background(), agent.Desired{Revision: 2, FirewallRules: []firewall.Rule{rule("443")}})
	}()
	<-fw.held
	retried := make(chan bool)
	go func() {
		_, ok := e.Retry(context.Background())
		retried <- ok
	}()
	close(fw.free)
	if o := <-applied; o.Revision != 2 || !o.InForce(2) {
		t.Fatalf("revision 2: %+v", o)
	}
	if <-retried {
		t.Fatal("the retry re-applied something although revision 2 is in force")
	}
	if got := ports(firstRules(fw)); len(got) != 1 || got[0] != "443" {
		t.Fatalf("rules in force %v, want revision 2's [443]", got)
	}
	if o := e.Observed(); o.Revision != 2 || !e.Enforced() {
		t.Fatalf("observed %+v", o)
	}
}

func firstRules(fw *countingFirewall) []firewall.Rule {
	r, _ := fw.Rules()
	return r
}

// Applying a desired state that fails validation is an error of its
// concern, like any other failure.
func TestEnforcerReportsInvalidDesiredState(t *testing.T) {
	e := agent.NewEnforcer(agent.Concerns{Firewall: &firewall.Fake{}, SSHKeys: sshkeys.NewFake()}, nil)
	o := e.Apply(t.Context(), agent.Desired{Revision: 3, SSHKeys: []sshkeys.Key{{ID: "x", PublicKey: "ssh-ed25519 notbase64"}}})
	if o.SSHKeys.Error == "" || o.SSHKeys.Revision != 0 || o.Firewall != (agent.Concern{Revision: 3}) || e.Enforced() {
		t.Fatalf("observed %+v", o)
	}
}

// The API keys are a concern like the others; a wipe removes them all
// (local keys too, through Wipe) and is done without waiting for the
// runtime, which holds no tenant data.
func TestEnforcerAPIKeysAndWipe(t *testing.T) {
	keys := newFakeAPIKeys()
	models := newFakeModels("default")
	rt := agent.NewRuntime(models, agent.RuntimeConfig{Default: "default"}, nil)
	e := agent.NewEnforcer(agent.Concerns{Firewall: &firewall.Fake{}, SSHKeys: sshkeys.NewFake(), APIKeys: keys, Runtime: rt}, nil)
	o := e.Apply(t.Context(), agent.Desired{Revision: 1, APIKeys: []nodeapi.APIKey{{ID: "dk_a", Hash: "00"}}})
	if o.APIKeys != (agent.Concern{Revision: 1}) || !slices.Equal(keys.IDs(), []string{"dk_a"}) {
		t.Fatalf("observed %+v, keys %v", o.APIKeys, keys.IDs())
	}
	// Nothing served yet (the runtime does not run here): not in force.
	if o.InForce(1) || e.Enforced() || !o.TenantInForce(1) {
		t.Fatalf("in force %v, enforced %v, tenant data applied %v", o.InForce(1), e.Enforced(), o.TenantInForce(1))
	}

	keys.failed = errors.New("pebble: disk full")
	o = e.Apply(t.Context(), agent.Desired{Revision: 2})
	if o.APIKeys != (agent.Concern{Revision: 1, Error: "pebble: disk full"}) || !o.Failed() {
		t.Fatalf("failed keys: %+v", o.APIKeys)
	}
	keys.failed = nil
	o = e.Apply(t.Context(), agent.Desired{Revision: 3, Wipe: true, Model: "ordered"})
	if !o.TenantInForce(3) || keys.Wipes() != 1 || len(keys.IDs()) != 0 || o.Runtime.Revision != 0 {
		t.Fatalf("wipe: %+v, %d wipes", o, keys.Wipes())
	}
}
