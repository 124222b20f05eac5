package ollamatest

import (
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/proctest"
)

// stopRunners stops (SIGSTOP) the runners of inst, which must have one:
// the instance no longer answers, as a stuck one.
func stopRunners(t *testing.T, inst *Instance) {
	t.Helper()
	if err := inst.answers(time.Minute); err != nil {
		t.Fatal(err)
	}
	runners := proctest.Children(inst.PID())
	if len(runners) == 0 {
		t.Fatal("no runner after a generation")
	}
	for _, pid := range runners {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	if err := inst.answers(time.Second); err == nil {
		t.Fatal("a stopped runner answered")
	}
}

// An instance that stops answering is restarted, on the same address, and
// the stacks of the server and its runners land in the log.
func TestStuckInstanceIsRestarted(t *testing.T) {
	inst := Start(t)
	url, pid := inst.URL, inst.PID()
	stopRunners(t, inst)
	stuck, err := inst.ensureAnswers(time.Second)
	if stuck == nil || err != nil {
		t.Fatalf("ensureAnswers of a stuck instance = %v, %v; want it found stuck and restarted", stuck, err)
	}
	if inst.URL != url || inst.PID() == pid {
		t.Fatalf("after the restart: %s, pid %d; before: %s, pid %d", inst.URL, inst.PID(), url, pid)
	}
	if err := inst.answers(time.Minute); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if !strings.Contains(inst.stacks, "goroutine ") || !strings.Contains(inst.stacks, "ollama/server.") ||
		!strings.Contains(inst.Logs(), inst.stacks) {
		t.Fatalf("no stacks of the server in the log:\n%s", inst.stacks)
	}
	if stuck, err := inst.ensureAnswers(time.Minute); stuck != nil || err != nil {
		t.Fatalf("ensureAnswers of a working instance = %v, %v", stuck, err)
	}
}

// A shared instance that cannot be brought back fails the test that finds
// it so, and every later one at once with the same reason, rather than
// each waiting for it again.
func TestBrokenSharedInstanceFailsFast(t *testing.T) {
	bin, err := FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	var s Shared
	defer s.Close()
	v := Version{Bin: bin}
	inst, stuck, err := s.get(v, time.Minute)
	if err != nil || stuck != nil {
		t.Fatalf("first get: %v, %v", stuck, err)
	}
	stopRunners(t, inst)
	inst.Bin = filepath.Join(t.TempDir(), "gone") // no restart
	_, stuck, err = s.get(v, time.Second)
	if stuck == nil || err == nil || !strings.Contains(err.Error(), "could not be restarted") {
		t.Fatalf("get of a stuck instance that cannot restart = %v, %v", stuck, err)
	}
	first := err
	_, stuck, err = s.get(v, time.Second)
	if stuck != nil || err == nil || !strings.Contains(err.Error(), "not tried again") || errors.Unwrap(err) != errors.Unwrap(first) {
		t.Fatalf("later get = %v, %v; want the first failure (%v) at once", stuck, err, first)
	}
}
