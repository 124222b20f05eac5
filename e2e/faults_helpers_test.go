package e2e

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	binenc "encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/bench"
)

// Helpers for the fault, bad-input and load tests: processes that can be
// killed with SIGKILL and started again on the same state and address.

// launchControl starts `hearth-control serve` on stateDir and listen (a
// fixed host:port, so a restarted process is found where the old one was).
// token is the management API token already stored in stateDir.
func launchControl(t *testing.T, stateDir, listen, token string) *controlPlane {
	t.Helper()
	c := &controlPlane{t: t, bin: binary(t, "hearth-control"), stateDir: stateDir, token: token, exited: make(chan struct{})}
	c.cmd = exec.Command(c.bin, "serve", "--listen", listen, "--state-dir", stateDir, "--log-level", "debug",
		"--rate-limit", "100000", "--rate-burst", "100000",
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
		sc.Buffer(make([]byte, 64<<10), 1<<20)
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
			t.Logf("hearth-control (pid %d) log:\n%s", c.cmd.Process.Pid, c.log.String())
			c.mu.Unlock()
		}
	})
	select {
	case a := <-addr:
		c.url = "http://" + a
	case <-c.exited:
		t.Fatalf("hearth-control exited at start:\n%s", c.logs())
	case <-time.After(30 * time.Second):
		t.Fatal("hearth-control did not listen")
	}
	return c
}

// newControl makes a fresh control plane state with a token and starts it
// on a fixed loopback port.
func newControl(t *testing.T) *controlPlane {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command(binary(t, "hearth-control"), "tokens", "create", "--name", "faults", "--state-dir", dir).Output()
	if err != nil {
		t.Fatalf("tokens create: %v", err)
	}
	return launchControl(t, dir, fmt.Sprintf("127.0.0.1:%d", freePort(t)), strings.TrimSpace(string(out)))
}

func (c *controlPlane) logs() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

// kill ends the process with SIGKILL: no drain, no close of the store.
func (c *controlPlane) kill() {
	_ = c.cmd.Process.Kill()
	<-c.exited
}

// restart starts a new process on the same state and address.
func (c *controlPlane) restart() *controlPlane {
	c.t.Helper()
	return launchControl(c.t, c.stateDir, strings.TrimPrefix(c.url, "http://"), c.token)
}

// raw sends a request with the given body bytes and headers and returns the
// status and body; it never fails the test on transport errors.
func (c *controlPlane) raw(method, path string, body []byte, hdr ...string) (int, []byte, error) {
	req, err := http.NewRequest(method, c.url+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// enrollmentToken issues a token for n nodes.
func (c *controlPlane) enrollmentToken(n int) string {
	c.t.Helper()
	return strings.TrimSpace(c.cli("enrollment-tokens", "create", "--uses", strconv.Itoa(n), "--ttl", "1h"))
}

// node returns the enrolled node's record by ID.
func (c *controlPlane) node(id string) nodeInfo {
	c.t.Helper()
	for _, n := range c.nodes() {
		if n.ID == id {
			return n
		}
	}
	c.t.Fatalf("no node %s", id)
	return nodeInfo{}
}

// launchHearthd starts `hearthd serve` on an existing state directory (a
// restart keeps keys, node credential and last desired state).
func launchHearthd(t *testing.T, stateDir, secret string, args ...string) *hearthd {
	t.Helper()
	h := &hearthd{t: t, bin: binary(t, "hearthd"), stateDir: stateDir, secret: secret, exited: make(chan struct{})}
	full := append([]string{"serve", "--listen", "127.0.0.1:0", "--state-dir", stateDir, "--log-level", "debug",
		"--metrics-listen", ""}, args...)
	h.cmd = exec.Command(h.bin, full...)
	stderr, err := h.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			h.mu.Lock()
			h.log.WriteString(line + "\n")
			h.mu.Unlock()
			if m := listenRe.FindStringSubmatch(line); m != nil {
				addr <- m[1]
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	go func() { _ = h.cmd.Wait(); close(h.exited) }()
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("hearthd (pid %d) log:\n%s", h.cmd.Process.Pid, h.logs())
		}
	})
	select {
	case a := <-addr:
		h.root = "http://" + a
		h.url = h.root + "/api/v1"
	case <-h.exited:
		t.Fatalf("hearthd exited at start:\n%s", h.logs())
	case <-time.After(30 * time.Second):
		t.Fatalf("hearthd did not listen:\n%s", h.logs())
	}
	return h
}

// kill ends hearthd with SIGKILL.
func (h *hearthd) kill() {
	_ = h.cmd.Process.Kill()
	<-h.exited
}

// startMockRuntime serves the bench mock runtime (an Ollama look-alike with
// synthetic tokens) on loopback for the test.
func startMockRuntime(t *testing.T, model string, cfg bench.MockConfig) *bench.MockServer {
	t.Helper()
	m, err := bench.StartMock("127.0.0.1:0", model, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// childrenOf lists the PIDs of pid's direct children.
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, f := range tasks {
		b, _ := os.ReadFile(f)
		for _, s := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(s); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// ollamaChild returns the PID of the `ollama serve` hearthd supervises, or 0.
func ollamaChild(hearthdPID int) int {
	for _, c := range childrenOf(hearthdPID) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c))
		if strings.Contains(string(cmd), "ollama") && strings.Contains(string(cmd), "serve") {
			return c
		}
	}
	return 0
}

// sseLines reads a server-sent event stream's data lines until EOF.
func sseLines(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out, sc.Err()
}

// openAIError decodes an OpenAI error body: {"error":{"message","type","param","code"}}.
func openAIError(t *testing.T, b []byte) (typ, code string) {
	t.Helper()
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error body: %q (%v)", b, err)
	}
	if e.Error.Code != nil {
		code = *e.Error.Code
	}
	return e.Error.Type, code
}

// raiseNoFile lifts the open-files soft limit to the hard limit and returns
// the new soft limit. Child processes inherit it.
func raiseNoFile(t *testing.T) uint64 {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur < lim.Max {
		old := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			l := lim
			l.Cur = old
			_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l)
		})
	}
	return lim.Cur
}

// dialRaw opens a plain TCP connection to a root URL (http://host:port).
func dialRaw(t *testing.T, root string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(root, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// genPubKey returns a fresh ssh-ed25519 public key line, made in-process
// (ssh-keygen per key would dominate tests that need hundreds).
func genPubKey(t *testing.T) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for _, part := range [][]byte{[]byte("ssh-ed25519"), pub} {
		wire = binenc.BigEndian.AppendUint32(wire, uint32(len(part)))
		wire = append(wire, part...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(wire) + " e2e@test"
}

// postDeclaredBody sends a POST whose Content-Length declares size bytes but
// only the first part of the body, and reads the answer: a server that
// refuses the size answers without waiting for the rest. (Sending it all
// races the refusal: the server closes while the client still writes.)
func postDeclaredBody(t *testing.T, root, path, key string, size int) (int, []byte) {
	t.Helper()
	c := dialRaw(t, root)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"x\",\"pad\":\"",
		path, key, size)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("POST %s with a %d-byte body: %v", path, size, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}
