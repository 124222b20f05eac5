package ollamatest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
)

// VersionsEnv names the environment variable listing the Ollama versions
// the integration tests run against, as comma-separated VERSION=PATH pairs
// ("0.9.6=/…/v0.9.6/ollama,0.17.4=/…/v0.17.4/ollama"). `make test` sets it
// from `scripts/ensure-ollama.sh --all`.
const VersionsEnv = "HEARTH_OLLAMA_BINS"

// Version is one Ollama of the test matrix.
type Version struct {
	Name string // its version number, e.g. "0.17.4"; what /api/version answers
	Bin  string // its binary
}

// Versions returns the Ollama versions to test against: those listed in
// $HEARTH_OLLAMA_BINS, or else the one binary FindBinary finds, named by the
// version it reports. A listed binary that is missing is an error, not a
// shorter list.
func Versions() ([]Version, error) {
	list := os.Getenv(VersionsEnv)
	if strings.TrimSpace(list) == "" {
		bin, err := FindBinary()
		if err != nil {
			return nil, err
		}
		name, err := BinaryVersion(bin)
		if err != nil {
			return nil, err
		}
		return []Version{{Name: name, Bin: bin}}, nil
	}
	var vs []Version
	for _, pair := range strings.Split(list, ",") {
		pair = strings.TrimSpace(pair)
		name, bin, ok := strings.Cut(pair, "=")
		if !ok || name == "" || bin == "" {
			return nil, fmt.Errorf("%s: %q is not VERSION=PATH", VersionsEnv, pair)
		}
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("%s: Ollama %s: %w (run `make ollama`)", VersionsEnv, name, err)
		}
		vs = append(vs, Version{Name: strings.TrimPrefix(name, "v"), Bin: bin})
	}
	return vs, nil
}

// ForEachVersion runs f as a subtest of t, named by the version, for each
// of Versions. It fails t if the versions cannot be determined.
//
// Tests that start their own Ollama (or hearthd with --ollama-bin) use it
// with v.Bin, or StartVersion; tests that share one server per version use
// Shared.ForEach.
func ForEachVersion(t *testing.T, f func(t *testing.T, v Version)) {
	t.Helper()
	testutil.Integration(t, "Ollama")
	vs, err := Versions()
	if err != nil {
		t.Fatalf("ollamatest: %v", err)
	}
	for _, v := range vs {
		t.Run(v.Name, func(t *testing.T) { f(t, v) })
	}
}

// BinaryVersion asks an ollama binary which version it is. Pointed at a
// port nobody listens on, `ollama --version` reports its own version
// offline. A binary built by a bare `go install` reports 0.0.0.
func BinaryVersion(bin string) (string, error) {
	home, err := os.MkdirTemp("", "ollamatest-version-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(home)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "OLLAMA_HOST=127.0.0.1:1"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w: %s", bin, err, out)
	}
	const prefix = "Warning: client version is "
	for line := range strings.Lines(string(out)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			return v, nil
		}
	}
	return "", errors.New(bin + " --version: no version in its output: " + string(out))
}
