package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/hearthd/hearth/internal/proctest"
)

// userHZ is the unit of the CPU times in /proc/PID/stat. The kernel fixes it
// at 100 for user space whatever CONFIG_HZ is.
const UserHZ = 100

// ProcSample is a process's CPU time and memory at one moment.
type ProcSample struct {
	CPU time.Duration // utime + stime
	// User and Sys are utime and stime apart: a proxy's system time is
	// mostly the socket work any proxy does, its user time its own code.
	User  time.Duration
	Sys   time.Duration
	RSS   int64 // VmRSS, bytes
	HWM   int64 // VmHWM (peak RSS), bytes
	Taken time.Time
}

// ReadProc samples process pid from /proc.
func ReadProc(pid int) (ProcSample, error) {
	s := ProcSample{Taken: time.Now()}
	utime, stime, err := proctest.CPUTimes(pid)
	if err != nil {
		return s, err
	}
	s.User = time.Duration(utime) * time.Second / UserHZ
	s.Sys = time.Duration(stime) * time.Second / UserHZ
	s.CPU = s.User + s.Sys
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status: %w", err)
	}
	for _, line := range bytes.Split(status, []byte("\n")) {
		key, val, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		var dst *int64
		switch string(key) {
		case "VmRSS":
			dst = &s.RSS
		case "VmHWM":
			dst = &s.HWM
		default:
			continue
		}
		f := bytes.Fields(val) // "12345 kB"
		if len(f) == 0 {
			continue
		}
		kb, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			return s, fmt.Errorf("parse /proc/%d/status %s: %w", pid, key, err)
		}
		*dst = kb << 10
	}
	return s, nil
}

// SelfCPU is this process's CPU time (user + system), at microsecond
// resolution.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// RaiseNoFile lifts this process's open-file limit (soft and hard) to at
// least n, so ten thousand streams fit; child processes inherit it. Raising
// the hard limit needs CAP_SYS_RESOURCE; without it the soft limit goes as
// high as the hard one allows.
func RaiseNoFile(n uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, fmt.Errorf("getrlimit: %w", err)
	}
	if lim.Cur >= n {
		return lim.Cur, nil
	}
	want := syscall.Rlimit{Cur: n, Max: max(n, lim.Max)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		want = syscall.Rlimit{Cur: lim.Max, Max: lim.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err2 != nil {
			return lim.Cur, fmt.Errorf("setrlimit: %w", err2)
		}
		return lim.Max, fmt.Errorf("raise open-file limit to %d: %w", n, err)
	}
	return n, nil
}
