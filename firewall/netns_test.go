package firewall

// Real-kernel tests: each test builds a fresh pair of network namespaces
// (server and client) joined by a veth pair, applies rules with NFT inside
// the server namespace, and checks real TCP, UDP and ICMP traffic.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"sigs.k8s.io/knftables"

	"github.com/hearthd/hearth/internal/netnstest"
	"github.com/hearthd/hearth/internal/testutil"
)

// skipEnv opts out of the real-kernel tests explicitly (e.g. on a
// developer machine without root). Without it, missing root is a failure.
const skipEnv = "HEARTH_SKIP_NETNS_TESTS"

// probeTimeout bounds each connection attempt. A blocked probe always waits
// this long, so it is short; an allowed probe over a local veth answers in
// well under a millisecond, so it is still generous.
const probeTimeout = 1500 * time.Millisecond

var (
	serverV4  = netip.MustParseAddr("10.200.0.1")
	serverV6  = netip.MustParseAddr("fd00:200::1")
	clientV4  = netip.MustParseAddr("10.200.0.2")
	clientV4b = netip.MustParseAddr("10.200.0.3")
	clientV6  = netip.MustParseAddr("fd00:200::2")
	clientV6b = netip.MustParseAddr("fd00:200::3")
)

// nsBackend is a knftables.Interface whose every nft invocation runs inside a
// network namespace; fail makes Run fail, to test failed applies.
type nsBackend struct {
	ns    string
	inner knftables.Interface
	fail  atomic.Bool
}

func newNSBackend(t *testing.T, ns string) *nsBackend {
	t.Helper()
	b := &nsBackend{ns: ns}
	err := netnstest.Run(ns, func() (err error) {
		b.inner, err = knftables.New(knftables.InetFamily, TableName)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *nsBackend) NewTransaction() *knftables.Transaction { return b.inner.NewTransaction() }

func (b *nsBackend) Run(ctx context.Context, tx *knftables.Transaction) error {
	if b.fail.Load() {
		return errors.New("injected nft failure")
	}
	return netnstest.Run(b.ns, func() error { return b.inner.Run(ctx, tx) })
}

func (b *nsBackend) Check(ctx context.Context, tx *knftables.Transaction) error {
	return netnstest.Run(b.ns, func() error { return b.inner.Check(ctx, tx) })
}

func (b *nsBackend) ListAll(ctx context.Context) (r map[string][]string, err error) {
	err = netnstest.Run(b.ns, func() error { r, err = b.inner.ListAll(ctx); return err })
	return r, err
}

func (b *nsBackend) List(ctx context.Context, objectType string) (r []string, err error) {
	err = netnstest.Run(b.ns, func() error { r, err = b.inner.List(ctx, objectType); return err })
	return r, err
}

func (b *nsBackend) ListRules(ctx context.Context, chain string) (r []*knftables.Rule, err error) {
	err = netnstest.Run(b.ns, func() error { r, err = b.inner.ListRules(ctx, chain); return err })
	return r, err
}

func (b *nsBackend) ListElements(ctx context.Context, objectType, name string) (r []*knftables.Element, err error) {
	err = netnstest.Run(b.ns, func() error { r, err = b.inner.ListElements(ctx, objectType, name); return err })
	return r, err
}

func (b *nsBackend) ListCounters(ctx context.Context) (r []*knftables.Counter, err error) {
	err = netnstest.Run(b.ns, func() error { r, err = b.inner.ListCounters(ctx); return err })
	return r, err
}

// testNet is a server and a client namespace joined by a veth pair.
type testNet struct{ netnstest.Pair }

func run(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func newTestNet(t *testing.T) *testNet {
	t.Helper()
	testutil.RequireRoot(t, skipEnv, "ip", "nft")
	return &testNet{netnstest.NewPair(t, "hfw",
		[]netip.Prefix{netip.PrefixFrom(serverV4, 24), netip.PrefixFrom(serverV6, 64)},
		[]netip.Prefix{netip.PrefixFrom(clientV4, 24), netip.PrefixFrom(clientV4b, 24), netip.PrefixFrom(clientV6, 64), netip.PrefixFrom(clientV6b, 64)})}
}

// listen starts TCP and UDP echo servers on the given ports (both address
// families) inside ns, closed when the test ends.
func listen(t *testing.T, ns string, tcpPorts, udpPorts []int) {
	t.Helper()
	var tcp, udp []netip.AddrPort
	for _, p := range tcpPorts {
		tcp = append(tcp, netip.AddrPortFrom(netip.IPv6Unspecified(), uint16(p)))
	}
	// UDP binds each address: a wildcard socket could answer from
	// another of the namespace's addresses, which the prober would
	// rightly not count as a reply.
	var addrs []net.Addr
	if err := netnstest.Run(ns, func() (err error) { addrs, err = net.InterfaceAddrs(); return err }); err != nil {
		t.Fatal(err)
	}
	for _, p := range udpPorts {
		for _, a := range addrs {
			ip, _ := netip.AddrFromSlice(a.(*net.IPNet).IP)
			ip = ip.Unmap()
			if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
				continue
			}
			udp = append(udp, netip.AddrPortFrom(ip, uint16(p)))
		}
	}
	netnstest.ListenEcho(t, ns, tcp, udp)
}

// probe is one connection attempt and whether it must succeed.
type probe struct {
	ns       string // namespace the probe starts from
	proto    string // tcp, udp or icmp
	src, dst netip.Addr
	port     int
	want     bool
}

func (p probe) String() string {
	return fmt.Sprintf("%s %s -> %s port %d", p.proto, p.src, p.dst, p.port)
}

func (p probe) run() error {
	return netnstest.Run(p.ns, func() error {
		switch p.proto {
		case "tcp", "udp":
			return netnstest.Echo(p.proto, p.src, netip.AddrPortFrom(p.dst, uint16(p.port)), probeTimeout)
		case "icmp":
			return ping(p.src, p.dst)
		}
		return fmt.Errorf("unknown protocol %q", p.proto)
	})
}

func ping(src, dst netip.Addr) error {
	network, proto := "ip4:icmp", 1
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, proto = "ip6:ipv6-icmp", 58
		typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	c, err := icmp.ListenPacket(network, src.String())
	if err != nil {
		return err
	}
	defer c.Close()
	id := rand.IntN(0xffff)
	b, err := (&icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("hearth")}}).Marshal(nil)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(probeTimeout))
	buf := make([]byte, 1500)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return err
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && m.Type == reply && e.ID == id {
			return nil
		}
	}
}

// check runs the probes concurrently and reports every mismatch.
func check(t *testing.T, probes ...probe) {
	t.Helper()
	errs := make([]error, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.run()
		}()
	}
	wg.Wait()
	for i, p := range probes {
		switch {
		case p.want && errs[i] != nil:
			t.Errorf("%v: blocked, want allowed: %v", p, errs[i])
		case !p.want && errs[i] == nil:
			t.Errorf("%v: allowed, want blocked", p)
		}
	}
}

func (n *testNet) newNFT(t *testing.T, cp ...netip.AddrPort) (*NFT, *nsBackend) {
	t.Helper()
	b := newNSBackend(t, n.Server)
	fw, err := New(Config{Backend: b, ControlPlane: cp, DriftInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return fw, b
}

// in and out build probes into and out of the server namespace.
func (n *testNet) in(proto string, src, dst netip.Addr, port int, want bool) probe {
	return probe{n.Client, proto, src, dst, port, want}
}

func (n *testNet) out(proto string, dst netip.Addr, port int, want bool) probe {
	src := serverV4
	if dst.Is6() {
		src = serverV6
	}
	return probe{n.Server, proto, src, dst, port, want}
}

func TestKernelInboundRules(t *testing.T) {
	n := newTestNet(t)
	listen(t, n.Server, []int{22, 80, 8000, 8500, 9000, 9001}, []int{53, 5000})
	fw, _ := n.newNFT(t)
	ctx := context.Background()

	everything := func(want bool) []probe {
		return []probe{
			n.in("tcp", clientV4, serverV4, 80, want), n.in("tcp", clientV6, serverV6, 80, want),
			n.in("udp", clientV4, serverV4, 53, want), n.in("udp", clientV6, serverV6, 53, want),
			n.in("icmp", clientV4, serverV4, 0, want), n.in("icmp", clientV6, serverV6, 0, want),
		}
	}
	t.Log("before any apply: the probes get through")
	check(t, everything(true)...)
	if t.Failed() {
		t.FailNow()
	}

	t.Log("empty rule set: default accept")
	if err := fw.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	check(t, everything(true)...)

	t.Log("allow rules: everything else inbound is dropped")
	err := fw.Apply(ctx, []Rule{
		{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"},
		{Direction: "inbound", Protocol: "tcp", PortRange: "8000-9000", Source: "10.200.0.2", Action: "allow"},
		{Direction: "inbound", Protocol: "tcp", PortRange: "8000-9000", Source: "fd00:200::3/128", Action: "allow"},
		{Direction: "inbound", Protocol: "udp", PortRange: "5000", Source: "fd00:200::/64", Action: "allow"},
		{Direction: "inbound", Protocol: "icmp", Source: "10.200.0.0/24", Action: "allow"},
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t,
		n.in("tcp", clientV4, serverV4, 22, true), n.in("tcp", clientV6, serverV6, 22, true),
		n.in("tcp", clientV4, serverV4, 80, false), n.in("tcp", clientV6, serverV6, 80, false),
		n.in("tcp", clientV4, serverV4, 8000, true), n.in("tcp", clientV4, serverV4, 8500, true), n.in("tcp", clientV4, serverV4, 9000, true),
		n.in("tcp", clientV4, serverV4, 9001, false), n.in("tcp", clientV4b, serverV4, 8500, false),
		n.in("tcp", clientV6b, serverV6, 8500, true), n.in("tcp", clientV6, serverV6, 8500, false),
		n.in("udp", clientV6, serverV6, 5000, true), n.in("udp", clientV4, serverV4, 5000, false),
		n.in("udp", clientV6, serverV6, 53, false),
		n.in("icmp", clientV4, serverV4, 0, true), n.in("icmp", clientV6, serverV6, 0, false),
	)

	t.Log("deny before allow")
	err = fw.Apply(ctx, []Rule{
		{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"},
		{Direction: "inbound", Protocol: "tcp", PortRange: "1-1000", Source: "10.200.0.3", Action: "deny"},
		{Direction: "inbound", Protocol: "tcp", Source: "fd00:200::3", Action: "deny"},
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t,
		n.in("tcp", clientV4, serverV4, 22, true), n.in("tcp", clientV4b, serverV4, 22, false),
		n.in("tcp", clientV6, serverV6, 22, true), n.in("tcp", clientV6b, serverV6, 22, false),
		n.in("tcp", clientV4, serverV4, 80, false),
	)

	t.Log("deny only: everything not denied is accepted")
	err = fw.Apply(ctx, []Rule{
		{Direction: "inbound", Protocol: "udp", PortRange: "5000", Action: "deny"},
		{Direction: "inbound", Protocol: "icmp", Source: "fd00:200::/64", Action: "deny"},
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t,
		n.in("udp", clientV4, serverV4, 5000, false), n.in("udp", clientV6, serverV6, 5000, false),
		n.in("udp", clientV4, serverV4, 53, true), n.in("tcp", clientV4, serverV4, 80, true), n.in("tcp", clientV6, serverV6, 80, true),
		n.in("icmp", clientV4, serverV4, 0, true), n.in("icmp", clientV6, serverV6, 0, false),
	)
}

func TestKernelOutboundRules(t *testing.T) {
	n := newTestNet(t)
	listen(t, n.Server, []int{22}, nil)
	listen(t, n.Client, []int{80, 443, 7000}, []int{53})
	cp := netip.AddrPortFrom(clientV4, 7000)
	fw, _ := n.newNFT(t, cp)
	ctx := context.Background()

	err := fw.Apply(ctx, []Rule{
		{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"},
		{Direction: "outbound", Protocol: "tcp", PortRange: "443", Destination: "10.200.0.2", Action: "allow"},
		{Direction: "outbound", Protocol: "udp", PortRange: "53", Destination: "fd00:200::2", Action: "allow"},
		// Would cut the node off from the control plane, were it not always accepted.
		{Direction: "outbound", Protocol: "tcp", Destination: "10.200.0.0/24", PortRange: "7000", Action: "deny"},
	})
	if err != nil {
		t.Fatal(err)
	}
	check(t,
		n.out("tcp", clientV4, 443, true), n.out("tcp", clientV6, 443, false),
		n.out("tcp", clientV4, 80, false),
		n.out("udp", clientV6, 53, true), n.out("udp", clientV4, 53, false),
		n.out("icmp", clientV4, 0, false),
		n.out("tcp", clientV4, 7000, true), // control plane
		n.out("tcp", clientV6, 7000, false),
		// Inbound ssh still answers although outbound allows no port 22:
		// replies are established traffic.
		n.in("tcp", clientV4, serverV4, 22, true),
	)
}

func nftList(t *testing.T, ns string, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	return string(out), err
}

func TestKernelForeignTablesUntouched(t *testing.T) {
	n := newTestNet(t)
	listen(t, n.Server, []int{22, 80}, nil)
	fw, _ := n.newNFT(t)
	ctx := context.Background()

	// A foreign table that accepts port 80 early on the input hook, and one
	// in another family.
	run(t, `
table inet foreign {
	set allowed { type ipv4_addr; flags interval; elements = { 10.200.0.0/24 } }
	chain in {
		type filter hook input priority -10; policy accept;
		ip saddr @allowed tcp dport 80 accept
	}
}
table ip legacy {
	chain out { type filter hook output priority 10; policy accept; }
}
`, "ip", "netns", "exec", n.Server, "nft", "-f", "-")
	before, err := nftList(t, n.Server, "list", "ruleset")
	if err != nil {
		t.Fatal(before, err)
	}
	rules := []Rule{{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"}}
	for range 2 {
		if err := fw.Apply(ctx, rules); err != nil {
			t.Fatal(err)
		}
	}
	// Their accept does not override our drop.
	check(t, n.in("tcp", clientV4, serverV4, 22, true), n.in("tcp", clientV4, serverV4, 80, false))

	for _, tbl := range [][]string{{"inet", "foreign"}, {"ip", "legacy"}} {
		want := section(t, before, tbl)
		got, err := nftList(t, n.Server, "list", "table", tbl[0], tbl[1])
		if err != nil {
			t.Fatalf("table %v gone after apply: %v %s", tbl, err, got)
		}
		if strings.TrimSpace(got) != want {
			t.Fatalf("table %v changed by apply:\n%s\nwant:\n%s", tbl, got, want)
		}
	}
	if err := fw.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := nftList(t, n.Server, "list", "ruleset")
	if err != nil || strings.TrimSpace(after) != strings.TrimSpace(before) {
		t.Fatalf("ruleset after Remove:\n%s\nwant the foreign tables only:\n%s", after, before)
	}
}

// section extracts "table <family> <name> { … }" from an nft ruleset listing.
func section(t *testing.T, ruleset string, tbl []string) string {
	t.Helper()
	head := "table " + tbl[0] + " " + tbl[1] + " {"
	i := strings.Index(ruleset, head)
	if i < 0 {
		t.Fatalf("no %q in:\n%s", head, ruleset)
	}
	j := strings.Index(ruleset[i:], "\n}")
	return ruleset[i : i+j+2]
}

func waitRepairs(t *testing.T, fw *NFT, want uint64) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("drift repair %d", want), func() bool {
		return fw.Stats().DriftRepairs >= want
	})
}

func TestKernelDriftRepair(t *testing.T) {
	n := newTestNet(t)
	listen(t, n.Server, []int{22, 80}, nil)
	fw, _ := n.newNFT(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := fw.Apply(ctx, []Rule{{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"}}); err != nil {
		t.Fatal(err)
	}
	want, err := nftList(t, n.Server, "list", "table", "inet", TableName)
	if err != nil {
		t.Fatal(want, err)
	}
	// A table that was not touched is not "repaired".
	for range 3 {
		if repaired, err := fw.Repair(ctx); err != nil || repaired {
			t.Fatalf("Repair of untouched table = %v, %v", repaired, err)
		}
	}

	done := make(chan error, 1)
	go func() { done <- fw.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run = %v", err)
		}
	}()

	tamper := []struct {
		name string
		nft  []string
	}{
		{"deleted", []string{"delete", "table", "inet", TableName}},
		{"flushed", []string{"flush", "table", "inet", TableName}},
		{"rule inserted", []string{"insert", "rule", "inet", TableName, "input", "tcp", "dport", "80", "accept"}},
		{"default drop deleted", []string{"-f", "-"}},
	}
	for i, tc := range tamper {
		t.Logf("table %s", tc.name)
		stdin := ""
		if tc.nft[0] == "-f" {
			// Delete the final drop rule: the chain then falls through to
			// its accept policy.
			rules, err := fw.nft.ListRules(ctx, "input")
			if err != nil {
				t.Fatal(err)
			}
			stdin = fmt.Sprintf("delete rule inet %s input handle %d\n", TableName, *rules[len(rules)-1].Handle)
		}
		run(t, stdin, append([]string{"ip", "netns", "exec", n.Server, "nft"}, tc.nft...)...)
		waitRepairs(t, fw, uint64(i+1))
		got, err := nftList(t, n.Server, "list", "table", "inet", TableName)
		if err != nil || got != want {
			t.Fatalf("after repair:\n%s\nwant:\n%s", got, want)
		}
		check(t, n.in("tcp", clientV4, serverV4, 22, true), n.in("tcp", clientV4, serverV4, 80, false))
	}
	if st := fw.Stats(); st.DriftRepairs != uint64(len(tamper)) || st.DriftFailures != 0 || st.Applies != 1 {
		t.Fatalf("stats = %+v", st)
	}
}

func TestKernelFailedApplyKeepsOldRules(t *testing.T) {
	n := newTestNet(t)
	listen(t, n.Server, []int{22, 80}, nil)
	fw, b := n.newNFT(t)
	ctx := context.Background()
	if err := fw.Apply(ctx, []Rule{{Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"}}); err != nil {
		t.Fatal(err)
	}
	want, err := nftList(t, n.Server, "list", "table", "inet", TableName)
	if err != nil {
		t.Fatal(want, err)
	}
	open80 := []Rule{{Direction: "inbound", Protocol: "tcp", PortRange: "80", Action: "allow"}}

	b.fail.Store(true)
	if err := fw.Apply(ctx, open80); err == nil {
		t.Fatal("Apply succeeded with a failing backend")
	}
	b.fail.Store(false)
	if err := fw.Apply(ctx, append(open80, Rule{Direction: "inbound", Protocol: "tcp", PortRange: "80 } accept; flush ruleset; {", Action: "allow"})); err == nil {
		t.Fatal("Apply accepted an injection attempt")
	}
	got, err := nftList(t, n.Server, "list", "table", "inet", TableName)
	if err != nil || got != want {
		t.Fatalf("table after failed applies:\n%s\nwant:\n%s", got, want)
	}
	check(t, n.in("tcp", clientV4, serverV4, 22, true), n.in("tcp", clientV4, serverV4, 80, false))
	if st := fw.Stats(); st.Applies != 1 || st.ApplyFailures != 2 {
		t.Fatalf("stats = %+v", st)
	}
	// The rules that failed are not what drift repair restores.
	if repaired, err := fw.Repair(ctx); err != nil || repaired {
		t.Fatalf("Repair = %v, %v", repaired, err)
	}
	if r := fw.Rules(); len(r) != 1 || r[0].PortRange != "22" {
		t.Fatalf("Rules() = %+v, want the old set", r)
	}
}
