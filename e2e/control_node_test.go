package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// controlPlane is one running `hearth-control serve` process.
type controlPlane struct {
	t        *testing.T
	bin      string
	stateDir string
	url      string
	token    string
	cmd      *exec.Cmd
	mu       sync.Mutex
	log      bytes.Buffer
	exited   chan struct{}
}

var controlListenRe = regexp.MustCompile(`msg="control plane serving" listen=(\S+)`)

// startControl starts the control plane on a loopback port. The first API
// token is made before the process starts (straight into the state).
func startControl(t *testing.T) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, bin: binary(t, "hearth-control"), stateDir: t.TempDir(), exited: make(chan struct{})}
	c.token = strings.TrimSpace(c.cli("tokens", "create", "--name", "offline"))
	c.cmd = exec.Command(c.bin, "serve", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--state-dir", c.stateDir, "--log-level", "debug",
		"--public-deployment-url-template", "http://{name}.deploy.test/api/v1")
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			c.mu.Lock()
			c.log.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			if m := controlListenRe.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		c.stop()
		if t.Failed() {
			c.mu.Lock()
			t.Logf("hearth-control log:\n%s", c.log.String())
			c.mu.Unlock()
		}
	})
	select {
	case a := <-addr:
		c.url = "http://" + a
	case <-c.exited:
		t.Fatal("hearth-control exited at start")
	case <-time.After(30 * time.Second):
		t.Fatal("hearth-control did not listen")
	}
	return c
}

func (c *controlPlane) stop() {
	if c.cmd.Process == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(15 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

// cli runs a hearth-control command against this state directory and
// returns its standard output.
func (c *controlPlane) cli(args ...string) string {
	c.t.Helper()
	args = append(args, "--state-dir", c.stateDir)
	out, err := exec.Command(c.bin, args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			c.t.Fatalf("hearth-control %v: %v\n%s", args, err, ee.Stderr)
		}
		c.t.Fatalf("hearth-control %v: %v", args, err)
	}
	return string(out)
}

func (c *controlPlane) api(method, path string, in, out any) int {
	c.t.Helper()
	var body io.Reader
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, c.url+path, body)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			c.t.Fatalf("decode %s: %v", b, err)
		}
	}
	return resp.StatusCode
}

type nodeInfo struct {
	ID       string `json:"id"`
	ServerID string `json:"server_id"`
	Revision uint64 `json:"revision"`
	Observed *struct {
		FirewallRevision uint64 `json:"firewall_revision"`
		SSHKeysRevision  uint64 `json:"ssh_keys_revision"`
		RuntimeHealthy   bool   `json:"runtime_healthy"`
	} `json:"observed"`
}

func (c *controlPlane) nodes() []nodeInfo {
	c.t.Helper()
	var n []nodeInfo
	if err := json.Unmarshal([]byte(c.cli("nodes", "list")), &n); err != nil {
		c.t.Fatal(err)
	}
	return n
}

func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestControlPlaneAndNode runs the control plane and a hearthd node as two
// real processes: the node enrolls, a server created through the API is
// assigned to it and becomes running, changes reach it, and deleting the
// server returns it to the pool.
func TestControlPlaneAndNode(t *testing.T) {
	ctl := startControl(t)
	// While the server runs, the CLI goes through its admin socket.
	token2 := strings.TrimSpace(ctl.cli("tokens", "create", "--name", "online"))
	if !strings.HasPrefix(token2, "hct_") || token2 == ctl.token {
		t.Fatalf("second token %q", token2)
	}
	enroll := strings.TrimSpace(ctl.cli("enrollment-tokens", "create", "--uses", "1", "--ttl", "10m"))
	if !strings.HasPrefix(enroll, "hce_") {
		t.Fatalf("enrollment token %q", enroll)
	}
	// No node yet: no capacity.
	server := map[string]any{"name": "e2e-web", "chip": "cpu", "ram": 4, "storage": 20, "stack": "deployment",
		"model": "tiny", "billing": "monthly"}
	if code := ctl.api("POST", "/v1/servers", server, nil); code != http.StatusConflict {
		t.Fatalf("create without nodes: %d", code)
	}

	inst := shared.ollama.Get(t)
	server["model"] = inst.Model
	startHearthd(t, true, "--model", inst.Model, "--ollama-url", inst.URL,
		"--control-url", ctl.url, "--enrollment-token", enroll,
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40")
	eventually(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })

	var key struct{ ID string }
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL e2e@test"
	if code := ctl.api("POST", "/v1/ssh-keys", map[string]any{"name": "e2e", "public_key": pub}, &key); code != http.StatusCreated {
		t.Fatalf("create key: %d", code)
	}
	server["ssh_key_ids"] = []string{key.ID}
	var srv struct {
		ID, Status, DeploymentURL string
		IP                        *string
	}
	if code := ctl.api("POST", "/v1/servers", server, &srv); code != http.StatusCreated || srv.Status != "provisioning" {
		t.Fatalf("create server: %d %+v", code, srv)
	}
	eventually(t, 60*time.Second, "server running", func() bool {
		ctl.api("GET", "/v1/servers/"+srv.ID, nil, &srv)
		return srv.Status == "running"
	})
	if srv.IP == nil || *srv.IP != "127.0.0.1" {
		t.Fatalf("server ip %v", srv.IP)
	}

	// A firewall rule reaches the node and is reported applied.
	if code := ctl.api("POST", "/v1/servers/"+srv.ID+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "tcp", "port_range": "22", "action": "allow"}, nil); code != http.StatusCreated {
		t.Fatalf("create rule: %d", code)
	}
	eventually(t, 10*time.Second, "rule applied on the node", func() bool {
		n := ctl.nodes()[0]
		return n.Observed != nil && n.Observed.FirewallRevision == n.Revision && n.ServerID == srv.ID
	})

	// Deleting the server wipes the node and frees it.
	if code := ctl.api("DELETE", "/v1/servers/"+srv.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	eventually(t, 30*time.Second, "server gone", func() bool {
		return ctl.api("GET", "/v1/servers/"+srv.ID, nil, nil) == http.StatusNotFound
	})
	if n := ctl.nodes()[0]; n.ServerID != "" {
		t.Fatalf("node still assigned: %+v", n)
	}
	server["name"] = "e2e-again"
	if code := ctl.api("POST", "/v1/servers", server, nil); code != http.StatusCreated {
		t.Fatalf("node not back in the pool: %d", code)
	}
}
