package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/ollama"
	"github.com/hearthd/hearth/llm/tinymodel"
)

func TestSupervisorRestartsAndStops(t *testing.T) {
	ollamatest.ForEachVersion(t, testSupervisorRestartsAndStops)
}

func testSupervisorRestartsAndStops(t *testing.T, v ollamatest.Version) {
	bin := v.Bin
	dir := t.TempDir()
	var exits atomic.Int32
	sup := &Supervisor{
		Bin:         bin,
		Addr:        fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t)),
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
	b, err := ollama.New(ollama.Config{BaseURL: sup.URL(), Model: "hearth-tiny", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	src := ollama.ModelSource{GGUFPath: gguf, Template: tinymodel.Template, Parameters: tinymodel.Parameters()}
	if err := b.EnsureModel(wctx, src); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Warm(wctx); err != nil {
		t.Fatal(err)
	}
	if _, final := generate(t, b, llm.Options{MaxTokens: ptr(5)}); final.CompletionTokens != 5 {
		t.Fatalf("before the kill: %+v", final)
	}

	first := sup.PID()
	if first == 0 {
		t.Fatal("no PID while running")
	}
	_, runners := ollamatest.RunnerCPUTicks(first)
	if runners == 0 {
		t.Fatal("no runner after warm-up")
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the server to be restarted", func() bool {
		p := sup.PID()
		return p != 0 && p != first
	})
	if exits.Load() != 1 {
		t.Fatalf("OnExit called %d times, want 1", exits.Load())
	}
	// The killed server's runner went with it (once its new parent has
	// reaped it).
	testutil.WaitFor(t, 10*time.Second, "the killed server's runner to go", func() bool {
		return syscall.Kill(-first, 0) != nil
	})
	if err := sup.WaitReachable(wctx); err != nil {
		t.Fatal(err)
	}
	// The model is on disk still; it only needs loading again.
	if err := b.Ready(wctx); !errors.Is(err, llm.ErrUnavailable) {
		t.Fatalf("Ready after a restart before warm-up = %v", err)
	}
	if err := b.EnsureModel(wctx, ollama.ModelSource{}); err != nil {
		t.Fatalf("model lost across restart: %v", err)
	}
	if _, err := b.Warm(wctx); err != nil {
		t.Fatal(err)
	}
	if _, final := generate(t, b, llm.Options{MaxTokens: ptr(5)}); final.CompletionTokens != 5 {
		t.Fatalf("after the restart: %+v", final)
	}

	// Restart (a stuck runtime's way out) replaces the server and its
	// runner at once, without counting as an exit or waiting a backoff,
	// and returns once the new one answers.
	before := sup.PID()
	if err := sup.Restart(wctx, "test: stuck"); err != nil {
		t.Fatalf("Restart = %v", err)
	}
	second := sup.PID()
	if second == 0 || second == before {
		t.Fatalf("PID after Restart = %d, before %d", second, before)
	}
	if exits.Load() != 1 {
		t.Fatalf("OnExit called %d times after Restart, want 1 still", exits.Load())
	}
	testutil.WaitFor(t, 10*time.Second, "the replaced server's group to go", func() bool {
		return syscall.Kill(-before, 0) != nil
	})
	if err := b.EnsureModel(wctx, ollama.ModelSource{}); err != nil {
		t.Fatalf("model lost across Restart: %v", err)
	}
	if _, err := b.Warm(wctx); err != nil {
		t.Fatal(err)
	}
	if _, final := generate(t, b, llm.Options{MaxTokens: ptr(5)}); final.CompletionTokens != 5 {
		t.Fatalf("after Restart: %+v", final)
	}

	cancel()
	select {
	case err := <-runErr:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	testutil.WaitFor(t, 10*time.Second, "the process group to go after Run returned", func() bool {
		return syscall.Kill(-second, 0) != nil
	})
	if sup.PID() != 0 {
		t.Fatal("PID set after Run returned")
	}
}

// pauseLog is a slog.Handler that keeps the "after" attribute of every
// record: the pauses the supervisor logs before each restart.
type pauseLog struct {
	mu     sync.Mutex
	pauses []time.Duration
}

func (*pauseLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *pauseLog) WithAttrs([]slog.Attr) slog.Handler     { return l }
func (l *pauseLog) WithGroup(string) slog.Handler          { return l }
func (l *pauseLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "after" {
			l.mu.Lock()
			l.pauses = append(l.pauses, a.Value.Duration())
			l.mu.Unlock()
		}
		return true
	})
	return nil
}

func TestSupervisorBacksOff(t *testing.T) {
	// A binary that exits at once: the supervisor restarts it with
	// growing pauses, and Run returns when told to stop.
	var exits []time.Time
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &pauseLog{}
	sup := &Supervisor{
		Bin:        "false", // looked up in PATH
		Addr:       "127.0.0.1:1",
		ModelsDir:  t.TempDir(),
		MinBackoff: 20 * time.Millisecond,
		MaxBackoff: 160 * time.Millisecond,
		Logger:     slog.New(log),
		OnExit: func(error) {
			if exits = append(exits, time.Now()); len(exits) == 6 {
				cancel()
			}
		},
	}
	if err := sup.Run(ctx); err != nil {
		t.Fatal(err)
	}
	// Pauses double: 20, 40, 80, then cap at 160ms.
	log.mu.Lock()
	got := fmt.Sprint(log.pauses)
	log.mu.Unlock()
	if want := "[20ms 40ms 80ms 160ms 160ms 160ms]"; got != want {
		t.Fatalf("pauses %s, want %s", got, want)
	}
	// And the supervisor really waited them out before each restart.
	for i, want := range []time.Duration{20, 40, 80, 160, 160} {
		if gap := exits[i+1].Sub(exits[i]); gap < want*time.Millisecond {
			t.Errorf("restart %d came %v after the exit before it, want at least %v", i+1, gap, want*time.Millisecond)
		}
	}
}

func TestRestartPause(t *testing.T) {
	bo := &backoff.Backoff{Min: time.Second, Max: 5 * time.Second}
	var got []time.Duration
	for _, up := range []time.Duration{0, 0, 0, 0, 0, 2 * time.Minute, 0} {
		got = append(got, restartPause(bo, up, time.Minute))
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

// With its port held by another program, the supervisor starts nothing and
// fails with a clear error, rather than restarting Ollama in a loop while
// the other program receives what was meant for it.
func TestSupervisorRefusesATakenPort(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var exits atomic.Int32
	sup := &Supervisor{Bin: "true", Addr: ln.Addr().String(), ModelsDir: t.TempDir(), Logger: testLogger(t),
		OnExit: func(error) { exits.Add(1) }}
	err = sup.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "in use by another program") {
		t.Fatalf("Run: %v", err)
	}
	if exits.Load() != 0 || sup.PID() != 0 {
		t.Fatalf("a process was started: %d exits", exits.Load())
	}
}

func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

func ptr[T any](v T) *T { return &v }

// generate asks b for a short answer and returns its final event.
func generate(t *testing.T, b *ollama.Backend, opts llm.Options) (string, llm.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, err := b.Chat(ctx, &llm.Request{Messages: []llm.Message{{Role: "user", Content: "tell me a story"}}, Options: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var text strings.Builder
	for {
		ev, err := s.Recv()
		if err == io.EOF {
			t.Fatal("the stream ended without its final event")
		}
		if err != nil {
			t.Fatal(err)
		}
		text.WriteString(ev.Content)
		if ev.Done {
			return text.String(), ev
		}
	}
}
