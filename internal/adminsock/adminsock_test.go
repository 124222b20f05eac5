package adminsock

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// serve answers every HTTP request on ln with body until the test ends.
func serve(t *testing.T, ln net.Listener, body string) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
}

// get asks the server on the admin socket at path and returns its answer.
func get(path string) (string, error) {
	resp, err := Client(path).Get("http://admin/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func TestListenCreatesAPrivateSocket(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run", "hearth")
	path := filepath.Join(dir, "admin.sock")
	ln, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	serve(t, ln, "first")
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v, %v: want a socket with mode 0600", fi.Mode(), err)
	}
	if di, err := os.Stat(dir); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("directory %v, %v: want 0700", di.Mode(), err)
	}
	if got, err := get(path); err != nil || got != "first" {
		t.Fatalf("request over the socket: %q, %v", got, err)
	}
}

// Anything at the path that is not a socket is left exactly as it was,
// with an error that names the path and says why.
func TestListenRefusesWhatIsNotASocket(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "hearth.db")
	if err := os.WriteFile(file, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "subdir")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.sock")
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{file, sub, link} {
		ln, err := Listen(path)
		if err == nil {
			ln.Close()
			t.Fatalf("Listen(%s) succeeded", path)
		}
		if !errors.Is(err, ErrNotSocket) || !strings.Contains(err.Error(), path) ||
			!strings.Contains(err.Error(), "not a socket") {
			t.Errorf("Listen(%s) = %q, want an error naming the path and saying it is not a socket", path, err)
		}
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "precious" {
		t.Fatalf("regular file after Listen: %q, %v", b, err)
	}
	if fi, err := os.Stat(sub); err != nil || !fi.IsDir() {
		t.Fatalf("directory after Listen: %v", err)
	}
	if target, err := os.Readlink(link); err != nil || target != file {
		t.Fatalf("symlink after Listen: %q, %v", target, err)
	}
}

// holder is another process holding the admin socket: this test binary,
// run again (see TestMain).
type holder struct {
	cmd *exec.Cmd
}

func startHolder(t *testing.T, path string) *holder {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "ADMINSOCK_HOLD="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "listening\n" {
		t.Fatalf("socket holder: %q, %v", line, err)
	}
	return &holder{cmd: cmd}
}

// kill ends the holder with SIGKILL: it cannot remove its socket, which
// stays behind, stale.
func (h *holder) kill(t *testing.T) {
	t.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = h.cmd.Wait()
}

// TestMain turns this test binary into the socket holder when startHolder
// runs it: it listens on $ADMINSOCK_HOLD and serves until killed.
func TestMain(m *testing.M) {
	path := os.Getenv("ADMINSOCK_HOLD")
	if path == "" {
		os.Exit(m.Run())
	}
	ln, err := Listen(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(1)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "holder")
	})}
	fmt.Println("listening")
	_ = srv.Serve(ln)
	os.Exit(1)
}

// A socket another live process serves on is refused and keeps working for
// that process; once the process has died (leaving its socket behind), the
// stale socket is replaced.
func TestListenRefusesALiveSocketAndReplacesAStaleOne(t *testing.T) {
	path := filepath.Join(t.TempDir(), "admin.sock")
	h := startHolder(t, path)

	ln, err := Listen(path)
	if err == nil {
		ln.Close()
		t.Fatal("Listen took over a socket another process serves on")
	}
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), path) ||
		!strings.Contains(err.Error(), "another process is serving on it") {
		t.Fatalf("Listen on a live socket = %q, want an error naming the path and the live process", err)
	}
	if got, err := get(path); err != nil || got != "holder" {
		t.Fatalf("the live process no longer answers after the refused Listen: %q, %v", got, err)
	}

	h.kill(t)
	if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("no stale socket after SIGKILL (%v): the test would prove nothing", err)
	}
	if _, err := get(path); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("request to the stale socket: %v, want ErrNotRunning", err)
	}
	ln, err = Listen(path)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	serve(t, ln, "second")
	if got, err := get(path); err != nil || got != "second" {
		t.Fatalf("request after replacing the stale socket: %q, %v", got, err)
	}
}

func TestDialTellsNotRunningFromOtherFailures(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	if _, err := Dial(ctx, filepath.Join(dir, "missing.sock")); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Dial with no socket: %v, want ErrNotRunning", err)
	}
	// A socket whose listener is closed without removing the file.
	stale := filepath.Join(dir, "stale.sock")
	ln, err := net.Listen("unix", stale)
	if err != nil {
		t.Fatal(err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	if _, err := Dial(ctx, stale); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("Dial a stale socket: %v, want ErrNotRunning", err)
	}
	// A dial that ends for another reason is not "not running".
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	live := filepath.Join(dir, "live.sock")
	ln, err = Listen(live)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Dial(cctx, live); err == nil || errors.Is(err, ErrNotRunning) {
		t.Fatalf("Dial with a cancelled context: %v, want an error other than ErrNotRunning", err)
	}
	c, err := Dial(ctx, live)
	if err != nil {
		t.Fatalf("Dial a live socket: %v", err)
	}
	c.Close()
}
