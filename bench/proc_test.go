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
	// system call); the fields are checked in TestParseStatTicks.
	if p.CPU <= 0 || p.User < 0 || p.Sys < 0 || p.User+p.Sys != p.CPU {
		t.Fatalf("sample %+v: want CPU time = user + sys", p)
	}
}

func TestParseStatTicks(t *testing.T) {
	// A command name with a space and a ')' must not shift the fields.
	line := []byte("4242 (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 731 58 0 0 20 0 9 0 123 456 789\n")
	u, s, err := parseStatTicks("stat", line)
	if err != nil || u != 731 || s != 58 {
		t.Fatalf("parseStatTicks = %d, %d, %v; want 731, 58", u, s, err)
	}
	if _, _, err := parseStatTicks("stat", []byte("4242 (x) S 1 2")); err == nil {
		t.Fatal("short stat line accepted")
	}
}
