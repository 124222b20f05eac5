package ollamatest

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/proctest"
)

// A runner that stops answering is restarted before the next test gets the
// shared instance, and its stacks land in the log.
func TestStuckRunnerIsRestarted(t *testing.T) {
	inst := Start(t)
	if err := inst.answers(time.Minute); err != nil {
		t.Fatal(err)
	}
	var runners []int
	for _, pid := range proctest.Children(inst.PID()) {
		runners = append(runners, pid)
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
	}
	if len(runners) == 0 {
		t.Fatal("no runner after a generation")
	}
	if err := inst.answers(time.Second); err == nil {
		t.Fatal("a stopped runner answered")
	}
	checkAnswers(t, inst, time.Second)
	if err := inst.answers(time.Minute); err != nil {
		t.Fatalf("after the restart: %v", err)
	}
	if !strings.Contains(inst.Logs(), "goroutine ") {
		t.Fatalf("no runner stacks in the log:\n%s", inst.LogTail(4<<10))
	}
}
