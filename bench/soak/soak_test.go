package soak

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The recoveries are read from hearthd's own log line, the one the
// daemon writes when a restart is over.
func TestSoakReadsRecoveries(t *testing.T) {
	log := filepath.Join(t.TempDir(), "hearthd.log")
	lines := `time=2026-12-02T16:12:01.931Z level=INFO msg="model loaded" model=soak-tiny took=589.265089ms
time=2026-12-02T16:13:01.931Z level=ERROR msg="model runtime is wedged; restarting it" reason="nothing came back"
time=2026-12-02T16:13:06.100Z level=INFO msg="model runtime restarted and the model loaded again" took=4.169s
time=2026-12-02T16:20:00.000Z level=INFO msg="model runtime restarted and the model loaded again" took=12.5s
`
	if err := os.WriteFile(log, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := recoveries(log)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] != 4169*time.Millisecond || got[1] != 12500*time.Millisecond {
		t.Fatalf("recoveries %v", got)
	}
}

// Each target is judged on its own: a run that misses one says which.
func TestSoakTargets(t *testing.T) {
	ok := SoakResult{FailedShare: 0.005, MaxWait: 20 * time.Second, Restarts: map[string]int{"wedged": 1},
		Recoveries: []time.Duration{6 * time.Second},
		Start:      SoakSample{RSS: 100 << 20, Goroutines: 40, Descriptors: 30},
		End:        SoakSample{RSS: 105 << 20, Goroutines: 42, Descriptors: 30}}
	for _, tg := range ok.Met() {
		if !tg.Met {
			t.Errorf("%s not met by %s", tg.Target, tg.Value)
		}
	}
	bad := ok
	bad.FailedShare, bad.Recoveries, bad.End.Goroutines = 0.02, []time.Duration{16 * time.Second}, 60
	var missed []string
	for _, tg := range bad.Met() {
		if !tg.Met {
			missed = append(missed, tg.Target)
		}
	}
	if want := "≥ 99 % of the requests not abandoned succeed; every wedge recovered within 15 s; goroutines within 10 % of their start"; strings.Join(missed, "; ") != want {
		t.Fatalf("missed %q, want %q", missed, want)
	}
	// A wedge restart without its recovery logged is a miss too.
	bad = ok
	bad.Recoveries = nil
	if bad.Met()[2].Met {
		t.Fatal("a restart without a recovery met the target")
	}
	if md := ok.Markdown(); !strings.Contains(md, "| every wedge recovered within 15 s | 1 recover(ies), slowest 6s | yes |") {
		t.Fatalf("markdown:\n%s", md)
	}
}
