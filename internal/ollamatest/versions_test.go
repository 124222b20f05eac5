package ollamatest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestVersionsFromEnv(t *testing.T) {
	dir := t.TempDir()
	old, cur := filepath.Join(dir, "old"), filepath.Join(dir, "cur")
	for _, p := range []string{old, cur} {
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(VersionsEnv, "0.9.6="+old+", v0.17.4="+cur)
	vs, err := Versions()
	if err != nil {
		t.Fatal(err)
	}
	want := []Version{{"0.9.6", old}, {"0.17.4", cur}}
	if len(vs) != 2 || vs[0] != want[0] || vs[1] != want[1] {
		t.Fatalf("Versions() = %+v, want %+v", vs, want)
	}

	// A listed binary that is missing fails rather than shrinking the
	// matrix, and so does a malformed entry.
	for list, wantErr := range map[string]string{
		"0.9.6=" + old + ",0.17.4=" + filepath.Join(dir, "gone"): "Ollama 0.17.4",
		"0.9.6=" + old + "," + cur:                               "not VERSION=PATH",
		"=" + old:                                                "not VERSION=PATH",
	} {
		t.Setenv(VersionsEnv, list)
		if vs, err := Versions(); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("Versions() with %q = %+v, %v; want an error mentioning %q", list, vs, err, wantErr)
		}
	}
}

// TestMatrixBinariesAnswerTheirVersion guards the build under make test: a
// binary built without its version stamped in says 0.0.0, not the version
// it is listed as in $HEARTH_OLLAMA_BINS.
func TestMatrixBinariesAnswerTheirVersion(t *testing.T) {
	ForEachVersion(t, func(t *testing.T, v Version) {
		got, err := BinaryVersion(v.Bin)
		if err != nil {
			t.Fatal(err)
		}
		if got != v.Name {
			t.Fatalf("%s --version says %s, want %s", v.Bin, got, v.Name)
		}
	})
}
