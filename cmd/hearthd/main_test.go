package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestTakeFlags(t *testing.T) {
	taken, rest, err := takeFlags([]string{"create", "--name", "n", "-state-dir", "/s", "--config=/c.toml", "--admin-socket", "/a.sock", "x"},
		"config", "state-dir", "admin-socket")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--state-dir=/s", "--config=/c.toml", "--admin-socket=/a.sock"}; !reflect.DeepEqual(taken, want) {
		t.Errorf("taken %q", taken)
	}
	if want := []string{"create", "--name", "n", "x"}; !reflect.DeepEqual(rest, want) {
		t.Errorf("rest %q", rest)
	}
	if _, _, err := takeFlags([]string{"list", "--state-dir"}, "state-dir"); err == nil {
		t.Error("a flag without its value was taken")
	}
}

// TestKeysUseConfig: hearthd keys finds the state where the configuration
// file, or else the environment, puts it, like hearthd serve does.
func TestKeysUseConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "hearthd.toml")
	if err := os.WriteFile(cfg, []byte("state_dir = \""+dir+"\"\nmodel = \"m\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), []string{"keys", "create", "--config", cfg, "--name", "ops"}, &out, io.Discard); err != nil {
		t.Fatalf("keys create: %v", err)
	}
	if !strings.Contains(out.String(), "hearth_live_") {
		t.Fatalf("no key printed: %q", out.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "db")); err != nil {
		t.Fatalf("state not in the configured directory: %v", err)
	}
	t.Setenv("HEARTH_STATE_DIR", dir)
	out.Reset()
	if err := run(context.Background(), []string{"keys", "list"}, &out, io.Discard); err != nil || !strings.Contains(out.String(), "ops") {
		t.Fatalf("keys list: %v, %q", err, out.String())
	}
	// The file is read strictly here too.
	if err := os.WriteFile(cfg, []byte("state_dri = \"/x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"keys", "list", "--config", cfg}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "did you mean state_dir?") {
		t.Fatalf("bad file: %v", err)
	}
}

func TestServeConfigErrors(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "hearthd.toml")
	if err := os.WriteFile(cfg, []byte("max_concurrent = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--config", cfg}, "config max-concurrent: must be at least 1"},
		{[]string{"serve", "--config", cfg, "--max-concurrent", "2", "--log-level", "loud"}, "config log-level:"},
		{[]string{"serve", "--config", cfg, "extra"}, `unexpected argument "extra"`},
	} {
		err := run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
