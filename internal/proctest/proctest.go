// Package proctest holds what the helpers that run real servers in tests
// (internal/ollamatest, internal/pgtest, internal/nginxtest,
// internal/sshdtest, metrics/promtest, the e2e tests) share: starting
// a child that cannot outlive the test binary, keeping its output, waiting
// until it is ready and stopping it. (A free loopback port comes from
// internal/testutil.)
package proctest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Start starts cmd and returns a channel closed once it has exited (and
// been waited for).
//
// A child with Pdeathsig set is signalled when the thread that started it
// exits, not the process: Go may end the thread of a goroutine that exits
// while locked to it, taking the child along mid-test. So cmd is started,
// and waited for, from a goroutine pinned to its own thread for the child's
// whole life.
func Start(cmd *exec.Cmd) (done <-chan struct{}, err error) {
	exited := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		defer close(exited)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return exited, nil
}

// WaitReady polls ready until it returns nil, the process whose exit
// closes done exits, or timeout passes; then the error says which, with
// ready's last error. what names the process ("nginx on 127.0.0.1:80").
func WaitReady(what string, done <-chan struct{}, timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited during start-up", what)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v: %w", what, timeout, err)
		}
	}
}

// StopGroup ends the process group pgid whose leader's exit closes done:
// SIGTERM, then SIGKILL for whatever is left after grace (children may
// outlive a leader that stopped), and waits for the leader.
func StopGroup(pgid int, done <-chan struct{}, grace time.Duration) {
	_ = syscall.Kill(-pgid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	<-done
}

// LogBuffer keeps the last Max bytes written to it (1 MiB if Max is 0). It
// is safe for concurrent use.
type LogBuffer struct {
	Max int

	mu  sync.Mutex
	buf []byte
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	limit := b.Max
	if limit <= 0 {
		limit = 1 << 20
	}
	if over := len(b.buf) - limit; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

// String returns everything kept.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// Tail returns the last n bytes kept.
func (b *LogBuffer) Tail(n int) string {
	s := b.String()
	return s[max(0, len(s)-n):]
}

// Children returns the processes whose parent is pid, from /proc.
func Children(pid int) []int {
	var kids []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		f, err := statFields(path)
		if err != nil || len(f) < 2 || f[1] != strconv.Itoa(pid) {
			continue // exited meanwhile, or another parent's
		}
		if kid, err := strconv.Atoi(filepath.Base(filepath.Dir(path))); err == nil {
			kids = append(kids, kid)
		}
	}
	return kids
}

// CPUTicks returns the CPU time (user + system, in clock ticks) process pid
// has used so far.
func CPUTicks(pid int) (int64, error) {
	utime, stime, err := CPUTimes(pid)
	return utime + stime, err
}

// ReapedCPUTicks is the CPU time (user and system, in clock ticks) of the
// children process pid has waited for: what a child used stays counted
// once it exits (a PostgreSQL backend that ends, in the postmaster's).
func ReapedCPUTicks(pid int) (int64, error) {
	f, err := statFields("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	if len(f) < 15 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	cutime, err1 := strconv.ParseInt(f[13], 10, 64)
	cstime, err2 := strconv.ParseInt(f[14], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return cutime + cstime, nil
}

// CPUTimes returns the user and the system CPU time (utime and stime, in
// clock ticks) process pid has used so far.
func CPUTimes(pid int) (utime, stime int64, err error) {
	f, err := statFields("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return utime, stime, nil
}

// statFields returns the fields of a /proc/PID/stat file after "(comm)"
// (which may hold spaces): state, ppid, … utime is [11], stime [12].
func statFields(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	j := bytes.LastIndexByte(data, ')')
	if j < 0 {
		return nil, fmt.Errorf("%s: no command name", path)
	}
	return strings.Fields(string(data[j+1:])), nil
}
