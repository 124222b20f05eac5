package e2e

// hearthd enforcing the management API's desired state on the real host:
// authorized_keys read by a real sshd, and nftables rules on the real kernel
// inside network namespaces.

import (
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/sshdtest"
	"github.com/hearthd/hearth/internal/testutil"
)

// TestSSHKeysThroughTheAPI: a key added through the management API logs in
// to a real sshd as the node's SSH user; deleting it through the API locks
// it out within 5 s; a failed sync shows on the server and heals; a line a
// human added to authorized_keys keeps working throughout.
func TestSSHKeysThroughTheAPI(t *testing.T) {
	testutil.RequireRoot(t, skipRootEnv, "/usr/sbin/sshd", "ssh-keygen", "useradd", "userdel")

	// sshd runs with StrictModes, as in production.
	home := sshdtest.NewHome(t)
	u := home.User
	humanKey, humanLine := sshdtest.NewSigner(t)
	handWritten := "# my own key, added by hand\n" + humanLine + " me@home\n"
	akPath := home.WriteFile(t, ".ssh/authorized_keys", []byte(handWritten))
	sshDir := filepath.Dir(akPath)
	sshd := sshdtest.Start(t, home.Base, u, akPath)

	ctl := startControl(t)
	enroll := strings.TrimSpace(ctl.cli("enrollment-tokens", "create", "--uses", "1", "--ttl", "10m"))
	inst := shared.ollama.Get(t)
	startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL,
		"--control-url", ctl.url, "--enrollment-token", enroll,
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40", "--ssh-user", u.Username}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })

	sshd.ExpectLogin(t, "before any key", "hand-added", humanKey, true)

	addKey := func(name, line string) string {
		t.Helper()
		var k struct{ ID string }
		if code := ctl.api("POST", "/v1/ssh-keys", map[string]any{"name": name, "public_key": line + " " + name}, &k); code != http.StatusCreated {
			t.Fatalf("create key %s: %d", name, code)
		}
		return k.ID
	}
	laptop, laptopLine := sshdtest.NewSigner(t)
	desk, deskLine := sshdtest.NewSigner(t)
	stranger, _ := sshdtest.NewSigner(t)
	laptopID, deskID := addKey("laptop", laptopLine), addKey("desk", deskLine)

	var srv serverView
	if code := ctl.api("POST", "/v1/servers", map[string]any{"name": "e2e-ssh", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "bare", "billing": "monthly", "ssh_key_ids": []string{laptopID, deskID}}, &srv); code != http.StatusCreated {
		t.Fatalf("create server: %d", code)
	}
	testutil.WaitFor(t, 60*time.Second, "server running", func() bool { return ctl.server(srv.ID).Status == "running" })
	ctl.waitApplied(srv.ID, 10*time.Second)
	sshd.ExpectLogin(t, "server running", "laptop", laptop, true)
	sshd.ExpectLogin(t, "server running", "desk", desk, true)
	sshd.ExpectLogin(t, "server running", "hand-added", humanKey, true)
	sshd.ExpectLogin(t, "server running", "unregistered", stranger, false)

	// Deleting the key through the API locks it out within 5 s.
	if code := ctl.api("DELETE", "/v1/ssh-keys/"+laptopID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete key: %d", code)
	}
	deleted := time.Now()
	testutil.WaitFor(t, 5*time.Second, "the deleted key to be refused", func() bool { return sshd.Login(laptop) != nil })
	t.Logf("deleted key refused %v after DELETE", time.Since(deleted).Round(time.Millisecond))
	sshd.ExpectLogin(t, "after delete", "laptop", laptop, false)
	sshd.ExpectLogin(t, "after delete", "desk", desk, true)
	sshd.ExpectLogin(t, "after delete", "hand-added", humanKey, true)
	ctl.waitApplied(srv.ID, 10*time.Second)

	// A sync that fails is reported on the server, and heals: ~/.ssh made
	// a symlink is refused (never followed), and the next change to the
	// server makes the node sync again.
	real := filepath.Join(home.Dir, ".ssh-real")
	if err := os.Rename(sshDir, real); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, sshDir); err != nil {
		t.Fatal(err)
	}
	if code := ctl.api("POST", "/v1/servers/"+srv.ID+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "tcp", "port_range": "22", "action": "allow"}, nil); code != http.StatusCreated {
		t.Fatalf("create rule: %d", code)
	}
	var failed serverView
	testutil.WaitFor(t, 10*time.Second, "the failed key sync shown on the server", func() bool {
		failed = ctl.server(srv.ID)
		return failed.Enforcement.SSHKeys.Status == "failed"
	})
	if e := failed.Enforcement; e.SSHKeys.Error == nil || !strings.Contains(*e.SSHKeys.Error, "symlink") ||
		e.Firewall.Status != "applied" || failed.Status != "running" {
		t.Fatalf("after a failed sync: %+v (ssh error %v)", failed, e.SSHKeys.Error)
	}
	if err := os.Remove(sshDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(real, sshDir); err != nil {
		t.Fatal(err)
	}
	// The node retries a failed apply with backoff, on its own.
	ctl.waitApplied(srv.ID, 15*time.Second)
	sshd.ExpectLogin(t, "after the retry", "desk", desk, true)
	sshd.ExpectLogin(t, "after the retry", "laptop", laptop, false)
	sshd.ExpectLogin(t, "after the retry", "hand-added", humanKey, true)

	// The hand-written part is still there byte for byte, first.
	got, err := os.ReadFile(akPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(got), handWritten) || strings.Contains(string(got), laptopLine) || !strings.Contains(string(got), deskLine) {
		t.Fatalf("authorized_keys:\n%s", got)
	}

	// Deleting the server wipes the managed keys and only those.
	if code := ctl.api("DELETE", "/v1/servers/"+srv.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete server: %d", code)
	}
	testutil.WaitFor(t, 30*time.Second, "server gone", func() bool {
		return ctl.api("GET", "/v1/servers/"+srv.ID, nil, nil) == http.StatusNotFound
	})
	sshd.ExpectLogin(t, "after the wipe", "desk", desk, false)
	sshd.ExpectLogin(t, "after the wipe", "hand-added", humanKey, true)
	if got, err := os.ReadFile(akPath); err != nil || string(got) != handWritten {
		t.Fatalf("after the wipe authorized_keys is not the hand-written file (%v):\n%s", err, got)
	}
}

// TestFirewallThroughTheAPI runs hearthd --firewall in a server network
// namespace, enrolled with a control plane reached over a veth, with its
// own Ollama on the namespace's loopback. Rules created and deleted through
// the management API decide what a client namespace reaches; with
// everything else denied in both directions the node stays connected to the
// control plane.
func TestFirewallThroughTheAPI(t *testing.T) {
	testutil.RequireRoot(t, skipNetnsEnv, "ip", "nft")
	testStart := time.Now()
	ollamaBin, err := ollamatest.FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	pair := newNetPair(t)
	// The node reaches the control plane at a network address, so the link
	// is HTTPS (plain HTTP is only for loopback); the node pins the
	// certificate, which names 127.0.0.1, not the address it dials.
	ctl := startControlTLS(t)
	proxy := proxyFromNS(t, pair.Client, nsControlIP, strings.TrimPrefix(ctl.url, "https://"))
	enroll := strings.TrimSpace(ctl.cli("enrollment-tokens", "create", "--uses", "1", "--ttl", "10m"))

	gguf, tmpl := tinyModelFiles(t)
	// The namespace has its own loopback: any port is free there. The
	// test reaches the node only through the control plane and the
	// traffic it lets through, as a customer would.
	startHearthd(t, hearthdOpts{prefix: netnsExec(pair.Server), stateDir: t.TempDir(), args: []string{
		"--model", "e2e-tiny", "--model-gguf", gguf, "--model-template", tmpl,
		"--model-param", "num_thread=1", "--ollama-start", "--ollama-bin", ollamaBin,
		"--ollama-url", "http://127.0.0.1:11434", "--ollama-models-dir", filepath.Join(t.TempDir(), "models"),
		"--control-url", "https://" + proxy.addr, "--control-cert-sha256", ctl.pin, "--enrollment-token", enroll,
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40", "--firewall"}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })

	var srv serverView
	if code := ctl.api("POST", "/v1/servers", map[string]any{"name": "e2e-fw", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "deployment", "model": "e2e-tiny", "billing": "monthly"}, &srv); code != http.StatusCreated {
		t.Fatalf("create server: %d", code)
	}
	testutil.WaitFor(t, 90*time.Second, "server running", func() bool { srv = ctl.server(srv.ID); return srv.Status == "running" })
	if srv.IP == nil || *srv.IP != nsServerIP.String() {
		t.Fatalf("server ip %v, want %s", srv.IP, nsServerIP)
	}
	if out := runCmd(t, "ip", "netns", "exec", pair.Server, "nft", "list", "table", "inet", "hearth"); !strings.Contains(out, "chain input") {
		t.Fatalf("no hearth table in the server namespace:\n%s", out)
	}

	const web, admin, dns, outPort = 8080, 9090, 5353, 7070
	listenNS(t, pair.Server, nsServerIP, []int{web, admin}, []int{dns})
	listenNS(t, pair.Client, nsClientIP, []int{outPort}, nil)
	type probe struct {
		proto string
		port  int
		out   bool // from the server to the client, else the other way
	}
	// check runs a step's probes at once: a blocked probe waits out its
	// timeout, and they are independent.
	check := func(step string, want map[probe]bool) {
		t.Helper()
		errs := make(map[probe]error, len(want))
		var mu sync.Mutex
		var wg sync.WaitGroup
		for p := range want {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				if p.out {
					err = reach(pair.Server, p.proto, nsServerIP, netip.AddrPortFrom(nsClientIP, uint16(p.port)))
				} else {
					err = reach(pair.Client, p.proto, nsClientIP, netip.AddrPortFrom(nsServerIP, uint16(p.port)))
				}
				mu.Lock()
				errs[p] = err
				mu.Unlock()
			}()
		}
		wg.Wait()
		t.Logf("%s: checked %d probes at %v", step, len(want), time.Since(testStart).Round(100*time.Millisecond))
		for p, ok := range want {
			err := errs[p]
			dir := "inbound"
			if p.out {
				dir = "outbound"
			}
			if ok && err != nil {
				t.Errorf("%s: %s %s port %d blocked but must pass: %v", step, dir, p.proto, p.port, err)
			} else if !ok && err == nil {
				t.Errorf("%s: %s %s port %d passed but must be blocked", step, dir, p.proto, p.port)
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	var (
		webIn   = probe{"tcp", web, false}
		adminIn = probe{"tcp", admin, false}
		dnsIn   = probe{"udp", dns, false}
		out     = probe{"tcp", outPort, true}
	)
	check("no rules", map[probe]bool{webIn: true, adminIn: true, dnsIn: true, out: true})

	rulesPath := "/v1/servers/" + srv.ID + "/firewall-rules"
	addRule := func(rule map[string]any) string {
		t.Helper()
		var r struct{ ID string }
		if code := ctl.api("POST", rulesPath, rule, &r); code != http.StatusCreated {
			t.Fatalf("create rule %v: %d", rule, code)
		}
		ctl.waitApplied(srv.ID, 10*time.Second)
		return r.ID
	}
	delRule := func(id string) {
		t.Helper()
		if code := ctl.api("DELETE", rulesPath+"/"+id, nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete rule %s: %d", id, code)
		}
		ctl.waitApplied(srv.ID, 10*time.Second)
	}

	// One inbound allow: that port from that client passes, everything else
	// inbound is dropped; outbound is untouched.
	allowWeb := addRule(map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": strconv.Itoa(web),
		"source": nsClientIP.String(), "action": "allow"})
	check("allow tcp web", map[probe]bool{webIn: true, adminIn: false, dnsIn: false, out: true})
	allowDNS := addRule(map[string]any{"direction": "inbound", "protocol": "udp", "port_range": strconv.Itoa(dns), "action": "allow"})
	check("allow udp dns", map[probe]bool{webIn: true, dnsIn: true})
	// A deny wins over an allow; deleting it restores the allow.
	denyWeb := addRule(map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "8000-8999",
		"source": "10.231.0.0/24", "action": "deny"})
	check("deny tcp 8000-8999", map[probe]bool{webIn: false, dnsIn: true})
	delRule(denyWeb)
	check("deny deleted", map[probe]bool{webIn: true, adminIn: false})

	// Default deny outbound too (the only outbound allow matches nothing
	// here), and a deny of everything inbound from the control plane's
	// network. The node keeps talking to the control plane, even over new
	// connections: every connection to it is cut, and a new rule still
	// reaches the node and is reported applied.
	allowOut := addRule(map[string]any{"direction": "outbound", "protocol": "udp", "port_range": "53",
		"destination": "10.231.0.99", "action": "allow"})
	denyCtlNet := addRule(map[string]any{"direction": "inbound", "protocol": "tcp", "source": nsControlIP.String(), "action": "deny"})
	check("default deny both ways", map[probe]bool{out: false, adminIn: false, webIn: true})
	if n := proxy.dropAll(); n == 0 {
		t.Fatal("the node had no connection to the control plane")
	}
	allowAdmin := addRule(map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": strconv.Itoa(admin), "action": "allow"})
	check("rule added under default deny", map[probe]bool{adminIn: true, out: false})
	if s := ctl.server(srv.ID); s.Status != "running" {
		t.Fatalf("server %s under default deny", s.Status)
	}

	// Deleting every rule restores all reachability.
	for _, id := range []string{denyCtlNet, allowOut, allowAdmin, allowDNS, allowWeb} {
		delRule(id)
	}
	check("all rules deleted", map[probe]bool{webIn: true, adminIn: true, dnsIn: true, out: true})
}

// TestStandaloneFirewallFromFile runs hearthd --firewall without a control
// plane in a network namespace: the rules come from --desired-state-file,
// changes to the file take effect on their own, and an invalid file leaves
// the rules in force.
func TestStandaloneFirewallFromFile(t *testing.T) {
	testutil.RequireRoot(t, skipNetnsEnv, "ip", "nft")
	pair := newNetPair(t)
	const web, admin = 8080, 9090
	listenNS(t, pair.Server, nsServerIP, []int{web, admin}, nil)
	passes := func(port int) bool {
		return reach(pair.Client, "tcp", nsClientIP, netip.AddrPortFrom(nsServerIP, uint16(port))) == nil
	}
	file := filepath.Join(t.TempDir(), "desired.json")
	write := func(content string) {
		t.Helper()
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	write(`{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "8080", "action": "allow"}]}`)

	// No runtime answers in the namespace: enforcement does not wait for
	// the model.
	h := startHearthd(t, hearthdOpts{prefix: netnsExec(pair.Server), stateDir: t.TempDir(), args: []string{
		"--model", "e2e-tiny", "--ollama-url", "http://127.0.0.1:1", "--desired-state-file", file, "--firewall"}})
	testutil.WaitFor(t, 15*time.Second, "the file's rules in force", func() bool { return passes(web) && !passes(admin) })

	mark := h.logLen()
	write(`{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "0", "action": "allow"}]}`)
	h.waitLog(regexp.MustCompile(`desired-state file not applied`), mark, 15*time.Second)
	if !passes(web) || passes(admin) {
		t.Fatal("an invalid file changed the rules in force")
	}

	write(`{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "9090", "action": "allow"}]}`)
	testutil.WaitFor(t, 15*time.Second, "the changed file in force", func() bool { return passes(admin) && !passes(web) })
	write(`{}`)
	testutil.WaitFor(t, 15*time.Second, "an empty file allowing everything", func() bool { return passes(admin) && passes(web) })
}
