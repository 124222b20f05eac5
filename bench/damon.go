package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// damonRoot is where the kernel's DAMON admin interface lives.
const damonRoot = "/sys/kernel/mm/damon/admin/kdamonds"

// kernelMonitor describes the kernel's DAMON monitors that are on under
// root, or "" if none is. A DAMON monitor of physical memory takes a core
// for tens of milliseconds at each sampling (kdamond, a kernel thread):
// on a two-core machine that is a periodic stall of whatever runs, which
// shows in a benchmark's tail latency and belongs in its notes.
func kernelMonitor(root string) string {
	dirs, _ := filepath.Glob(filepath.Join(root, "[0-9]*"))
	var out []string
	for _, d := range dirs {
		if readTrim(filepath.Join(d, "state")) != "on" {
			continue
		}
		ctxs, _ := filepath.Glob(filepath.Join(d, "contexts", "[0-9]*"))
		for _, c := range ctxs {
			desc := "DAMON " + readTrim(filepath.Join(c, "operations"))
			iv := filepath.Join(c, "monitoring_attrs", "intervals")
			if us, err := strconv.Atoi(readTrim(filepath.Join(iv, "sample_us"))); err == nil {
				desc += ", sampling every " + (time.Duration(us) * time.Microsecond).String()
			}
			if us, err := strconv.Atoi(readTrim(filepath.Join(iv, "aggr_us"))); err == nil {
				desc += ", aggregating every " + (time.Duration(us) * time.Microsecond).String()
			}
			schemes, _ := filepath.Glob(filepath.Join(c, "schemes", "[0-9]*"))
			var actions []string
			for _, s := range schemes {
				if a := readTrim(filepath.Join(s, "action")); a != "" {
					actions = append(actions, a)
				}
			}
			if len(actions) > 0 {
				slices.Sort(actions)
				desc += ", schemes: " + strings.Join(actions, ", ")
			}
			out = append(out, fmt.Sprintf("%s (kdamond %s)", desc, filepath.Base(d)))
		}
	}
	return strings.Join(out, "; ")
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
