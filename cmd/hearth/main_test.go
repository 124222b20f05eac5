package main

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/hearthd/hearth/internal/controltest"
	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
)

// The CLI's tests run its commands against a real hearth-control process
// with fake nodes (internal/controltest). Most run the CLI in-process
// (run, with the race detector watching); TestBinary runs the built binary
// for what only a process shows: its exit status and its default output
// when stdout is not a terminal.

var bins controltest.Binaries

func TestMain(m *testing.M) { os.Exit(controltest.Main(m, &bins)) }

// harness is a control plane and the environment the CLI runs in: its
// URL and token in HEARTH_URL and HEARTH_TOKEN, and a home of its own.
type harness struct {
	t   *testing.T
	ctl *controltest.Control
	env map[string]string
}

// newHarness starts a control plane (args after the defaults; a generous
// rate limit unless args set one).
func newHarness(t *testing.T, args ...string) *harness {
	t.Helper()
	ctl := controltest.Start(t, &bins, append([]string{"--rate-limit", "1000", "--rate-burst", "1000"}, args...)...)
	home := t.TempDir()
	return &harness{t: t, ctl: ctl, env: map[string]string{
		"HEARTH_URL": ctl.URL, "HEARTH_TOKEN": ctl.Token, "HOME": home, "XDG_CONFIG_HOME": filepath.Join(home, "config"),
	}}
}

// result is one run of the CLI.
type result struct {
	out, err string
	code     int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err)
}

// invocation is a run of the CLI in-process that may still be going.
type invocation struct {
	out, err *proctest.LogBuffer
	done     chan struct{}
	res      result
}

// start runs the CLI in-process in the background, stdin empty.
func (h *harness) start(args ...string) *invocation {
	return h.startWith("", args...)
}

func (h *harness) startWith(stdin string, args ...string) *invocation {
	inv := &invocation{out: &proctest.LogBuffer{}, err: &proctest.LogBuffer{}, done: make(chan struct{})}
	s := stdio{in: strings.NewReader(stdin), out: inv.out, err: inv.err, getenv: func(k string) string { return h.env[k] }}
	go func() {
		defer close(inv.done)
		code := run(h.t.Context(), args, s)
		inv.res = result{out: inv.out.String(), err: inv.err.String(), code: code}
	}()
	return inv
}

func (inv *invocation) wait(t *testing.T) result {
	t.Helper()
	select {
	case <-inv.done:
		return inv.res
	case <-time.After(60 * time.Second):
		t.Fatalf("the CLI did not finish in 60s; stderr so far:\n%s", inv.err.String())
	}
	return result{}
}

// run runs the CLI in-process and returns what it wrote and its exit code.
func (h *harness) run(args ...string) result {
	h.t.Helper()
	return h.start(args...).wait(h.t)
}

// ok runs the CLI and fails the test unless it exits 0.
func (h *harness) ok(args ...string) result {
	h.t.Helper()
	r := h.run(args...)
	if r.code != 0 {
		h.t.Fatalf("hearth %s: %v", strings.Join(args, " "), r)
	}
	return r
}

// json runs the CLI with -o json, requires exit 0 and decodes stdout.
func (h *harness) json(v any, args ...string) result {
	h.t.Helper()
	r := h.ok(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(r.out), v); err != nil {
		h.t.Fatalf("hearth %s: stdout is not the JSON expected: %v\n%s", strings.Join(args, " "), err, r.out)
	}
	return r
}

// fails runs the CLI and requires the exit code.
func (h *harness) fails(code int, args ...string) result {
	h.t.Helper()
	r := h.run(args...)
	if r.code != code {
		h.t.Fatalf("hearth %s: want exit %d, got %v", strings.Join(args, " "), code, r)
	}
	return r
}

// exec runs the built hearth binary as a process.
func (h *harness) exec(args ...string) result {
	h.t.Helper()
	cmd := exec.Command(bins.Path(h.t, "hearth"), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range h.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		h.t.Fatal(err)
	}
	return result{out: out.String(), err: errb.String(), code: cmd.ProcessState.ExitCode()}
}

// waitStderr waits until the invocation's stderr contains s.
func waitStderr(t *testing.T, inv *invocation, s string) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "stderr to say "+s, func() bool {
		select {
		case <-inv.done:
			return true
		default:
		}
		return strings.Contains(inv.err.String(), s)
	})
	if !strings.Contains(inv.err.String(), s) {
		t.Fatalf("the CLI ended without saying %q: %v", s, inv.res)
	}
}

// testKey is an ed25519 public key line.
const testKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL alice@laptop"

// genKeys returns n distinct ed25519 public key lines.
func genKeys(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for i := range n {
		pub, _, err := ed25519.GenerateKey(nil)
		if err != nil {
			t.Fatal(err)
		}
		k, err := ssh.NewPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))+fmt.Sprintf(" key%d@test", i))
	}
	return out
}
