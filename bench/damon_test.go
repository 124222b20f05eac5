package bench

import (
	"os"
	"path/filepath"
	"testing"
)

func TestKernelMonitor(t *testing.T) {
	root := t.TempDir()
	write := func(rel, val string) {
		t.Helper()
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(val+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got := kernelMonitor(root); got != "" {
		t.Fatalf("no monitor: %q", got)
	}
	write("0/state", "off")
	write("0/contexts/0/operations", "vaddr")
	if got := kernelMonitor(root); got != "" {
		t.Fatalf("monitor off: %q", got)
	}
	write("1/state", "on")
	write("1/contexts/0/operations", "paddr")
	write("1/contexts/0/monitoring_attrs/intervals/sample_us", "500000")
	write("1/contexts/0/monitoring_attrs/intervals/aggr_us", "5000000")
	write("1/contexts/0/schemes/0/action", "pageout")
	want := "DAMON paddr, sampling every 500ms, aggregating every 5s, schemes: pageout (kdamond 1)"
	if got := kernelMonitor(root); got != want {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}
