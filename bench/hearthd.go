package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/systemd"
)

// HearthdOptions start one hearthd process.
type HearthdOptions struct {
	Bin       string // the hearthd binary
	StateDir  string
	Model     string
	OllamaURL string
	// MaxConcurrent and MaxQueue are hearthd's admission limits; the bench
	// sets them above its largest scenario so that admission never sheds.
	MaxConcurrent int
	MaxQueue      int
	// Extra arguments for `hearthd serve`, e.g. --model-gguf.
	Extra []string
	// Log receives hearthd's stderr; nil discards it.
	Log io.Writer
	// ReadyTimeout bounds the wait for /readyz; default 2 minutes.
	ReadyTimeout time.Duration
	// TLS, if set, has hearthd serve HTTPS with its certificate.
	TLS *TLSFiles
}

// Hearthd is a running hearthd process.
type Hearthd = Process

// Process is a server process the bench started: hearthd or a control
// plane replica.
type Process struct {
	URL string // base URL, e.g. http://127.0.0.1:41235
	// MetricsURL is its private metrics listener (hearthd's also serves
	// /debug/pprof/).
	MetricsURL string
	PID        int
	Started    time.Time // when the process was started
	Ready      time.Time // when /readyz first answered 200
	cmd        *exec.Cmd
	exited     chan error
	// done is closed when the process has exited, with exitErr set.
	done    chan struct{}
	exitErr error

	stopOnce sync.Once
	stopErr  error
}

// CreateKey makes an API key with `hearthd keys create` on a stopped
// daemon's state directory and returns it.
func CreateKey(ctx context.Context, bin, stateDir, name string) (string, error) {
	out, err := exec.CommandContext(ctx, bin, "keys", "create", "--name", name, "--state-dir", stateDir).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("hearthd keys create: %w: %s", err, bytes.TrimSpace(out))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); strings.HasPrefix(line, "hearth_live_") {
			return line, nil
		}
	}
	return "", errors.New("hearthd keys create printed no key")
}

// StartHearthd starts `hearthd serve` and waits until /readyz answers 200.
func StartHearthd(ctx context.Context, o HearthdOptions) (*Hearthd, error) {
	addr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	// A port of its own: the default metrics port may be taken by another
	// hearthd on the machine.
	maddr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 2 * time.Minute
	}
	// The load generator is one source of every stream: no per-source cap.
	args := []string{"serve", "--listen", addr, "--metrics-listen", maddr, "--state-dir", o.StateDir, "--model", o.Model,
		"--ollama-url", o.OllamaURL, "--log-level", "warn", "--max-conns-per-source", "0"}
	if o.MaxConcurrent > 0 {
		args = append(args, "--max-concurrent", strconv.Itoa(o.MaxConcurrent))
	}
	if o.MaxQueue > 0 {
		args = append(args, "--max-queue", strconv.Itoa(o.MaxQueue))
	}
	url, client := "http://"+addr, &http.Client{Timeout: 2 * time.Second}
	if o.TLS != nil {
		args = append(args, "--tls-cert", o.TLS.CertFile, "--tls-key", o.TLS.KeyFile)
		url = "https://" + addr
		client.Transport = &http.Transport{TLSClientConfig: o.TLS.Client}
	}
	args = append(args, o.Extra...)
	// As the unit runs it: what it costs is measured as it ships.
	h, err := StartProcess(ctx, o.Bin, args, systemd.HearthdEnvironment(), o.Log, url, "/readyz", o.ReadyTimeout, client)
	if err != nil {
		return nil, fmt.Errorf("hearthd: %w", err)
	}
	h.MetricsURL = "http://" + maddr
	return h, nil
}

// startProcess starts bin with args and env (added to this process's
// environment) and waits until url+readyPath answers 200. The process's
// output goes to log (nil discards it).
func StartProcess(ctx context.Context, bin string, args, env []string, log io.Writer, url, readyPath string, timeout time.Duration, client *http.Client) (*Process, error) {
	// Not CommandContext: the process must outlive the start-up context and
	// is stopped by Stop.
	cmd := exec.Command(bin, args...)
	cmd.Stdout = log
	cmd.Stderr = log
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	h := &Process{URL: url, cmd: cmd, exited: make(chan error, 1), done: make(chan struct{})}
	h.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	h.PID = cmd.Process.Pid
	go func() {
		err := cmd.Wait()
		h.exitErr = err
		close(h.done)
		h.exited <- err
	}()
	if err := waitReady(ctx, client, url+readyPath, timeout, h.exited); err != nil {
		_ = h.Stop()
		return nil, fmt.Errorf("not ready: %w", err)
	}
	h.Ready = time.Now()
	return h, nil
}

// waitReady polls url until it answers 200, the process exits or the
// timeout passes.
func waitReady(ctx context.Context, client *http.Client, url string, timeout time.Duration, exited <-chan error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if client == nil {
		client = &http.Client{Timeout: 2 * time.Second}
	}
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("build readiness request: %w", err)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			return fmt.Errorf("process exited: %v", err)
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %w", url, ctx.Err())
		case <-tick.C:
		}
	}
}

// Exited reports whether the process has ended (by itself or by Stop).
func (h *Process) Exited() bool {
	select {
	case <-h.done:
		return true
	default:
		return false
	}
}

// Stop sends SIGTERM, waits up to 10 s, then kills. Calling it again
// returns the first call's result.
func (h *Process) Stop() error {
	h.stopOnce.Do(func() {
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-h.done:
			var exit *exec.ExitError
			if err := h.exitErr; err != nil && !errors.As(err, &exit) {
				h.stopErr = fmt.Errorf("wait for %s: %w", h.cmd.Path, err)
			}
		case <-time.After(10 * time.Second):
			slog.Warn("process did not stop on SIGTERM; killing", "pid", h.PID, "bin", h.cmd.Path)
			_ = h.cmd.Process.Kill()
			<-h.done
			h.stopErr = fmt.Errorf("%s did not stop within 10s of SIGTERM", h.cmd.Path)
		}
	})
	return h.stopErr
}

// mallocsMetric is the Go collector's count of heap allocations.
const mallocsMetric = "go_memstats_mallocs_total"

// ReadMallocs reads hearthd's heap allocations so far from its metrics
// listener's /metrics.
func ReadMallocs(ctx context.Context, metricsURL string) (float64, error) {
	return ReadMetric(ctx, metricsURL, mallocsMetric)
}

// ReadMetric reads one sample of a process's metrics listener: name is the
// metric's name, with its labels as exposed if it has any
// (`hearth_runtime_restarts_total{reason="wedged"}`).
func ReadMetric(ctx context.Context, metricsURL, name string) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL+"/metrics", nil)
	if err != nil {
		return 0, fmt.Errorf("build metrics request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("get %s: %w", req.URL, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("get %s: status %d", req.URL, resp.StatusCode)
	}
	v, err := parseCounter(resp.Body, name)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", req.URL, err)
	}
	return v, nil
}

// parseCounter finds an unlabelled sample of name in a Prometheus text
// exposition: one line is all it needs, so no full parser.
func parseCounter(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	prefix := name + " "
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), prefix)
		if !ok {
			continue
		}
		f := strings.Fields(rest) // value, then an optional timestamp
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: no value", name)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parse %s: %w", name, err)
		}
		return v, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read metrics: %w", err)
	}
	return 0, fmt.Errorf("no %s sample", name)
}

// ensureDir creates dir.
func EnsureDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	return nil
}
