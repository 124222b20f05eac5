package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/testutil"
)

// Helpers for the fault, bad-input and load tests: a node enrolled with a
// control plane, the processes hearthd supervises, and requests written by
// hand.

// enrolledNode is a control plane with one hearthd node enrolled, in front
// of a mock runtime and managing an authorized_keys file.
type enrolledNode struct {
	ctl  *controlPlane
	mock *bench.MockServer
	ak   string // the node's authorized_keys file
	node *hearthd
	id   string // the node's ID
}

// startEnrolledNode starts a control plane without rate limits and a node
// that enrolls with it, and waits for the enrollment.
func startEnrolledNode(t *testing.T) *enrolledNode {
	t.Helper()
	e := &enrolledNode{ctl: startControl(t, noRateLimit...), mock: startMockRuntime(t, "node-model", bench.MockConfig{Tokens: 4})}
	dir := t.TempDir()
	e.ak = filepath.Join(dir, "authorized_keys")
	e.node = startHearthd(t, hearthdOpts{stateDir: filepath.Join(dir, "state"),
		args: append(e.nodeArgs(), "--enrollment-token", e.ctl.enrollmentToken(1))})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(e.ctl.nodes()) == 1 })
	e.id = e.ctl.nodes()[0].ID
	return e
}

// nodeArgs are the node's serve flags but the enrollment token, which an
// enrolled node does not need again.
func (e *enrolledNode) nodeArgs() []string {
	return []string{"--metrics-listen", "", "--model", "node-model", "--ollama-url", e.mock.URL, "--control-url", e.ctl.url,
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40", "--authorized-keys-file", e.ak}
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

// postDeclaredBody sends a POST whose Content-Length declares size bytes but
// only the first part of the body, and reads the answer: a server that
// refuses the size answers without waiting for the rest. (Sending it all
// races the refusal: the server closes while the client still writes.)
func postDeclaredBody(t *testing.T, root, path, key string, size int) (int, []byte) {
	t.Helper()
	c := dialRaw(t, root)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(15 * time.Second))
	rawPost(c, path, key, size, `{"model":"x","pad":"`)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("POST %s with a %d-byte body: %v", path, size, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// rawPost writes a POST by hand: Content-Length says length, whatever the
// body holds.
func rawPost(w io.Writer, path, key string, length int, body string) {
	fmt.Fprintf(w, "POST %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, key, length, body)
}

// scrape returns the Prometheus exposition at addr, or an error.
func scrape(addr string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return "", fmt.Errorf("metrics: %d", resp.StatusCode)
	}
	return string(b), err
}

func tail(s []string, n int) []string { return s[max(0, len(s)-n):] }
