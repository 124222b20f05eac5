package ollama

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/runtime"
	"github.com/hearthd/hearth/runtime/tinymodel"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestSupervisorRestartsAndStops(t *testing.T) {
	bin, err := ollamatest.FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var exits atomic.Int32
	sup := &Supervisor{
		Bin:         bin,
		Addr:        freeAddr(t),
		ModelsDir:   filepath.Join(dir, "models"),
		NumParallel: 2,
		Logger:      testLogger(t),
		OnExit:      func(error) { exits.Add(1) },
		MinBackoff:  50 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- sup.Run(ctx) }()

	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := sup.WaitReachable(wctx); err != nil {
		t.Fatal(err)
	}
	gguf := filepath.Join(dir, "tiny.gguf")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{}); err != nil {
		t.Fatal(err)
	}
	b, err := New(Config{BaseURL: sup.URL(), Model: "hearth-tiny", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	src := ModelSource{GGUFPath: gguf, Template: tinymodel.Template, Parameters: tinymodel.Parameters()}
	if err := b.EnsureModel(wctx, src); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Warm(wctx); err != nil {
		t.Fatal(err)
	}
	if _, final := generate(t, b, runtime.Options{MaxTokens: ptr(5)}); final.CompletionTokens != 5 {
		t.Fatalf("before the kill: %+v", final)
	}

	first := sup.PID()
	if first == 0 {
		t.Fatal("no PID while running")
	}
	_, runners := runnerTicks(t, first)
	if runners == 0 {
		t.Fatal("no runner after warm-up")
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server to be restarted", 30*time.Second, func() bool {
		p := sup.PID()
		return p != 0 && p != first
	})
	if exits.Load() != 1 {
		t.Fatalf("OnExit called %d times, want 1", exits.Load())
	}
	// The killed server's runner went with it (once its new parent has
	// reaped it).
	waitFor(t, "the killed server's runner to go", 10*time.Second, func() bool {
		return syscall.Kill(-first, 0) != nil
	})
	if err := sup.WaitReachable(wctx); err != nil {
		t.Fatal(err)
	}
	// The model is on disk still; it only needs loading again.
	if err := b.Ready(wctx); !errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("Ready after a restart before warm-up = %v", err)
	}
	if err := b.EnsureModel(wctx, ModelSource{}); err != nil {
		t.Fatalf("model lost across restart: %v", err)
	}
	if _, err := b.Warm(wctx); err != nil {
		t.Fatal(err)
	}
	if _, final := generate(t, b, runtime.Options{MaxTokens: ptr(5)}); final.CompletionTokens != 5 {
		t.Fatalf("after the restart: %+v", final)
	}

	second := sup.PID()
	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	waitFor(t, "the process group to go after Run returned", 10*time.Second, func() bool {
		return syscall.Kill(-second, 0) != nil
	})
	if sup.PID() != 0 {
		t.Fatal("PID set after Run returned")
	}
}

func TestSupervisorBacksOff(t *testing.T) {
	// A binary that exits at once: the supervisor restarts it with
	// growing pauses, and Run returns when told to stop.
	var starts []time.Time
	sup := &Supervisor{
		Bin:        "false", // looked up in PATH
		Addr:       "127.0.0.1:1",
		ModelsDir:  t.TempDir(),
		MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 160 * time.Millisecond,
		OnExit:     func(error) { starts = append(starts, time.Now()) },
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := sup.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if len(starts) < 5 {
		t.Fatalf("only %d restarts", len(starts))
	}
	// Pauses double: 20, 40, 80, then cap at 160ms.
	for i, want := range []time.Duration{20, 40, 80, 160, 160} {
		if i+1 >= len(starts) {
			break
		}
		got := starts[i+1].Sub(starts[i])
		if got < want*time.Millisecond {
			t.Errorf("pause %d = %v, want at least %v", i, got, want*time.Millisecond)
		}
	}
	if got := starts[len(starts)-1].Sub(starts[len(starts)-2]); got > 2*time.Second {
		t.Errorf("last pause %v; the cap is 160ms", got)
	}
}

func TestBackoff(t *testing.T) {
	b := backoff{min: time.Second, max: 5 * time.Second, stable: time.Minute}
	var got []time.Duration
	for _, up := range []time.Duration{0, 0, 0, 0, 0, 2 * time.Minute, 0} {
		got = append(got, b.next(up))
	}
	want := []time.Duration{1, 2, 4, 5, 5, 1, 2}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("pauses %v, want %v (seconds)", got, want)
		}
	}
}

func TestSupervisorValidates(t *testing.T) {
	if err := (&Supervisor{}).Run(context.Background()); err == nil {
		t.Error("empty supervisor ran")
	}
	s := &Supervisor{Bin: "/nonexistent/ollama", Addr: "127.0.0.1:1", ModelsDir: t.TempDir()}
	if err := s.Run(context.Background()); err == nil {
		t.Error("missing binary accepted")
	}
}
