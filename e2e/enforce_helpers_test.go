package e2e

// Helpers for the host-enforcement tests: network namespaces (built with
// netnstest), hearthd inside a namespace, and the server's enforcement view.
// The throwaway user and sshd come from sshdtest.

import (
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/netnstest"
	"github.com/hearthd/hearth/internal/testutil"
)

// Opt-outs for machines without root; without them, missing root or a
// missing tool fails the test rather than skipping it.
const (
	skipRootEnv  = "HEARTH_SKIP_ROOT_TESTS"
	skipNetnsEnv = "HEARTH_SKIP_NETNS_TESTS"
)

// serverView is the part of a management API server record these tests read.
type serverView struct {
	ID          string  `json:"id"`
	Status      string  `json:"status"`
	IP          *string `json:"ip"`
	Enforcement struct {
		DesiredRevision uint64           `json:"desired_revision"`
		Firewall        enforcementState `json:"firewall"`
		SSHKeys         enforcementState `json:"ssh_keys"`
	} `json:"enforcement"`
}

type enforcementState struct {
	Status          string  `json:"status"`
	AppliedRevision *uint64 `json:"applied_revision"`
	Error           *string `json:"error"`
}

func (c *controlPlane) server(id string) serverView {
	c.t.Helper()
	var v serverView
	if code := c.api("GET", "/v1/servers/"+id, nil, &v); code != 200 {
		c.t.Fatalf("GET server %s: %d", id, code)
	}
	return v
}

// waitApplied waits until the node reports the server's current desired
// revision applied for both the firewall and the SSH keys, and returns it.
func (c *controlPlane) waitApplied(id string, within time.Duration) serverView {
	c.t.Helper()
	var v serverView
	testutil.WaitFor(c.t, within, "firewall and SSH keys applied on the node", func() bool {
		v = c.server(id)
		e := v.Enforcement
		return e.Firewall.Status == "applied" && e.SSHKeys.Status == "applied" &&
			e.Firewall.AppliedRevision != nil && *e.Firewall.AppliedRevision == e.DesiredRevision &&
			e.SSHKeys.AppliedRevision != nil && *e.SSHKeys.AppliedRevision == e.DesiredRevision
	})
	return v
}

// netnsExec is the command prefix that runs a program inside ns. ip execs
// the program in place, so the process started is the program itself.
func netnsExec(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// Addresses of the namespaces newNetPair makes. The client side has two:
// the client's own, and the one the control plane is reached at.
var (
	nsServerIP  = netip.MustParseAddr("10.231.0.1")
	nsClientIP  = netip.MustParseAddr("10.231.0.2")
	nsControlIP = netip.MustParseAddr("10.231.0.3")
)

// newNetPair makes a server and a client namespace joined by a veth pair.
func newNetPair(t *testing.T) netnstest.Pair {
	t.Helper()
	return netnstest.NewPair(t, "hee", []netip.Prefix{netip.PrefixFrom(nsServerIP, 24)},
		[]netip.Prefix{netip.PrefixFrom(nsClientIP, 24), netip.PrefixFrom(nsControlIP, 24)})
}

// nsProxy forwards connections made inside a namespace to a listener in
// the test's own namespace.
type nsProxy struct {
	addr  string
	mu    sync.Mutex
	conns map[net.Conn]bool
}

// dropAll closes every open connection, as a control plane restart would,
// so clients must make new ones.
func (p *nsProxy) dropAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.conns)
	for c := range p.conns {
		c.Close()
	}
	return n / 2
}

// proxyFromNS listens on addr inside ns and forwards every connection to
// target in the test's own namespace: the control plane listens on the
// host's loopback only, and this makes it reachable from the namespaces at
// an address of their own network.
func proxyFromNS(t *testing.T, ns string, addr netip.Addr, target string) *nsProxy {
	t.Helper()
	var ln net.Listener
	if err := netnstest.Run(ns, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	p := &nsProxy{addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	track := func(c net.Conn, add bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if add {
			p.conns[c] = true
		} else {
			delete(p.conns, c)
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				in.Close()
				continue
			}
			track(in, true)
			track(out, true)
			wg.Add(2)
			pipe := func(dst, src net.Conn) {
				defer wg.Done()
				_, _ = io.Copy(dst, src)
				// Half-close is not needed by HTTP; closing both ends
				// promptly ends the other direction's copy too.
				dst.Close()
				src.Close()
				track(dst, false)
				track(src, false)
			}
			go pipe(out, in)
			go pipe(in, out)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		p.dropAll()
		wg.Wait()
	})
	return p
}

// listenNS starts, inside ns on addr, TCP servers that echo one byte and UDP
// servers that echo every datagram; they close when the test ends.
func listenNS(t *testing.T, ns string, addr netip.Addr, tcpPorts, udpPorts []int) {
	t.Helper()
	at := func(ports []int) []netip.AddrPort {
		var a []netip.AddrPort
		for _, p := range ports {
			a = append(a, netip.AddrPortFrom(addr, uint16(p)))
		}
		return a
	}
	netnstest.ListenEcho(t, ns, at(tcpPorts), at(udpPorts))
}

// netProbeTimeout bounds one connection attempt: a blocked probe waits this
// long; an allowed one over a local veth answers in well under a
// millisecond.
const netProbeTimeout = 1500 * time.Millisecond

// reach sends one byte over proto from src (inside ns) to dst and waits for
// its echo.
func reach(ns, proto string, src netip.Addr, dst netip.AddrPort) error {
	return netnstest.Run(ns, func() error {
		return netnstest.Echo(proto, src, dst, netProbeTimeout)
	})
}
