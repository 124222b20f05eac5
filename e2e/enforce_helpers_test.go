package e2e

// Helpers for the host-enforcement tests: a throwaway user and sshd, network
// namespaces, hearthd inside a namespace, and the server's enforcement view.

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// Opt-outs for machines without root; without them, missing root or a
// missing tool fails the test rather than skipping it.
const (
	skipRootEnv  = "HEARTH_SKIP_ROOT_TESTS"
	skipNetnsEnv = "HEARTH_SKIP_NETNS_TESTS"
)

func requireRoot(t *testing.T, skipEnv string, tools ...string) {
	t.Helper()
	if os.Getenv(skipEnv) == "1" {
		t.Skipf("%s=1: test explicitly disabled", skipEnv)
	}
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root; run as root or set %s=1 to opt out", skipEnv)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("this test needs %s (apt-get install iproute2 nftables openssh-server openssh-client passwd): %v", tool, err)
		}
	}
}

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
	eventually(c.t, within, "firewall and SSH keys applied on the node", func() bool {
		v = c.server(id)
		e := v.Enforcement
		return e.Firewall.Status == "applied" && e.SSHKeys.Status == "applied" &&
			e.Firewall.AppliedRevision != nil && *e.Firewall.AppliedRevision == e.DesiredRevision &&
			e.SSHKeys.AppliedRevision != nil && *e.SSHKeys.AppliedRevision == e.DesiredRevision
	})
	return v
}

// addUser creates a throwaway system account with the given home and
// removes it when the test ends.
func addUser(t *testing.T, home string) *user.User {
	t.Helper()
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	name := "hearthe2e" + hex.EncodeToString(rnd[:])
	// -p '*': no usable password but not locked ("!"): sshd refuses every
	// login to a locked account.
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--no-user-group",
		"--gid", "nogroup", "--home-dir", home, "--shell", "/bin/sh", "--password", "*", name).CombinedOutput()
	if err != nil {
		t.Fatalf("useradd: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// sshServer is a private sshd on a loopback port.
type sshServer struct {
	addr    string
	hostKey ssh.PublicKey
	user    *user.User
}

// startSSHD runs sshd with its own config: only u may log in, only with a
// key from akPath, with StrictModes on as in production.
func startSSHD(t *testing.T, dir string, u *user.User, akPath string) *sshServer {
	t.Helper()
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // privilege separation directory
		t.Fatal(err)
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	b, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	hostPub, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	conf := filepath.Join(dir, "sshd_config")
	text := fmt.Sprintf(`ListenAddress 127.0.0.1:%d
HostKey %s
PidFile %s
AuthorizedKeysFile %s
StrictModes yes
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers %s
MaxAuthTries 3
LogLevel VERBOSE
`, port, hostKey, filepath.Join(dir, "sshd.pid"), akPath, u.Username)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &sshServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), hostKey: hostPub, user: u}
	startProc(t, "sshd", procSpec{argv: []string{"/usr/sbin/sshd", "-D", "-e", "-f", conf},
		ready: []probe{{what: "listener on " + s.addr, within: 15 * time.Second, check: func(*proc) error {
			c, err := net.DialTimeout("tcp", s.addr, time.Second)
			if err == nil {
				c.Close()
			}
			return err
		}}}})
	return s
}

// login logs in with key and runs `id -u`, which must be the user's uid.
func (s *sshServer) login(key ssh.Signer) error {
	client, err := ssh.Dial("tcp", s.addr, &ssh.ClientConfig{
		User:            s.user.Username,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(s.hostKey),
		Timeout:         10 * time.Second,
	})
	if err != nil {
		return err
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	defer sess.Close()
	out, err := sess.Output("id -u")
	if err != nil {
		return fmt.Errorf("id -u: %w", err)
	}
	if got := strings.TrimSpace(string(out)); got != s.user.Uid {
		return fmt.Errorf("logged in as uid %s, want %s", got, s.user.Uid)
	}
	return nil
}

// expectLogin fails the test unless logging in with key succeeds (ok) or is
// refused for want of an authorised key (!ok).
func (s *sshServer) expectLogin(t *testing.T, step, name string, key ssh.Signer, ok bool) {
	t.Helper()
	err := s.login(key)
	switch {
	case ok && err != nil:
		t.Fatalf("%s: %s key cannot log in: %v", step, name, err)
	case !ok && err == nil:
		t.Fatalf("%s: %s key logged in but must not", step, name)
	case !ok && !strings.Contains(err.Error(), "unable to authenticate"):
		t.Fatalf("%s: %s key failed for the wrong reason: %v", step, name, err)
	}
}

// inNS runs f on an OS thread that has joined the named network namespace;
// sockets f creates live in that namespace for good. f must not start child
// processes (startProc does, from threads of its own). The thread returns
// to its own namespace and is unlocked afterwards rather than discarded: a
// child started with Pdeathsig is signalled when the thread that started
// it exits, and code outside these helpers may start one from any thread.
func inNS(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(orig)
		fd, err := unix.Open("/run/netns/"+ns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open netns %s: %w", ns, err)
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = f()
		// Only a thread back in its own namespace may run other
		// goroutines; if that fails it stays locked and the runtime
		// discards it.
		if unix.Setns(orig, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// netnsExec is the command prefix that runs a program inside ns. ip execs
// the program in place, so the process started is the program itself.
func netnsExec(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// netPair is a server and a client namespace joined by a veth pair. The
// client side has two addresses: the client's own, and the one the control
// plane is reached at.
type netPair struct {
	server, client string
}

var (
	nsServerIP  = netip.MustParseAddr("10.231.0.1")
	nsClientIP  = netip.MustParseAddr("10.231.0.2")
	nsControlIP = netip.MustParseAddr("10.231.0.3")
)

func newNetPair(t *testing.T) *netPair {
	t.Helper()
	var rnd [4]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	id := hex.EncodeToString(rnd[:])
	n := &netPair{server: "hee-s-" + id, client: "hee-c-" + id}
	for _, ns := range []string{n.server, n.client} {
		runCmd(t, "ip", "netns", "add", ns)
		t.Cleanup(func() { deleteNS(t, ns) })
		runCmd(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	runCmd(t, "ip", "-n", n.server, "link", "add", "veth0", "type", "veth", "peer", "name", "veth0", "netns", n.client)
	for ns, addrs := range map[string][]netip.Addr{n.server: {nsServerIP}, n.client: {nsClientIP, nsControlIP}} {
		for _, a := range addrs {
			runCmd(t, "ip", "-n", ns, "addr", "add", a.String()+"/24", "dev", "veth0")
		}
		runCmd(t, "ip", "-n", ns, "link", "set", "veth0", "up")
	}
	return n
}

// deleteNS kills whatever still runs in the namespace (children of the
// processes this test started there) and deletes it. The test process
// itself is never killed, should one of its threads still be listed.
func deleteNS(t *testing.T, ns string) {
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
		t.Errorf("delete netns %s: %v\n%s", ns, err, out)
	}
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
	if err := inNS(ns, func() (err error) {
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
	var closers []io.Closer
	err := inNS(ns, func() error {
		for _, p := range tcpPorts {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(addr, uint16(p)).String())
			if err != nil {
				return err
			}
			closers = append(closers, ln)
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						_ = c.SetDeadline(time.Now().Add(5 * time.Second))
						buf := make([]byte, 1)
						if _, err := io.ReadFull(c, buf); err == nil {
							_, _ = c.Write(buf)
						}
					}()
				}
			}()
		}
		for _, p := range udpPorts {
			pc, err := net.ListenPacket("udp", netip.AddrPortFrom(addr, uint16(p)).String())
			if err != nil {
				return err
			}
			closers = append(closers, pc)
			go func() {
				buf := make([]byte, 64)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo(buf[:n], from)
				}
			}()
		}
		return nil
	})
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}

// netProbeTimeout bounds one connection attempt: a blocked probe waits this
// long; an allowed one over a local veth answers in well under a
// millisecond.
const netProbeTimeout = 1500 * time.Millisecond

// reach sends one byte over proto from src (inside ns) to dst and waits for
// its echo.
func reach(ns, proto string, src netip.Addr, dst netip.AddrPort) error {
	return inNS(ns, func() error {
		d := net.Dialer{Timeout: netProbeTimeout}
		if proto == "tcp" {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		} else {
			d.LocalAddr = &net.UDPAddr{IP: src.AsSlice()}
		}
		c, err := d.Dial(proto, dst.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(netProbeTimeout))
		if _, err := c.Write([]byte{'h'}); err != nil {
			return err
		}
		buf := make([]byte, 1)
		if _, err := io.ReadFull(c, buf); err != nil {
			return err
		}
		if buf[0] != 'h' {
			return fmt.Errorf("echo returned %q", buf)
		}
		return nil
	})
}
