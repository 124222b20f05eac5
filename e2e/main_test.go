// Package e2e runs hearth's binaries as real processes: hearthd in front of
// a real Ollama serving the tiny model, driven by the official OpenAI Go SDK,
// and the control plane with nodes that enroll and report.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// env is what every test in this binary shares: the binaries built once
// and one Ollama. TestMain owns it; tests only read it.
type env struct {
	bin    string // directory holding the built binaries
	ollama ollamatest.Shared
}

var shared env

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here runs real processes: the unit tier (-short) has none.
		fmt.Println("e2e: integration tests only; make test runs them")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "hearth-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	shared.bin = dir
	code := m.Run()
	shared.ollama.Close()
	os.RemoveAll(dir)
	os.Exit(code)
}

// binary builds ./cmd/<name> once per test binary and returns its path.
func binary(t testing.TB, name string) string {
	t.Helper()
	path := filepath.Join(shared.bin, name)
	if _, err := os.Stat(path); err == nil {
		return path
	}
	cmd := exec.Command("go", "build", "-o", path, "./cmd/"+name)
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return path
}
