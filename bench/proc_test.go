package bench

import (
	"os"
	"testing"
	"time"
)

func TestReadProcSelf(t *testing.T) {
	for SelfCPU() < 30*time.Millisecond { // at least a few clock ticks to see
	}
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.CPU <= 0 || p.RSS <= 0 || p.HWM < p.RSS {
		t.Fatalf("sample %+v: want CPU time, RSS and a peak at least the RSS", p)
	}
}

func TestReadProcSplitsUserAndSys(t *testing.T) {
	for SelfCPU() < 30*time.Millisecond {
	}
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Which of the two the spin above lands in varies (getrusage is a
	// system call); the fields are checked in proctest's TestStatFields.
	if p.CPU <= 0 || p.User < 0 || p.Sys < 0 || p.User+p.Sys != p.CPU {
		t.Fatalf("sample %+v: want CPU time = user + sys", p)
	}
}
