package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// notifySocket is a NOTIFY_SOCKET as systemd provides one: a unixgram
// socket collecting sd_notify messages in order.
type notifySocket struct {
	path string
	conn *net.UnixConn
	mu   sync.Mutex
	msgs []string
}

func newNotifySocket(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{path: path, conn: conn}
	go func() {
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:k])), "\n") {
				n.msgs = append(n.msgs, line)
			}
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { conn.Close() })
	return n
}

func (n *notifySocket) messages() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// waitFor waits until a message with prefix arrives and returns its index.
func (n *notifySocket) waitFor(t *testing.T, prefix string, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		for i, m := range n.messages() {
			if strings.HasPrefix(m, prefix) {
				return i
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no %q from hearthd within %v; got %q", prefix, d, n.messages())
	return -1
}

// hearthd under systemd's protocols, without systemd as PID 1: READY=1
// after the model is warm with STATUS= lines before it, watchdog pings, and
// on SIGTERM STOPPING=1 while an in-flight stream still finishes.
func TestSystemdNotifyWatchdogAndDrain(t *testing.T) {
	inst := shared.ollama.Get(t)
	ns := newNotifySocket(t)
	h := startHearthd(t, hearthdOpts{env: []string{"NOTIFY_SOCKET=" + ns.path, "WATCHDOG_USEC=1000000"},
		args: []string{"--model", inst.Model, "--ollama-url", inst.URL, "--shutdown-timeout", "30s"}})

	ready := ns.waitFor(t, "READY=1", 60*time.Second)
	msgs := ns.messages()
	sawStatus := false
	for _, m := range msgs[:ready] {
		sawStatus = sawStatus || strings.HasPrefix(m, "STATUS=")
	}
	if !sawStatus {
		t.Fatalf("no STATUS= before READY=1: %q", msgs)
	}
	// READY=1 means ready: the API serves at once.
	if resp, err := http.Get(h.root + "/readyz"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("readyz after READY=1: %v %v", resp, err)
	}
	ns.waitFor(t, "WATCHDOG=1", 5*time.Second)

	// A long stream is in flight when SIGTERM arrives.
	resp := postChat(t, h, h.secret, fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":4000,"messages":[{"role":"user","content":"go"}]}`, inst.Model))
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	ns.waitFor(t, "STOPPING=1", 5*time.Second)
	last := ""
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: ") {
			last = strings.TrimSpace(line)
		}
		if err != nil {
			break
		}
	}
	if last != "data: [DONE]" {
		t.Fatalf("in-flight stream did not finish cleanly across SIGTERM; last event %q", last)
	}
	select {
	case <-h.exited:
	case <-time.After(30 * time.Second):
		t.Fatal("hearthd did not exit after draining")
	}
	if code := h.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("hearthd exit code %d after SIGTERM", code)
	}
}

// With a listening socket passed as systemd does (LISTEN_FDS, fd 3),
// hearthd serves on it instead of listening itself.
func TestSystemdSocketActivation(t *testing.T) {
	inst := shared.ollama.Get(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	ln.Close()
	defer f.Close()
	// LISTEN_PID must be the daemon's own pid: the shell sets it, then
	// execs hearthd in its place.
	addr := ln.Addr().String()
	h := startHearthd(t, hearthdOpts{
		prefix: []string{"/bin/sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=api exec "$0" "$@"`},
		files:  []*os.File{f},
		args:   []string{"--listen", "127.0.0.1:1", "--metrics-listen", "", "--model", inst.Model, "--ollama-url", inst.URL},
		probe: &probe{what: "service on the passed socket", within: 60 * time.Second,
			check: func(*proc) error { return getOK("http://" + addr + "/readyz") }},
	})
	req, _ := http.NewRequest("GET", "http://"+addr+"/api/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+h.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("models on the passed socket: %v %v", resp, err)
	}
	resp.Body.Close()
}
