// Package promtest runs a real Prometheus server for tests: it scrapes the
// targets a test names and answers PromQL queries, so a test can check that
// what hearth exposes is what Prometheus ingests.
//
// It needs the prometheus binary (Debian package "prometheus"); a missing
// binary fails the test rather than skipping it.
package promtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"

	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
)

// Options tune Start; the zero value is what Start uses.
type Options struct {
	// Binary is the prometheus executable; default /usr/bin/prometheus,
	// then $PATH.
	Binary string
	// ScrapeInterval defaults to one second.
	ScrapeInterval time.Duration
	// NativeHistograms turns on the native-histograms feature, so
	// Prometheus negotiates protobuf and ingests native buckets. With it
	// on, histograms that also have native buckets are stored as native
	// histograms only (query them with histogram_count() and friends, not
	// _count/_bucket series).
	NativeHistograms bool
}

// Prometheus is a running Prometheus server. It is stopped when the test
// that started it ends.
type Prometheus struct {
	// URL is the server's base URL, http://127.0.0.1:<port>.
	URL string
	// Jobs are the job label values of the targets, in the order given.
	Jobs []string

	api     promv1.API
	logPath string
	pid     int
}

// Start runs Prometheus scraping targets (each "host:port", scraped at
// /metrics, or a full http URL with its own path) and waits until it is
// ready to answer queries. Target i gets job label "target<i>".
func Start(t testing.TB, targets ...string) *Prometheus {
	t.Helper()
	return StartWithOptions(t, Options{}, targets...)
}

// StartWithOptions is Start with options.
func StartWithOptions(t testing.TB, opts Options, targets ...string) *Prometheus {
	t.Helper()
	bin := opts.Binary
	if bin == "" {
		bin = "/usr/bin/prometheus"
		if _, err := os.Stat(bin); err != nil {
			p, err := exec.LookPath("prometheus")
			if err != nil {
				t.Fatalf("promtest: prometheus binary not found (apt-get install prometheus): %v", err)
			}
			bin = p
		}
	}
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = time.Second
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	jobs, cfg, err := config(opts.ScrapeInterval, targets)
	if err != nil {
		t.Fatalf("promtest: %v", err)
	}
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		t.Fatalf("promtest: write config: %v", err)
	}
	// The free port is only reserved until it is closed, so another
	// process can take it before Prometheus binds; retry a few times.
	var lastErr error
	for attempt := range 3 {
		p, err := start(t, bin, dir, cfgPath, attempt, opts)
		if err == nil {
			p.Jobs = jobs
			return p
		}
		lastErr = err
	}
	t.Fatalf("promtest: %v", lastErr)
	return nil
}

// config renders the scrape configuration. JSON is valid YAML, and
// encoding it avoids quoting mistakes.
func config(interval time.Duration, targets []string) (jobs []string, cfg []byte, err error) {
	type staticConfig struct {
		Targets []string `json:"targets"`
	}
	type scrapeConfig struct {
		JobName        string         `json:"job_name"`
		Scheme         string         `json:"scheme"`
		MetricsPath    string         `json:"metrics_path"`
		StaticConfigs  []staticConfig `json:"static_configs"`
		ScrapeInterval string         `json:"scrape_interval"`
		ScrapeTimeout  string         `json:"scrape_timeout"`
	}
	scrapes := []scrapeConfig{}
	for i, target := range targets {
		host, path := target, "/metrics"
		if strings.Contains(target, "://") {
			u, err := url.Parse(target)
			if err != nil || u.Scheme != "http" || u.Host == "" {
				return nil, nil, fmt.Errorf("target %q: want host:port or an http URL", target)
			}
			host = u.Host
			if u.Path != "" {
				path = u.Path
			}
		}
		job := "target" + strconv.Itoa(i)
		jobs = append(jobs, job)
		scrapes = append(scrapes, scrapeConfig{
			JobName: job, Scheme: "http", MetricsPath: path,
			StaticConfigs:  []staticConfig{{Targets: []string{host}}},
			ScrapeInterval: model.Duration(interval).String(),
			ScrapeTimeout:  model.Duration(interval).String(),
		})
	}
	cfg, err = json.Marshal(map[string]any{
		"global": map[string]any{
			"scrape_interval":     model.Duration(interval).String(),
			"evaluation_interval": model.Duration(interval).String(),
		},
		"scrape_configs": scrapes,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("encode config: %w", err)
	}
	return jobs, cfg, nil
}

func start(t testing.TB, bin, dir, cfgPath string, attempt int, opts Options) (*Prometheus, error) {
	addr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, fmt.Sprintf("prometheus-%d.log", attempt))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create log: %w", err)
	}
	defer logFile.Close() // the child holds its own descriptor
	args := []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, fmt.Sprintf("data-%d", attempt)),
		"--web.listen-address=" + addr,
	}
	if opts.NativeHistograms {
		args = append(args, "--enable-feature=native-histograms")
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Take Prometheus down with the test binary if it dies without
	// running cleanups.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := proctest.Start(cmd)
	if err != nil {
		return nil, err
	}
	stop := func() {
		if cmd.Process.Signal(syscall.SIGTERM) == nil {
			select {
			case <-exited:
				return
			case <-time.After(10 * time.Second):
			}
		}
		_ = cmd.Process.Kill()
		<-exited
	}

	p := &Prometheus{URL: "http://" + addr, logPath: logPath, pid: cmd.Process.Pid}
	client, err := api.NewClient(api.Config{Address: p.URL})
	if err != nil {
		stop()
		return nil, fmt.Errorf("query client: %w", err)
	}
	p.api = promv1.NewAPI(client)

	if err := proctest.WaitReady("prometheus on "+addr, exited, 30*time.Second, func() error { return ready(p.URL) }); err != nil {
		stop()
		return nil, fmt.Errorf("%w:\n%s", err, tail(logPath))
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("prometheus log:\n%s", tail(logPath))
		}
	})
	return p, nil
}

func ready(base string) error {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(base + "/-/ready")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/-/ready: %s", resp.Status)
	}
	return nil
}

// tail returns the end of a log file for failure messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	const max = 4000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// ErrNoData is returned by TryQuery for a query with an empty result.
var ErrNoData = errors.New("promtest: query returned no data")

// TryQuery evaluates expr now. It returns the value of a scalar or of a
// vector with exactly one sample, ErrNoData for an empty vector, and an
// error for anything else.
func (p *Prometheus) TryQuery(ctx context.Context, expr string) (float64, error) {
	v, _, err := p.api.Query(ctx, expr, time.Now())
	if err != nil {
		return math.NaN(), fmt.Errorf("promtest: query %q: %w", expr, err)
	}
	switch v := v.(type) {
	case *model.Scalar:
		return float64(v.Value), nil
	case model.Vector:
		switch len(v) {
		case 0:
			return math.NaN(), ErrNoData
		case 1:
			return float64(v[0].Value), nil
		}
		return math.NaN(), fmt.Errorf("promtest: query %q returned %d series, want one: %v", expr, len(v), v)
	}
	return math.NaN(), fmt.Errorf("promtest: query %q returned a %s, want a scalar or vector", expr, v.Type())
}

// Query evaluates expr now and returns its single value, or NaN if the
// result is empty. Any other failure fails the test.
func (p *Prometheus) Query(t testing.TB, expr string) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, err := p.TryQuery(ctx, expr)
	if err != nil && !errors.Is(err, ErrNoData) {
		t.Fatal(err)
	}
	return v
}

// WaitFor polls expr every 250 ms until it has a value for which ok
// returns true, and returns that value. It fails the test, showing the
// target health and Prometheus's log, if that does not happen within
// timeout.
func (p *Prometheus) WaitFor(t testing.TB, expr string, ok func(float64) bool, timeout time.Duration) float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last error
	for {
		v, err := p.TryQuery(ctx, expr)
		if err == nil && ok(v) {
			return v
		}
		last = err
		if err == nil {
			last = fmt.Errorf("last value %v", v)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("promtest: %q not satisfied within %v: %v\ntargets: %s\nprometheus log:\n%s",
				expr, timeout, last, p.targets(), tail(p.logPath))
			return math.NaN()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// targets summarises target health for failure messages.
func (p *Prometheus) targets() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.api.Targets(ctx)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, at := range r.Active {
		fmt.Fprintf(&b, "\n  %s %s health=%s lastError=%q", at.Labels["job"], at.ScrapeURL, at.Health, at.LastError)
	}
	return b.String()
}
