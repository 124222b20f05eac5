package ollamatest

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
)

// RunnerCPUTicks returns the CPU time, in clock ticks, used so far by the
// model runners (`ollama runner` children) of this instance, and how many
// there are. A runner that generates burns CPU steadily; one that stopped
// burns none, so tests use the difference to prove a generation ended.
func (i *Instance) RunnerCPUTicks() (ticks int64, runners int) {
	return RunnerCPUTicks(i.PID())
}

// RunnerCPUTicks is Instance.RunnerCPUTicks for the runners of any
// `ollama serve` process, by its pid.
func RunnerCPUTicks(parent int) (ticks int64, runners int) {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		data, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		// Fields after "(comm)": state ppid ... utime(14) stime(15).
		j := bytes.LastIndexByte(data, ')')
		if j < 0 {
			continue
		}
		f := bytes.Fields(data[j+1:])
		if len(f) < 13 {
			continue
		}
		if ppid, _ := strconv.Atoi(string(f[1])); ppid != parent {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if !bytes.Contains(cmdline, []byte("runner")) {
			continue
		}
		utime, _ := strconv.ParseInt(string(f[11]), 10, 64)
		stime, _ := strconv.ParseInt(string(f[12]), 10, 64)
		ticks += utime + stime
		runners++
	}
	return ticks, runners
}
