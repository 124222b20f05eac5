// Package serve runs the `ollama serve` process a node supervises: start,
// restart on exit or when told it is wedged, stop with its runners, and
// wait until it listens. Generations go through llm/ollama.
package serve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
)

// Supervisor runs a private `ollama serve` and keeps it running: it restarts
// it with exponential backoff when it dies, and stops it (and its model
// runners) when its context ends.
type Supervisor struct {
	Bin       string // the ollama binary: a path, or a name looked up in PATH
	Addr      string // host:port to listen on, e.g. 127.0.0.1:11434
	ModelsDir string // OLLAMA_MODELS
	// Home is HOME for ollama serve, where it keeps its key pair
	// (default ModelsDir).
	Home string
	// NumParallel, if positive, sets OLLAMA_NUM_PARALLEL (parallel
	// requests per model).
	NumParallel int
	// ExtraEnv is added to the environment last, so it can override.
	ExtraEnv []string
	// Logger receives the supervisor's events and ollama's output, one
	// record per line. Nil discards.
	Logger *slog.Logger
	// OnExit, if set, is called each time ollama serve exits while it
	// should be running, before it is restarted.
	OnExit func(err error)

	// Backoff between restarts doubles from MinBackoff (default 250ms) to
	// MaxBackoff (default 30s), and starts over once a process has stayed
	// up for StableAfter (default 1m).
	MinBackoff, MaxBackoff, StableAfter time.Duration
	// StopGrace is how long ollama gets to exit after SIGTERM before it
	// is killed (default 10s).
	StopGrace time.Duration

	mu      sync.Mutex
	pid     int
	restart chan string   // Restart's request: the reason
	started chan struct{} // closed when the next process has started
}

// URL returns the base URL ollama serve listens on.
func (s *Supervisor) URL() string { return "http://" + s.Addr }

// PID returns the process id of the running ollama serve, or 0.
func (s *Supervisor) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

func (s *Supervisor) setPID(pid int) {
	s.mu.Lock()
	s.pid = pid
	if pid != 0 {
		close(s.nextStart())
		s.started = nil
	}
	s.mu.Unlock()
}

// nextStart returns the channel closed when the next process has started;
// mu is held.
func (s *Supervisor) nextStart() chan struct{} {
	if s.started == nil {
		s.started = make(chan struct{})
	}
	return s.started
}

func (s *Supervisor) restarts() chan string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.restart == nil {
		s.restart = make(chan string, 1)
	}
	return s.restart
}

// Restart replaces the running ollama serve with a new one, for reason
// (logged): the way out of a runtime that is stuck rather than dead. It
// returns once the new one answers HTTP, or ctx ended. The restart does
// not count as an exit (OnExit) and waits no backoff.
func (s *Supervisor) Restart(ctx context.Context, reason string) error {
	s.mu.Lock()
	started := s.nextStart()
	s.mu.Unlock()
	select {
	case s.restarts() <- reason:
	default: // one is asked for already
	}
	select {
	case <-started:
	case <-ctx.Done():
		return fmt.Errorf("ollama supervisor: restart: %w", ctx.Err())
	}
	return s.WaitReachable(ctx)
}

// errRestarted is runOnce's answer when Restart stopped the process.
var errRestarted = errors.New("restarted on request")

func durationOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

func (s *Supervisor) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// Run runs ollama serve until ctx ends, then stops it and returns nil. It
// returns an error only if ollama cannot be run at all.
func (s *Supervisor) Run(ctx context.Context) error {
	if s.Bin == "" || s.Addr == "" || s.ModelsDir == "" {
		return errors.New("ollama supervisor: Bin, Addr and ModelsDir are required")
	}
	bin, err := exec.LookPath(s.Bin)
	if err != nil {
		return fmt.Errorf("ollama supervisor: %w", err)
	}
	if err := os.MkdirAll(s.ModelsDir, 0o700); err != nil {
		return fmt.Errorf("ollama supervisor: models dir: %w", err)
	}
	log := s.logger()
	bo := &backoff.Backoff{
		Min: durationOr(s.MinBackoff, 250*time.Millisecond),
		Max: durationOr(s.MaxBackoff, 30*time.Second),
	}
	stable := durationOr(s.StableAfter, time.Minute)
	for {
		// Another program on the port would receive the model upload and
		// the requests meant for ours, and ours would die and be restarted
		// in a loop: refuse to start instead, with the reason.
		if err := portFree(s.Addr); err != nil {
			return err
		}
		started := time.Now()
		err := s.runOnce(ctx, bin)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errRestarted) {
			continue
		}
		if err == nil {
			err = errors.New("exited")
		}
		wait := restartPause(bo, time.Since(started), stable)
		log.Error("ollama serve stopped unexpectedly; restarting", "err", err, "after", wait)
		if s.OnExit != nil {
			s.OnExit(err)
		}
		if backoff.Sleep(ctx, wait) != nil {
			return nil
		}
	}
}

// restartPause is the pause before a restart after a process that ran for
// up: the backoff grows with each quick failure and starts over once a
// process stayed up for stable.
func restartPause(bo *backoff.Backoff, up, stable time.Duration) time.Duration {
	if up >= stable {
		bo.Reset()
	}
	return bo.Next()
}

func (s *Supervisor) env() []string {
	home := s.Home
	if home == "" {
		home = s.ModelsDir
	}
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + home,
		"OLLAMA_HOST=" + s.Addr,
		"OLLAMA_MODELS=" + s.ModelsDir,
		// One deployment, one model, always loaded.
		"OLLAMA_MAX_LOADED_MODELS=1",
		"OLLAMA_KEEP_ALIVE=-1",
	}
	if s.NumParallel > 0 {
		env = append(env, "OLLAMA_NUM_PARALLEL="+strconv.Itoa(s.NumParallel))
	}
	return append(env, s.ExtraEnv...)
}

// runOnce starts ollama serve and waits until it exits or ctx ends.
func (s *Supervisor) runOnce(ctx context.Context, bin string) error {
	// Pdeathsig fires when the thread that started the child exits, not
	// the process; pin this goroutine to its thread while the child lives.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	// Our own pipe, not an io.Writer: exec would otherwise wait for the
	// model runners, which inherit it, before Wait returned.
	pr, pw, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("output pipe: %w", err)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = s.env()
	cmd.Dir = s.ModelsDir
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Setpgid: true, // ollama and its runners form one group to stop
		// SIGTERM, not SIGKILL: ollama stops its runners on SIGTERM.
		Pdeathsig: syscall.SIGTERM,
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return fmt.Errorf("start %s serve: %w", bin, err)
	}
	pid := cmd.Process.Pid
	s.setPID(pid)
	select {
	case <-s.restarts(): // asked for while none ran: this start is it
	default:
	}
	log := s.logger()
	log.Info("ollama serve started", "pid", pid, "addr", s.Addr)

	copied := make(chan struct{})
	go func() {
		defer close(copied)
		logLines(log, pr)
		pr.Close()
	}()

	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var werr error
	restarted := false
	select {
	case werr = <-exited:
	case <-ctx.Done():
		werr = s.stop(pid, exited)
	case reason := <-s.restarts():
		log.Warn("restarting ollama serve", "pid", pid, "reason", reason)
		werr = s.stop(pid, exited)
		restarted = true
	}
	// Runners left behind by a crashed server would hold memory and the
	// output pipe; the group dies with its leader.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	s.setPID(0)
	<-copied
	log.Info("ollama serve exited", "pid", pid, "status", fmt.Sprint(werr))
	if restarted {
		return errRestarted
	}
	return werr
}

// stop ends the process group of pid: SIGTERM (ollama stops its runners),
// then SIGKILL after StopGrace. exited reports the leader's exit.
func (s *Supervisor) stop(pid int, exited <-chan error) error {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(durationOr(s.StopGrace, 10*time.Second))
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		s.logger().Warn("ollama serve did not stop in time; killing it", "pid", pid)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return <-exited
	}
}

// logLines logs each line ollama prints. Per-request access lines go to
// debug so busy servers do not flood the log.
func logLines(log *slog.Logger, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	ctx := context.Background()
	for sc.Scan() {
		line := sc.Text()
		level := slog.LevelInfo
		if strings.HasPrefix(line, "[GIN]") {
			level = slog.LevelDebug
		}
		log.Log(ctx, level, "ollama", "line", line)
	}
	if err := sc.Err(); err != nil {
		log.Warn("ollama output unreadable; discarding the rest", "err", err)
	}
	// Keep draining, or ollama would block on a full pipe.
	_, _ = io.Copy(io.Discard, r)
}

// WaitReachable waits until ollama serve answers HTTP, or ctx ends.
func (s *Supervisor) WaitReachable(ctx context.Context) error {
	return WaitReachable(ctx, s.URL())
}

// WaitReachable waits until the Ollama at baseURL answers, or ctx ends.
func WaitReachable(ctx context.Context, baseURL string) error {
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil}}
	defer hc.CloseIdleConnections()
	var lastErr error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(baseURL, "/")+"/api/version", nil)
		if err != nil {
			return fmt.Errorf("ollama: %w", err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("answered %s", resp.Status)
		}
		lastErr = err
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("ollama at %s not reachable: %w (last error: %v)", baseURL, ctx.Err(), lastErr)
		case <-t.C:
		}
	}
}

// portFree checks that nothing listens on addr, by binding it for a moment.
// Between this check and ollama's own bind another program could take the
// port; ollama then exits on its bind error and the next check names the
// holder's port as taken.
func portFree(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("ollama supervisor: %s is in use by another program: it cannot be this node's Ollama; stop that program or choose another ollama_addr", addr)
		}
		return fmt.Errorf("ollama supervisor: cannot listen on %s: %w", addr, err)
	}
	return ln.Close()
}
