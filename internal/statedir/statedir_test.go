package statedir

import (
	"os"
	"path/filepath"
	"testing"
)

func TestEnsure(t *testing.T) {
	base := t.TempDir()
	fresh := filepath.Join(base, "a", "state")
	if tight, err := Ensure(fresh); err != nil || tight {
		t.Fatalf("fresh: %v %v", tight, err)
	}
	wide := filepath.Join(base, "wide")
	if err := os.Mkdir(wide, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(wide, 0o755); err != nil { // past any umask
		t.Fatal(err)
	}
	if tight, err := Ensure(wide); err != nil || !tight {
		t.Fatalf("0755: %v %v", tight, err)
	}
	for _, d := range []string{fresh, wide} {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm() != 0o700 {
			t.Fatalf("%s: %v %v, want 0700", d, fi.Mode().Perm(), err)
		}
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Ensure(file); err == nil {
		t.Fatal("a regular file accepted as the state dir")
	}
}
