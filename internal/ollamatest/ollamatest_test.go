package ollamatest

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
)

func TestStartServesTinyModel(t *testing.T) {
	ForEachVersion(t, testStartServesTinyModel)
}

func testStartServesTinyModel(t *testing.T, v Version) {
	inst := StartVersion(t, v)
	if inst.Version != v.Name {
		t.Fatalf("instance of %s answers version %q, want %q", v.Bin, inst.Version, v.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := inst.Client()
	if _, err := c.Show(ctx, &api.ShowRequest{Model: inst.Model}); err != nil {
		t.Fatalf("show %s: %v", inst.Model, err)
	}
	stream := false
	var got api.GenerateResponse
	err := c.Generate(ctx, &api.GenerateRequest{
		Model: inst.Model, Prompt: "hello", Stream: &stream,
		Options: map[string]any{"num_predict": 8},
	}, func(r api.GenerateResponse) error { got = r; return nil })
	if err != nil {
		t.Fatalf("generate: %v", err)
	}
	if got.EvalCount != 8 || strings.TrimSpace(got.Response) == "" {
		t.Fatalf("generate: eval_count %d, response %q; want 8 tokens of text", got.EvalCount, got.Response)
	}

	pid := inst.PID()
	dir := inst.dir
	inst.Close()
	if err := syscall.Kill(-pid, 0); err == nil { // the whole group, runners included
		t.Errorf("ollama process group %d still running after Close", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("temp dir %s not removed: %v", dir, err)
	}
}
