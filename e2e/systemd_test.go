package e2e

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
)

// hearthd under systemd's protocols, without systemd as PID 1: READY=1
// after the model is warm with STATUS= lines before it, watchdog pings, and
// on SIGTERM STOPPING=1 while an in-flight stream still finishes.
func TestSystemdNotifyWatchdogAndDrain(t *testing.T) {
	inst := shared.ollama.Get(t)
	ns := testutil.NewNotifySocket(t)
	h := startHearthd(t, hearthdOpts{env: []string{"NOTIFY_SOCKET=" + ns.Path, "WATCHDOG_USEC=1000000"},
		args: []string{"--model", inst.Model, "--ollama-url", inst.URL, "--shutdown-timeout", "30s", "--max-output-tokens", "100000"}})

	ready := ns.WaitFor(t, 60*time.Second, "READY=1")
	msgs := ns.Messages()
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
	ns.WaitFor(t, 5*time.Second, "WATCHDOG=1")

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
	ns.WaitFor(t, 5*time.Second, "STOPPING=1")
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
	f, addr := passedSocket(t)
	h := startHearthd(t, hearthdOpts{
		prefix: activated,
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

// hearth-control, too, serves on the socket hearth-control.socket passes
// (FileDescriptorName=api) instead of listening itself: its --listen names
// an address another socket holds, so only the passed socket can serve.
func TestControlSocketActivation(t *testing.T) {
	f, addr := passedSocket(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	p := startProc(t, "hearth-control", procSpec{
		prefix: activated,
		argv: []string{binary(t, "hearth-control"), "serve", "--listen", busy.Addr().String(), "--metrics-listen", "",
			"--state-dir", t.TempDir(), "--public-deployment-url-template", "http://{name}.deploy.test/api/v1"},
		files: []*os.File{f},
		ready: []probe{{what: "the management API on the passed socket", within: 30 * time.Second,
			check: func(*proc) error { return getOK("http://" + addr + "/v1/openapi.json") }}},
	})
	testutil.WaitFor(t, 10*time.Second, "the serving log line", func() bool { return p.findLog(controlListenRe, 0) != nil })
	if m := p.findLog(controlListenRe, 0); m[1] != addr || !strings.Contains(p.logs(), "socket_activated=true") {
		t.Fatalf("hearth-control serves on %s, want the passed socket %s, socket-activated:\n%s", m[1], addr, p.logs())
	}
}

// activated runs a daemon as systemd socket-activates it with one socket
// named "api" at fd 3: LISTEN_PID must be the daemon's own pid, so the
// shell sets it, then execs the daemon in its place.
var activated = []string{"/bin/sh", "-c", `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=api exec "$0" "$@"`}

// passedSocket returns a listening loopback socket to pass to a daemon, as
// a file, and its address. It is closed when the test ends.
func passedSocket(t *testing.T) (*os.File, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close() // the file is a copy that keeps the socket listening
	f, err := ln.(*net.TCPListener).File()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, ln.Addr().String()
}
