package e2e

import (
	"os"
	"regexp"
	"runtime"
	"strconv"
	"testing"
	"time"
)

var procsRe = regexp.MustCompile(`msg=processors gomaxprocs=(\d+)`)

// hearthd runs its Go code on a quarter of the CPUs unless max_procs or
// the GOMAXPROCS variable says otherwise; the runtime reports what it got.
func TestHearthdProcessors(t *testing.T) {
	// No runtime is needed to start: an address nothing listens on.
	base := []string{"--ollama-url", "http://127.0.0.1:1"}
	def := max(1, runtime.GOMAXPROCS(0)/4)
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		def, _ = strconv.Atoi(v)
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want int
	}{
		{"default", nil, nil, def},
		{"max_procs", []string{"--max-procs", "2"}, []string{"GOMAXPROCS=3"}, 2},
		{"GOMAXPROCS", nil, []string{"GOMAXPROCS=3"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHearthd(t, hearthdOpts{args: append(base, tc.args...), env: tc.env})
			got := h.waitLog(procsRe, 0, 10*time.Second)[1]
			if got != strconv.Itoa(tc.want) {
				t.Fatalf("gomaxprocs=%s, want %d", got, tc.want)
			}
		})
	}
}
