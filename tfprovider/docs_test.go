package tfprovider

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// docs/terraform is what `make terraform-docs` (tfplugindocs over the
// provider's schema, examples and templates) generates now, file for
// file: a schema, example or template changed without regenerating fails.
func TestDocsInStep(t *testing.T) {
	useTerraform(t) // the script builds nothing when TF_ACC_TERRAFORM_PATH is set
	out := t.TempDir()
	cmd := exec.Command("scripts/terraform-docs.sh", out)
	cmd.Dir = ".."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/terraform-docs.sh: %v\n%s", err, b)
	}
	committed := filepath.Join("..", "docs", "terraform")
	files := func(root string) map[string][]byte {
		m := map[string][]byte{}
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			rel, _ := filepath.Rel(root, p)
			m[rel] = b
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	want, got := files(out), files(committed)
	if len(want) < 8 {
		t.Fatalf("tfplugindocs wrote %d files", len(want))
	}
	for name, b := range want {
		if g, ok := got[name]; !ok || !bytes.Equal(g, b) {
			t.Errorf("docs/terraform/%s is not what make terraform-docs generates: run it", name)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/terraform/%s is not generated any more: run make terraform-docs", name)
		}
	}
}
