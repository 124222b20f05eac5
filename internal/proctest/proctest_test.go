package proctest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestChildOutlivesStarterThread: a caller locked to a thread that then ends
// (as a test's goroutine may be) must not take the child with it through
// Pdeathsig.
func TestChildOutlivesStarterThread(t *testing.T) {
	type result struct {
		cmd  *exec.Cmd
		done <-chan struct{}
		err  error
		tid  int
	}
	got := make(chan result, 1)
	release := make(chan struct{})
	defer close(release)
	var try func()
	try = func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The runtime never ends the main thread: keep it busy and
			// start from another.
			go try()
			<-release
			runtime.UnlockOSThread()
			return
		}
		// Never unlocked: the thread ends with this goroutine.
		cmd := exec.Command("sleep", "600")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		done, err := Start(cmd)
		got <- result{cmd, done, err, unix.Gettid()}
	}
	go try()
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer func() { _ = r.cmd.Process.Kill(); <-r.done }()

	// Once the starter's thread is gone, its death signal, had it been
	// the child's parent thread, would have been sent already.
	task := "/proc/self/task/" + strconv.Itoa(r.tid)
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not end", r.tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if killed, state := signalled(t, r.cmd.Process.Pid); killed {
		t.Fatalf("the child died with its starter's thread (state %s)", state)
	}
}

// signalled reports whether pid is dead, dying or has SIGKILL pending, by
// its /proc status (no waiting for the signal to act).
func signalled(t *testing.T, pid int) (bool, string) {
	status, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return true, err.Error()
	}
	var state string
	for line := range strings.Lines(string(status)) {
		key, val, _ := strings.Cut(strings.TrimSpace(line), ":")
		val = strings.TrimSpace(val)
		switch key {
		case "State":
			state = val
			if strings.HasPrefix(val, "Z") || strings.HasPrefix(val, "X") {
				return true, state
			}
		case "ShdPnd", "SigPnd":
			mask, err := strconv.ParseUint(val, 16, 64)
			if err != nil {
				t.Fatalf("%s: %q", key, val)
			}
			if mask&(1<<(syscall.SIGKILL-1)) != 0 {
				return true, state + ", SIGKILL pending"
			}
		}
	}
	return false, state
}

func TestLogBufferKeepsTheTail(t *testing.T) {
	b := &LogBuffer{Max: 8}
	for _, s := range []string{"0123", "4567", "89ab"} {
		if n, err := b.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if got := b.String(); got != "456789ab" {
		t.Fatalf("kept %q, want the last 8 bytes", got)
	}
	if got := b.Tail(3); got != "9ab" {
		t.Fatalf("Tail(3) = %q", got)
	}
	if got := b.Tail(100); got != "456789ab" {
		t.Fatalf("Tail(100) = %q", got)
	}
}

func TestChildrenAndCPUTicks(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	done, err := Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); <-done }()
	if kids := Children(os.Getpid()); !slices.Contains(kids, cmd.Process.Pid) {
		t.Fatalf("Children(self) = %v, want it to include %d", kids, cmd.Process.Pid)
	}
	if kids := Children(cmd.Process.Pid); len(kids) != 0 {
		t.Fatalf("sleep has children %v", kids)
	}

	// Our own CPU time grows while we spin.
	before, err := CPUTicks(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		now, err := CPUTicks(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now < before {
			t.Fatalf("CPU ticks went back from %d to %d", before, now)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no CPU tick counted in a minute of spinning")
		}
	}
	if _, err := CPUTicks(1 << 30); err == nil {
		t.Fatal("CPUTicks of a pid that cannot exist succeeded")
	}
}

func TestWaitReady(t *testing.T) {
	running := make(chan struct{})
	calls := 0
	err := WaitReady("x", running, time.Minute, func() error {
		calls++
		if calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("WaitReady = %v after %d calls, want nil after 3", err, calls)
	}

	exited := make(chan struct{})
	close(exited)
	err = WaitReady("x", exited, time.Minute, func() error { return errors.New("refused") })
	if err == nil || !strings.Contains(err.Error(), "x exited during start-up") {
		t.Fatalf("WaitReady of an exited process = %v", err)
	}

	err = WaitReady("x", running, 0, func() error { return errors.New("refused") })
	if err == nil || !strings.Contains(err.Error(), "not ready") || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("WaitReady past its timeout = %v", err)
	}
}

// The fields are counted after the last ')': a command name with a space
// and a ')' does not shift them; CPUTimes splits what CPUTicks sums.
func TestStatFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	line := "4242 (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 731 58 0 0 20 0 9 0 123 456 789\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := statFields(path)
	if err != nil || len(f) < 13 || f[0] != "S" || f[11] != "731" || f[12] != "58" {
		t.Fatalf("statFields = %q, %v; want state S, utime 731, stime 58", f, err)
	}
	if err := os.WriteFile(path, []byte("4242 no name S 1"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := statFields(path); err == nil {
		t.Fatal("a stat line without a command name accepted")
	}
	u, s, err := CPUTimes(os.Getpid())
	if err != nil || u < 0 || s < 0 {
		t.Fatalf("CPUTimes(self) = %d, %d, %v", u, s, err)
	}
	if _, _, err := CPUTimes(1 << 30); err == nil {
		t.Fatal("CPUTimes of a pid that cannot exist succeeded")
	}
}
