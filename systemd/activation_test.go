package systemd

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// helperEnv selects what TestHelperProcess does in the child.
const helperEnv = "HEARTH_SYSTEMD_TEST_HELPER"

// TestHelperProcess is not a test: it is the socket-activated child that
// the activation tests start. Like systemd, the parent passes listening
// sockets from fd 3 with LISTEN_FDS/LISTEN_FDNAMES, and LISTEN_PID is set to
// the child's own pid by exec'ing through sh (`LISTEN_PID=$$ exec …`). The
// child takes its sockets, reports on stdout, serves HTTP on each (the body
// names the socket and the child's pid) and exits when stdin closes.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return
	}
	os.Exit(helperMain(mode))
}

func helperMain(mode string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "helper: "+format+"\n", args...)
		return 1
	}
	serve := func(ln net.Listener, label string) {
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "%s pid=%d", label, os.Getpid())
		}))
	}
	switch mode {
	case "single":
		ln, activated, err := Listen("127.0.0.1:0")
		if err != nil {
			return fail("Listen: %v", err)
		}
		// activation must not leak into children.
		fmt.Printf("activated=%v addr=%s env=%q\n", activated, ln.Addr(), os.Getenv("LISTEN_FDS")+os.Getenv("LISTEN_PID")+os.Getenv("LISTEN_FDNAMES"))
		serve(ln, "single")
	case "named":
		s, err := PassedSockets()
		if err != nil {
			return fail("PassedSockets: %v", err)
		}
		names := strings.Join(s.Names(), ",")
		_, _, ambiguous := s.Listen("", "127.0.0.1:0")
		metrics, mAct, err := s.Listen("metrics", "127.0.0.1:0")
		if err != nil {
			return fail("Listen metrics: %v", err)
		}
		api, aAct, err := s.Listen("api", "127.0.0.1:0")
		if err != nil {
			return fail("Listen api: %v", err)
		}
		// Not passed: a plain listener.
		admin, adAct, err := s.Listen("admin", "127.0.0.1:0")
		if err != nil {
			return fail("Listen admin: %v", err)
		}
		admin.Close()
		fmt.Printf("names=%s ambiguous=%v api=%v metrics=%v admin=%v left=%d\n", names, ambiguous != nil, aAct, mAct, adAct, len(s.Names()))
		serve(api, "api")
		serve(metrics, "metrics")
	default:
		return fail("unknown mode %q", mode)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// activatedChild starts the helper with lns passed as systemd would pass
// them, and closes the parent's copies so only the child can accept.
func activatedChild(t *testing.T, mode string, names []string, lns []*net.TCPListener) (report string, cmd *exec.Cmd) {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatalf("sh is needed to set LISTEN_PID to the child's pid: %v", err)
	}
	cmd = exec.Command(sh, "-c", `LISTEN_PID=$$ exec "$0" "$@"`, os.Args[0], "-test.run=^TestHelperProcess$")
	for _, ln := range lns {
		f, err := ln.File()
		if err != nil {
			t.Fatal(err)
		}
		cmd.ExtraFiles = append(cmd.ExtraFiles, f) // fds 3, 4, …
	}
	cmd.Env = append(os.Environ(),
		helperEnv+"="+mode,
		"LISTEN_FDS="+strconv.Itoa(len(lns)),
		"LISTEN_FDNAMES="+strings.Join(names, ":"),
	)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i, f := range cmd.ExtraFiles {
		f.Close()
		lns[i].Close()
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("helper exited: %v; stderr: %s", err, stderr.String())
			}
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("helper did not exit after stdin closed")
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper report: %v; stderr: %s", err, stderr.String())
	}
	return strings.TrimSpace(line), cmd
}

func listenTCP(t *testing.T) *net.TCPListener {
	t.Helper()
	ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func get(t *testing.T, addr string) string {
	t.Helper()
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", addr, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestListenUsesSocketPassedBySystemd(t *testing.T) {
	ln := listenTCP(t)
	addr := ln.Addr().String()
	report, cmd := activatedChild(t, "single", []string{"hearthd.socket"}, []*net.TCPListener{ln})

	want := fmt.Sprintf("activated=true addr=%s env=%q", addr, "")
	if report != want {
		t.Fatalf("child reported %q, want %q", report, want)
	}
	if got, want := get(t, addr), fmt.Sprintf("single pid=%d", cmd.Process.Pid); got != want {
		t.Fatalf("served %q, want %q", got, want)
	}
}

func TestSocketsHandsOutPassedSocketsByName(t *testing.T) {
	api, metrics := listenTCP(t), listenTCP(t)
	apiAddr, metricsAddr := api.Addr().String(), metrics.Addr().String()
	report, cmd := activatedChild(t, "named", []string{"api", "metrics"}, []*net.TCPListener{api, metrics})

	if want := "names=api,metrics ambiguous=true api=true metrics=true admin=false left=0"; report != want {
		t.Fatalf("child reported %q, want %q", report, want)
	}
	for addr, label := range map[string]string{apiAddr: "api", metricsAddr: "metrics"} {
		if got, want := get(t, addr), fmt.Sprintf("%s pid=%d", label, cmd.Process.Pid); got != want {
			t.Fatalf("%s: served %q, want %q", addr, got, want)
		}
	}
}

func TestListenWithoutActivationListensItself(t *testing.T) {
	t.Setenv("LISTEN_FDS", "")
	t.Setenv("LISTEN_PID", "")
	ln, activated, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if activated {
		t.Fatal("reported activated without LISTEN_FDS")
	}
	if tcp, ok := ln.Addr().(*net.TCPAddr); !ok || !tcp.IP.IsLoopback() || tcp.Port == 0 {
		t.Fatalf("listening on %v, want a loopback TCP port", ln.Addr())
	}
	if _, _, err := Listen("127.0.0.1:notaport"); err == nil {
		t.Fatal("bad address accepted")
	}
}

// Sockets meant for another process (LISTEN_PID mismatch) are not taken,
// and the variables are cleared either way so children do not see them.
func TestListenIgnoresSocketsForAnotherProcess(t *testing.T) {
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()+1))
	t.Setenv("LISTEN_FDNAMES", "api")
	lns, err := Listeners()
	if err != nil {
		t.Fatal(err)
	}
	if len(lns) != 0 {
		t.Fatalf("took %d sockets passed to another pid", len(lns))
	}
	for _, k := range []string{"LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"} {
		if v, ok := os.LookupEnv(k); ok {
			t.Errorf("%s=%q still set", k, v)
		}
	}
}
