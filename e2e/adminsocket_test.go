package e2e

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
)

// startFailingControl runs `hearth-control serve` with args, expects it to
// exit with an error without ever serving, and returns its output.
func startFailingControl(t *testing.T, args ...string) string {
	t.Helper()
	argv := append([]string{binary(t, "hearth-control"), "serve", "--listen", "127.0.0.1:0", "--metrics-listen", ""}, args...)
	p := startProc(t, "second hearth-control", procSpec{argv: argv})
	exited := func() bool {
		select {
		case <-p.exited:
			return true
		default:
			return false
		}
	}
	testutil.WaitFor(t, 30*time.Second, "hearth-control to exit or start serving", func() bool {
		return exited() || p.findLog(controlListenRe, 0) != nil
	})
	if !exited() {
		t.Fatalf("hearth-control started serving:\n%s", p.logs())
	}
	if p.cmd.ProcessState.Success() {
		t.Fatalf("hearth-control exited 0:\n%s", p.logs())
	}
	return p.logs()
}

// hearth-control's admin socket is as careful as hearthd's: it deletes no
// file that is not a socket and takes over no socket a live server answers
// on, while a socket left by a killed server is replaced.
func TestControlAdminSocketIsNeverTakenOver(t *testing.T) {
	ctl := startControl(t)
	sock := filepath.Join(ctl.stateDir, "admin.sock")

	// A second instance with its own state, pointed at the live socket.
	out := startFailingControl(t, "--state-dir", t.TempDir(), "--admin-socket", sock)
	if !strings.Contains(out, sock) || !strings.Contains(out, "another process is serving on it") {
		t.Fatalf("second instance's error does not name the socket and the live server:\n%s", out)
	}
	// The CLI still reaches the first server, whatever state dir it names.
	tok := strings.TrimSpace(runCmd(t, ctl.bin, "tokens", "create", "--project", "default", "--name", "after",
		"--state-dir", t.TempDir(), "--admin-socket", sock))
	req, _ := http.NewRequest("GET", ctl.url+"/v1/servers", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("token made through the socket: %d on the first server, want 200", resp.StatusCode)
	}

	// A regular file given as the socket.
	file := filepath.Join(t.TempDir(), "hearth.conf")
	if err := os.WriteFile(file, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out = startFailingControl(t, "--state-dir", t.TempDir(), "--admin-socket", file)
	if !strings.Contains(out, file) || !strings.Contains(out, "not a socket") {
		t.Fatalf("error does not name the file and say it is not a socket:\n%s", out)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me\n" {
		t.Fatalf("file after the refused start: %q, %v", b, err)
	}

	// SIGKILL leaves the socket behind; the next start replaces it.
	ctl.kill()
	if fi, err := os.Lstat(sock); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("no stale socket after SIGKILL (%v): nothing to replace", err)
	}
	ctl2 := ctl.restart()
	// With the server holding the store, only the socket can serve this.
	if tok := strings.TrimSpace(ctl2.cli("tokens", "create", "--project", "default", "--name", "restarted")); !strings.HasPrefix(tok, "hct_") {
		t.Fatalf("token after restart %q", tok)
	}
}
