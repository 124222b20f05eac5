package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
	"github.com/hearthd/hearth/systemd"
)

// hearthd with a supervised `ollama serve` (the real binary and the tiny
// model): ready once the model is created and loaded, answers a chat, and
// when stopped takes the runtime down with it, leaving no goroutine
// behind.
func TestRunSupervisedOllama(t *testing.T) {
	ollamatest.ForEachVersion(t, func(t *testing.T, v ollamatest.Version) { testRunSupervisedOllama(t, v.Bin) })
}

func testRunSupervisedOllama(t *testing.T, bin string) {
	noLeaks(t)
	dir := t.TempDir()
	gguf, tmpl := filepath.Join(dir, "tiny.gguf"), filepath.Join(dir, "tiny.template")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tmpl, []byte(tinymodel.Template), 0o600); err != nil {
		t.Fatal(err)
	}
	ollamaAddr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}

	cfg := Defaults()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", ""
	cfg.Model, cfg.ModelGGUF, cfg.ModelTemplate = "daemon-tiny", gguf, tmpl
	cfg.ModelParams = map[string]any{"num_predict": 4, "num_thread": 1}
	cfg.OllamaStart, cfg.OllamaBin, cfg.OllamaURL = true, bin, "http://"+ollamaAddr
	cfg.OllamaModelsDir = filepath.Join(dir, "models")

	notify := &systemd.Fake{}
	built := make(chan *node, 1)
	opts := options{extra: []func(*node) component{func(nd *node) component {
		built <- nd
		return component{name: "test probe", phase: phaseBack, run: func(ctx context.Context) error { <-ctx.Done(); return nil }}
	}}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var logs testutil.SyncBuffer
	// What hearthd logged says why, should the test fail or hang (the
	// waits below end with a failure rather than at the binary's timeout).
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("hearthd's log:\n%s", logs.String())
		}
	})
	go func() { done <- runNode(ctx, cfg, "test", slog.New(slog.NewTextHandler(&logs, nil)), notify, opts) }()
	nd := <-built
	readyCtx, readyCancel := context.WithTimeout(t.Context(), hangGuard)
	defer readyCancel()
	ready := make(chan error, 1)
	go func() { ready <- notify.WaitFor(readyCtx, "READY=1") }()
	select {
	case err := <-ready:
		if err != nil {
			t.Fatalf("READY=1: %v (sent %q)", err, notify.Messages())
		}
	case err := <-done:
		t.Fatalf("runNode returned before READY=1: %v", err)
	}
	client := &http.Client{Timeout: hangGuard}
	defer client.CloseIdleConnections()

	secret, _, err := nd.keys.Create("test")
	if err != nil {
		t.Fatal(err)
	}
	chat := func(when string) {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+nd.ln.Addr().String()+"/api/v1/chat/completions",
			strings.NewReader(`{"model":"daemon-tiny","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("chat %s: %v", when, err)
		}
		var out struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || out.Usage.CompletionTokens != 4 {
			t.Fatalf("chat %s: %d %+v %v", when, resp.StatusCode, out, err)
		}
	}
	chat("once ready")

	// Found wedged (as the backend finds it: ollama.Config.OnWedged), the
	// supervised `ollama serve` is replaced, the model loaded again, and
	// the deployment serves again.
	if !nd.runtimeWedged("test: wedged") {
		t.Fatal("runtimeWedged = false with --ollama-start")
	}
	testutil.WaitFor(t, time.Minute, "the model loaded again after the restart", func() bool {
		st, _ := nd.restarts.state()
		return strings.Count(logs.String(), `msg="model loaded" model=daemon-tiny seconds=`) >= 2 && !st
	})
	for _, want := range []string{`msg="model runtime is wedged; restarting it" reason="test: wedged"`,
		`msg="restarting ollama serve"`, `msg="model runtime restarted and the model loaded again"`} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("log lacks %s:\n%s", want, logs.String())
		}
	}
	if n := strings.Count(logs.String(), `msg="ollama serve started"`); n != 2 {
		t.Fatalf("ollama serve started %d times, want 2", n)
	}
	chat("after the restart")
	client.CloseIdleConnections()

	cancel()
	select {
	case err = <-done:
	case <-time.After(hangGuard):
		t.Fatal("runNode did not return after its context ended")
	}
	if err != nil {
		t.Fatalf("runNode: %v", err)
	}
	// The supervised runtime is gone with hearthd.
	if c, err := net.Dial("tcp", ollamaAddr); err == nil {
		c.Close()
		t.Fatal(fmt.Sprintf("ollama still listens on %s after hearthd stopped", ollamaAddr))
	}
}

// A supervised runtime that cannot run at all (here its port is another
// program's) stops the node with the reason, rather than leaving it up
// and never ready; systemd then restarts hearthd.
func TestNodeStopsWithoutItsRuntime(t *testing.T) {
	noLeaks(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cfg := Defaults()
	cfg.StateDir = filepath.Join(dir, "state")
	cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", ""
	cfg.OllamaStart, cfg.OllamaBin, cfg.OllamaURL = true, "true", "http://"+taken.Addr().String()
	cfg.OllamaModelsDir = filepath.Join(dir, "models")
	notify := &systemd.Fake{}
	done := make(chan error, 1)
	go func() { done <- runNode(t.Context(), cfg, "test", slog.New(slog.DiscardHandler), notify, options{}) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "in use by another program") {
			t.Fatalf("runNode = %v, want the runtime's port named in use", err)
		}
	case <-time.After(hangGuard):
		t.Fatalf("the node stayed up without its runtime (sent %q)", notify.Messages())
	}
	if notify.Count("READY=1") != 0 {
		t.Fatal("READY=1 without a runtime")
	}
}
