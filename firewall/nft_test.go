package firewall

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"sigs.k8s.io/knftables"
)

// failingBackend wraps a backend and fails Run while fail is set.
type failingBackend struct {
	knftables.Interface
	fail atomic.Bool
}

func (b *failingBackend) Run(ctx context.Context, tx *knftables.Transaction) error {
	if b.fail.Load() {
		return errors.New("injected nft failure")
	}
	return b.Interface.Run(ctx, tx)
}

func newFakeNFT(t *testing.T, cp ...string) (*NFT, *knftables.Fake, *failingBackend) {
	t.Helper()
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	fb := &failingBackend{Interface: fake}
	var aps []netip.AddrPort
	for _, s := range cp {
		aps = append(aps, netip.MustParseAddrPort(s))
	}
	n, err := New(Config{Backend: fb, ControlPlane: aps, DriftInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return n, fake, fb
}

func mustRun(t *testing.T, fake *knftables.Fake, cmds ...func(tx *knftables.Transaction)) {
	t.Helper()
	tx := fake.NewTransaction()
	for _, c := range cmds {
		c(tx)
	}
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
}

var sampleRules = []Rule{
	{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "8000-9000", Source: "10.1.2.3/8", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "80", Source: "10.0.0.0/8", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "81-90", Source: "10.0.0.0/8", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "443", Source: "192.168.1.0/24", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "443", Source: "192.168.0.0/24", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "22", Source: "10.1.0.0/16", Action: "allow"},
	{Direction: "inbound", Protocol: "udp", Source: "2001:db8::/32", Action: "allow"},
	{Direction: "inbound", Protocol: "icmp", Source: "2001:db8::1", Action: "allow"},
	{Direction: "inbound", Protocol: "tcp", PortRange: "22", Source: "10.9.9.9", Action: "deny"},
	{Direction: "outbound", Protocol: "udp", PortRange: "53", Destination: "9.9.9.9", Action: "allow"},
	{Direction: "outbound", Protocol: "icmp", Action: "allow"},
}

const sampleDump = `add table inet hearth { comment "rules managed by hearthd" ; }
add chain inet hearth input { type filter hook input priority 0 ; policy accept ; }
add chain inet hearth output { type filter hook output priority 0 ; policy accept ; }
add rule inet hearth input meta iif lo accept comment "hearth: loopback"
add rule inet hearth input ct state established,related accept comment "hearth: established/related"
add rule inet hearth input icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert } accept comment "hearth: ipv6 neighbour discovery"
add rule inet hearth input ip saddr { 10.9.9.9/32 } tcp dport { 22 } drop comment "hearth: deny"
add rule inet hearth input tcp dport { 22 } accept comment "hearth: allow"
add rule inet hearth input ip saddr { 192.168.0.0/23 } tcp dport { 443 } accept comment "hearth: allow"
add rule inet hearth input ip saddr { 10.0.0.0/8 } tcp dport { 80-90, 8000-9000 } accept comment "hearth: allow"
add rule inet hearth input ip6 saddr { 2001:db8::/32 } meta l4proto udp accept comment "hearth: allow"
add rule inet hearth input ip6 saddr { 2001:db8::1/128 } meta l4proto ipv6-icmp accept comment "hearth: allow"
add rule inet hearth input drop comment "hearth: default drop"
add rule inet hearth output meta oif lo accept comment "hearth: loopback"
add rule inet hearth output ct state established,related accept comment "hearth: established/related"
add rule inet hearth output icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert } accept comment "hearth: ipv6 neighbour discovery"
add rule inet hearth output ip daddr 203.0.113.5 tcp dport 443 accept comment "hearth: control plane"
add rule inet hearth output ip6 daddr 2001:db8::5 tcp dport 8443 accept comment "hearth: control plane"
add rule inet hearth output ip daddr { 9.9.9.9/32 } udp dport { 53 } accept comment "hearth: allow"
add rule inet hearth output meta l4proto { icmp, ipv6-icmp } accept comment "hearth: allow"
add rule inet hearth output drop comment "hearth: default drop"
`

func TestApplyGolden(t *testing.T) {
	n, fake, _ := newFakeNFT(t, "203.0.113.5:443", "[2001:db8::5]:8443")
	if err := n.Apply(context.Background(), sampleRules); err != nil {
		t.Fatal(err)
	}
	if got := fake.Dump(); got != sampleDump {
		t.Fatalf("table contents:\n%s\nwant:\n%s", got, sampleDump)
	}
	// The transaction replaces the table atomically: it starts by
	// recreating the table, so nothing from before survives.
	tx := fake.LastTransaction.String()
	if !strings.HasPrefix(tx, "add table inet hearth\ndelete table inet hearth\nadd table inet hearth {") {
		t.Fatalf("transaction does not replace the table:\n%s", tx)
	}
	if strings.Contains(tx, "flush ruleset") {
		t.Fatal("transaction flushes the ruleset")
	}
	// Applying again yields the same table, not an accumulation.
	if err := n.Apply(context.Background(), sampleRules); err != nil {
		t.Fatal(err)
	}
	if got := fake.Dump(); got != sampleDump {
		t.Fatalf("second apply changed the table:\n%s", got)
	}
	st := n.Stats()
	if st.Applies != 2 || st.ApplyFailures != 0 || st.Rules != len(sampleRules) || st.LastApply.IsZero() {
		t.Fatalf("stats = %+v", st)
	}
}

func TestApplyDefaults(t *testing.T) {
	tests := []struct {
		name  string
		rules []Rule
		in    string // last rule of input chain
		out   string // last rule of output chain
	}{
		{"empty accepts everything", nil, "accept", "accept"},
		{"deny only keeps default accept", []Rule{{Direction: "inbound", Protocol: "udp", Action: "deny"}}, "accept", "accept"},
		{"inbound allow drops the rest inbound only", []Rule{{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"}}, "drop", "accept"},
		{"outbound allow drops the rest outbound only", []Rule{{Direction: "outbound", Protocol: "tcp", Action: "allow"}}, "accept", "drop"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, fake, _ := newFakeNFT(t)
			if err := n.Apply(context.Background(), tt.rules); err != nil {
				t.Fatal(err)
			}
			for chain, want := range map[string]string{"input": tt.in, "output": tt.out} {
				rules := fake.Table.Chains[chain].Rules
				if last := rules[len(rules)-1].Rule; last != want {
					t.Errorf("chain %s ends with %q, want %q", chain, last, want)
				}
			}
		})
	}
}

func TestRenderMergesSets(t *testing.T) {
	rules, err := CanonicalizeAll([]Rule{
		{Direction: "inbound", Protocol: "tcp", PortRange: "1-100", Source: "10.0.0.0/9", Action: "allow"},
		{Direction: "inbound", Protocol: "tcp", PortRange: "101-65535", Source: "10.128.0.0/9", Action: "allow"},
		{Direction: "inbound", Protocol: "tcp", PortRange: "50-200", Source: "10.128.0.0/9", Action: "allow"},
		{Direction: "inbound", Protocol: "tcp", PortRange: "1-200", Source: "10.0.0.0/9", Action: "allow"},
		{Direction: "inbound", Protocol: "udp", Source: "::/0", Action: "allow"},
		{Direction: "inbound", Protocol: "udp", Source: "0.0.0.0/0", Action: "allow"},
		{Direction: "inbound", Protocol: "udp", PortRange: "53", Source: "10.0.0.1", Action: "allow"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range render(rules, nil) {
		if r.comment == commentAllow {
			got = append(got, r.rule)
		}
	}
	want := []string{
		// 10.128/9 covers 50-65535 → not all ports; 10.0/9 covers 1-200.
		"ip saddr { 10.0.0.0/9 } tcp dport { 1-200 } accept",
		"ip saddr { 10.128.0.0/9 } tcp dport { 50-65535 } accept",
		// any-address udp on both families collapses to one rule; the /32 one is subsumed.
		"meta l4proto udp accept",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rendered:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestApplyInvalidKeepsOldRules(t *testing.T) {
	n, fake, _ := newFakeNFT(t)
	ctx := context.Background()
	if err := n.Apply(ctx, sampleRules); err != nil {
		t.Fatal(err)
	}
	before := fake.Dump()
	bad := append([]Rule{sampleRules[0]}, Rule{Direction: "inbound", Protocol: "tcp", PortRange: "22; flush ruleset", Action: "allow"})
	err := n.Apply(ctx, bad)
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "port_range" {
		t.Fatalf("Apply(bad) = %v, want port_range FieldError", err)
	}
	if fake.Dump() != before {
		t.Fatal("invalid apply changed the table")
	}
	if got := n.Rules(); len(got) != len(sampleRules) {
		t.Fatalf("Rules() = %d rules, want the old %d", len(got), len(sampleRules))
	}
	if st := n.Stats(); st.ApplyFailures != 1 || st.Applies != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestApplyBackendFailureKeepsOldRules(t *testing.T) {
	n, fake, fb := newFakeNFT(t)
	ctx := context.Background()
	if err := n.Apply(ctx, sampleRules); err != nil {
		t.Fatal(err)
	}
	before := fake.Dump()
	fb.fail.Store(true)
	if err := n.Apply(ctx, sampleRules[:1]); err == nil || !strings.Contains(err.Error(), "injected") {
		t.Fatalf("Apply = %v, want injected failure", err)
	}
	fb.fail.Store(false)
	if fake.Dump() != before {
		t.Fatal("failed apply changed the table")
	}
	// Drift repair keeps enforcing the last good set, not the failed one.
	mustRun(t, fake, func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
	if repaired, err := n.Repair(ctx); err != nil || !repaired {
		t.Fatalf("Repair = %v, %v", repaired, err)
	}
	if fake.Dump() != before {
		t.Fatalf("repair restored something else:\n%s", fake.Dump())
	}
	if st := n.Stats(); st.ApplyFailures != 1 || st.DriftRepairs != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestRepairDetectsDrift(t *testing.T) {
	tests := []struct {
		name   string
		tamper func(tx *knftables.Transaction, fake *knftables.Fake)
	}{
		{"table deleted", func(tx *knftables.Transaction, _ *knftables.Fake) { tx.Delete(&knftables.Table{}) }},
		{"table flushed", func(tx *knftables.Transaction, _ *knftables.Fake) { tx.Flush(&knftables.Table{}) }},
		{"chain flushed", func(tx *knftables.Transaction, _ *knftables.Fake) { tx.Flush(&knftables.Chain{Name: "input"}) }},
		{"rule added", func(tx *knftables.Transaction, _ *knftables.Fake) {
			tx.Insert(&knftables.Rule{Chain: "input", Rule: "tcp dport 80 accept"})
		}},
		{"rule deleted", func(tx *knftables.Transaction, fake *knftables.Fake) {
			tx.Delete(&knftables.Rule{Chain: "output", Handle: fake.Table.Chains["output"].Rules[3].Handle})
		}},
		{"rule replaced by look-alike", func(tx *knftables.Transaction, fake *knftables.Fake) {
			last := fake.Table.Chains["input"].Rules[len(fake.Table.Chains["input"].Rules)-1]
			tx.Delete(&knftables.Rule{Chain: "input", Handle: last.Handle})
			tx.Add(&knftables.Rule{Chain: "input", Rule: "accept", Comment: last.Comment})
		}},
		{"chain added", func(tx *knftables.Transaction, _ *knftables.Fake) {
			tx.Add(&knftables.Chain{Name: "sneaky"})
		}},
		{"set added", func(tx *knftables.Transaction, _ *knftables.Fake) {
			tx.Add(&knftables.Set{Name: "s", Type: "ipv4_addr"})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, fake, _ := newFakeNFT(t, "203.0.113.5:443")
			ctx := context.Background()
			if err := n.Apply(ctx, sampleRules); err != nil {
				t.Fatal(err)
			}
			want := fake.Dump()
			if repaired, err := n.Repair(ctx); err != nil || repaired {
				t.Fatalf("Repair on untouched table = %v, %v; want false, nil", repaired, err)
			}
			fake.RLock()
			tx := fake.NewTransaction()
			tt.tamper(tx, fake)
			fake.RUnlock()
			if err := fake.Run(ctx, tx); err != nil {
				t.Fatal(err)
			}
			if fake.Dump() == want {
				t.Fatal("tampering did not change the table")
			}
			repaired, err := n.Repair(ctx)
			if err != nil || !repaired {
				t.Fatalf("Repair = %v, %v; want true, nil", repaired, err)
			}
			if got := fake.Dump(); got != want {
				t.Fatalf("after repair:\n%s\nwant:\n%s", got, want)
			}
			if repaired, err := n.Repair(ctx); err != nil || repaired {
				t.Fatalf("second Repair = %v, %v; want false, nil", repaired, err)
			}
			if st := n.Stats(); st.DriftRepairs != 1 || st.Applies != 1 {
				t.Fatalf("stats = %+v", st)
			}
		})
	}
}

func TestRepairBeforeApplyDoesNothing(t *testing.T) {
	n, fake, _ := newFakeNFT(t)
	if repaired, err := n.Repair(context.Background()); err != nil || repaired {
		t.Fatalf("Repair = %v, %v", repaired, err)
	}
	if fake.Table != nil {
		t.Fatal("Repair created the table before any Apply")
	}
}

func TestRepairFailureCounted(t *testing.T) {
	n, fake, fb := newFakeNFT(t)
	ctx := context.Background()
	if err := n.Apply(ctx, sampleRules); err != nil {
		t.Fatal(err)
	}
	mustRun(t, fake, func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
	fb.fail.Store(true)
	if _, err := n.Repair(ctx); err == nil {
		t.Fatal("Repair succeeded with a failing backend")
	}
	if st := n.Stats(); st.DriftFailures != 1 || st.DriftRepairs != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestRunRepairsInBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n, fake, _ := newFakeNFT(t) // drift checked every 5 ms
		ctx, cancel := context.WithCancel(context.Background())
		if err := n.Apply(ctx, sampleRules); err != nil {
			t.Fatal(err)
		}
		want := fake.Dump()
		done := make(chan error, 1)
		go func() { done <- n.Run(ctx) }()
		mustRun(t, fake, func(tx *knftables.Transaction) { tx.Delete(&knftables.Table{}) })
		synctest.Wait()
		if r := n.Stats().DriftRepairs; r != 0 {
			t.Fatalf("%d repairs before the first check", r)
		}
		time.Sleep(5 * time.Millisecond)
		synctest.Wait()
		if r := n.Stats().DriftRepairs; r != 1 {
			t.Fatalf("%d repairs after the first check, want 1", r)
		}
		if got := fake.Dump(); got != want {
			t.Fatalf("after repair:\n%s", got)
		}
		// Nothing drifts any more: later checks repair nothing.
		time.Sleep(50 * time.Millisecond)
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
		if r := n.Stats().DriftRepairs; r != 1 {
			t.Fatalf("%d repairs with nothing drifted, want 1", r)
		}
	})
}

func TestRemove(t *testing.T) {
	n, fake, _ := newFakeNFT(t)
	ctx := context.Background()
	if err := n.Apply(ctx, sampleRules); err != nil {
		t.Fatal(err)
	}
	if err := n.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if fake.Table != nil {
		t.Fatal("table still present after Remove")
	}
	if repaired, err := n.Repair(ctx); err != nil || repaired || fake.Table != nil {
		t.Fatalf("Repair after Remove = %v, %v; table recreated: %v", repaired, err, fake.Table != nil)
	}
	// Removing an absent table is fine.
	if err := n.Remove(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	fake := knftables.NewFake(knftables.InetFamily, TableName)
	for _, cfg := range []Config{
		{Backend: fake, ControlPlane: []netip.AddrPort{{}}},
		{Backend: fake, ControlPlane: []netip.AddrPort{netip.MustParseAddrPort("1.2.3.4:0")}},
		{Backend: fake, ControlPlane: []netip.AddrPort{netip.MustParseAddrPort("[fe80::1%eth0]:443")}},
		{Backend: fake, DriftInterval: -time.Second},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) succeeded", cfg)
		}
	}
}

func TestFake(t *testing.T) {
	var f Fake
	ctx := context.Background()
	if err := f.Apply(ctx, []Rule{{Direction: "inbound", Protocol: "tcp", PortRange: "22-22", Source: "10.0.0.1", Action: "allow"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Apply(ctx, []Rule{{Direction: "bogus"}}); err == nil {
		t.Fatal("Fake accepted an invalid rule")
	}
	boom := errors.New("boom")
	f.FailWith(boom)
	if err := f.Apply(ctx, nil); !errors.Is(err, boom) {
		t.Fatalf("Apply = %v, want boom", err)
	}
	f.FailWith(nil)
	if err := f.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	applied := f.Applied()
	if len(applied) != 2 || len(applied[0]) != 1 || len(applied[1]) != 0 {
		t.Fatalf("Applied = %+v", applied)
	}
	if r := applied[0][0]; r.PortRange != "22" || r.Source != "10.0.0.1/32" {
		t.Fatalf("Fake recorded non-canonical rule %+v", r)
	}
	if last, ok := f.Rules(); !ok || len(last) != 0 {
		t.Fatalf("Rules = %v, %v", last, ok)
	}
}

func TestNoop(t *testing.T) {
	var n Noop
	ctx := context.Background()
	if err := n.Apply(ctx, sampleRules); err != nil {
		t.Fatal(err)
	}
	if err := n.Apply(ctx, []Rule{{Direction: "inbound", Protocol: "icmp", PortRange: "1", Action: "allow"}}); err == nil {
		t.Fatal("Noop accepted an invalid rule")
	}
	if got := n.Rules(); len(got) != len(sampleRules) || got[1].Source != "10.0.0.0/8" {
		t.Fatalf("Rules = %+v", got)
	}
	if st := n.Stats(); st.Applies != 1 || st.ApplyFailures != 1 || st.Rules != len(sampleRules) {
		t.Fatalf("stats = %+v", st)
	}
}
