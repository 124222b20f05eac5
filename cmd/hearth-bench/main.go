// Command hearth-bench measures what hearthd costs next to the model
// runtime: it runs a mock Ollama, drives load at it directly and through
// hearthd, and writes the comparison to bench/results. Its fleet subcommand
// measures the control plane under a simulated fleet of nodes.
//
//	hearth-bench [run] [flags]  the whole suite (make bench; run is the default)
//	hearth-bench mock [flags]   only the mock runtime
//	hearth-bench load [flags]   only the load generator, at any OpenAI base URL
//	hearth-bench fleet [flags]  the control plane under a simulated fleet (make bench-fleet)
//	hearth-bench soak [flags]   hearthd and a real Ollama under mixed traffic for minutes (make soak)
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/nginxtest"
	"github.com/hearthd/hearth/systemd"
)

const usage = `usage:
  hearth-bench [run] [flags]  run the benchmark suite (default; see hearth-bench run -h)
  hearth-bench mock [flags]   serve the mock runtime
  hearth-bench load [flags]   drive load at an OpenAI-compatible base URL
  hearth-bench fleet [flags]  drive a simulated fleet at the control plane (see hearth-bench fleet -h)
  hearth-bench soak [flags]   hearthd supervising a real Ollama under mixed traffic (see hearth-bench soak -h)
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	args := os.Args[1:]
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		args = append([]string{"run"}, args...) // run is the default
	}
	var err error
	switch args[0] {
	case "run":
		err = runSuite(ctx, log, args[1:])
	case "mock":
		err = runMock(ctx, log, args[1:])
	case "load":
		err = runLoad(ctx, args[1:])
	case "fleet":
		err = runFleet(ctx, log, args[1:])
	case "soak":
		err = runSoak(ctx, log, args[1:])
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(2)
		}
		log.Error("hearth-bench failed", "err", err)
		os.Exit(1)
	}
}

func mockFlags(fs *flag.FlagSet, c *bench.MockConfig) {
	fs.IntVar(&c.Tokens, "tokens", 64, "tokens per response unless the request asks for fewer")
	fs.Float64Var(&c.TPS, "tps", 50, "tokens per second per stream (0: unlimited)")
	fs.DurationVar(&c.TTFT, "ttft", 10*time.Millisecond, "time to first token")
	fs.IntVar(&c.FlushEvery, "flush-every", 1, "flush after this many tokens (unlimited speed only)")
}

func runMock(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("mock", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:11435", "address to listen on")
	model := fs.String("model", "bench", "the model the mock serves")
	var c bench.MockConfig
	mockFlags(fs, &c)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := bench.RaiseNoFile(1 << 17); err != nil {
		log.Warn("open-file limit", "err", err)
	}
	m, err := bench.StartMock(*listen, *model, c)
	if err != nil {
		return err
	}
	// The suite reads the URL from this line.
	fmt.Println(m.URL)
	<-ctx.Done()
	return m.Close()
}

func runLoad(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	var c bench.LoadConfig
	fs.StringVar(&c.Target, "target", "", "OpenAI base URL, e.g. http://127.0.0.1:8080/api/v1 (required)")
	fs.StringVar(&c.Key, "key", os.Getenv("HEARTH_BENCH_KEY"), "API key (default $HEARTH_BENCH_KEY)")
	fs.StringVar(&c.Model, "model", "bench", "model id")
	fs.StringVar(&c.Prompt, "prompt", "", "user message")
	fs.IntVar(&c.MaxTokens, "max-tokens", 64, "max_tokens per request (0: not sent)")
	fs.IntVar(&c.Concurrency, "concurrency", 1, "closed-loop streams (with --rate: cap on requests in flight)")
	fs.Float64Var(&c.Rate, "rate", 0, "open loop: requests per second")
	fs.DurationVar(&c.Duration, "duration", 10*time.Second, "how long to start requests")
	fs.IntVar(&c.Requests, "requests", 0, "stop after this many requests (0: duration only)")
	fs.DurationVar(&c.Ramp, "ramp", 0, "spread the start of closed-loop streams over this time")
	fs.BoolVar(&c.Verify, "verify", false, "decode every chunk fully")
	caFile := fs.String("ca-file", "", "for an https:// target: a PEM file of CAs to trust beside the system's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.Target == "" {
		return errors.New("--target is required")
	}
	if strings.HasPrefix(c.Target, "https://") {
		pool, err := x509.SystemCertPool()
		if err != nil {
			return fmt.Errorf("system CAs: %w", err)
		}
		if *caFile != "" {
			pem, err := os.ReadFile(*caFile)
			if err != nil {
				return fmt.Errorf("--ca-file: %w", err)
			}
			if !pool.AppendCertsFromPEM(pem) {
				return fmt.Errorf("--ca-file %s: no certificate in it", *caFile)
			}
		}
		c.TLS = &tls.Config{RootCAs: pool}
	}
	if _, err := bench.RaiseNoFile(uint64(c.Concurrency) + 1024); err != nil {
		slog.Warn("open-file limit", "err", err)
	}
	side, err := bench.MeasureSide(ctx, c, 0)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(side)
}

// scenarios are the suite's load shapes; scale multiplies their durations.
// noFile is the open-file limit hearthd inherits: every stream holds two
// descriptors in hearthd (client and runtime connection), so the largest
// scenario is cut to what fits (its load column shows the real count).
func scenarios(scale float64, only string, noFile uint64) []bench.Scenario {
	d := func(s float64) time.Duration { return time.Duration(s * scale * float64(time.Second)) }
	paced := func(tps float64) bench.MockConfig {
		return bench.MockConfig{TPS: tps, TTFT: 5 * time.Millisecond}
	}
	all := []bench.Scenario{
		// Short responses at c1 give enough requests for a TTFT p99.
		{Name: "c1", Concurrency: 1, Duration: d(10), Tokens: 16, Mock: paced(200)},
		{Name: "c100", Concurrency: 100, Duration: d(8), Ramp: d(0.5), Tokens: 32, Mock: paced(100)},
		{Name: "c1000", Concurrency: 1000, Duration: d(12), Ramp: d(2), Tokens: 16, Mock: paced(10)},
		// One token per request: the proxy's CPU per token is its CPU per request.
		{Name: "req2000", Concurrency: 1000, Rate: 2000, Duration: d(10), Tokens: 1, Mock: paced(10)},
		{Name: "c10000", Concurrency: maxStreams(10000, noFile), Duration: d(20), Ramp: d(5), Tokens: 8, Mock: paced(1)},
		{Name: "open200", Concurrency: 5000, Rate: 200, Duration: d(8), Tokens: 32, Mock: paced(100)},
		// Max throughput: the mock writes as fast as it can.
		{Name: "max-c16", Concurrency: 16, Duration: d(6), Tokens: 1000, Mock: bench.MockConfig{}},
		{Name: "max-c64", Concurrency: 64, Duration: d(6), Tokens: 1000, Mock: bench.MockConfig{}},
		{Name: "max-c64-flush16", Concurrency: 64, Duration: d(6), Tokens: 1000, Mock: bench.MockConfig{FlushEvery: 16}},
	}
	if only == "" {
		return all
	}
	var out []bench.Scenario
	for _, s := range all {
		for _, name := range strings.Split(only, ",") {
			if s.Name == name {
				out = append(out, s)
			}
		}
	}
	return out
}

func runSuite(ctx context.Context, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	hearthd := fs.String("hearthd", "", "hearthd binary (default: built from ./cmd/hearthd)")
	out := fs.String("out", "bench/results", "directory for the JSON and Markdown results")
	scale := fs.Float64("scale", 1, "multiply scenario durations (e.g. 0.2 for a quick look)")
	only := fs.String("scenarios", "", "comma-separated scenario names (default: all)")
	real := fs.Bool("real", true, "also compare with a real Ollama and the tiny model")
	ollamaBin := fs.String("ollama", "", "ollama binary (default: as internal/ollamatest finds it)")
	coldRuns := fs.Int("cold-runs", 5, "hearthd restarts for the first-request measurement")
	hearthdArgs := fs.String("hearthd-args", "", "extra space-separated `hearthd serve` arguments (e.g. a CPU profile flag)")
	hearthdLog := fs.String("hearthd-log", "", "file for hearthd's and Ollama's output (default: discarded)")
	profile := fs.String("profile", "", "directory for hearthd's CPU, heap and goroutine profiles per scenario (from its /debug/pprof/)")
	profileRamp := fs.Bool("profile-ramp", false, "with --profile: start the profiles with the load, the execution trace covering the ramp")
	withNginx := fs.Bool("nginx", true, "also drive every scenario through a private nginx (Debian's package) in front of the same runtime")
	transports := fs.String("transports", "tls,http", "comma-separated: tls (clients reach hearthd and nginx over HTTPS, the production path), http (plain)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *profile != "" {
		if err := os.MkdirAll(*profile, 0o755); err != nil {
			return fmt.Errorf("profile dir: %w", err)
		}
	}
	noFile, err := bench.RaiseNoFile(1 << 17)
	if err != nil {
		log.Warn("open-file limit", "limit", noFile, "err", err)
	}
	work, logw, cleanup, err := hearthdSetup(ctx, log, "hearth-bench-", hearthd, *hearthdLog)
	if err != nil {
		return err
	}
	defer cleanup()

	rep := &bench.Report{Started: time.Now(), Machine: bench.ThisMachine(), Command: "hearth-bench run " + strings.Join(args, " ")}
	if env := systemd.HearthdEnvironment(); len(env) > 0 {
		rep.Notes = append(rep.Notes, "hearthd ran with the environment hearthd.service gives it: `"+strings.Join(env, " ")+"`.")
	}
	files, err := bench.NewTLSFiles(work)
	if err != nil {
		return err
	}
	mockURL, mockPID, stopMock, err := startMockProcess(ctx)
	if err != nil {
		return err
	}
	defer stopMock()
	scs := scenarios(*scale, *only, noFile)
	var suites []*bench.Suite
	for _, tr := range strings.Split(*transports, ",") {
		s := &bench.Suite{HearthdBin: *hearthd, MockURL: mockURL, MockPID: mockPID, Model: "bench",
			WorkDir: filepath.Join(work, tr), HearthdLog: logw, MaxStreams: 20000, Log: log, HearthdArgs: strings.Fields(*hearthdArgs),
			ProfileRamp: *profileRamp}
		if *profile != "" {
			s.ProfileDir = filepath.Join(*profile, tr)
			if err := os.MkdirAll(s.ProfileDir, 0o755); err != nil {
				return fmt.Errorf("profile dir: %w", err)
			}
		}
		switch tr {
		case "tls":
			s.TLS = files
		case "http":
		default:
			return fmt.Errorf("--transports: unknown transport %q (tls, http)", tr)
		}
		if err := s.Setup(ctx); err != nil {
			return err
		}
		if *withNginx {
			ng, err := startNginx(mockURL, scs, noFile, s.TLS)
			if err != nil {
				return err
			}
			defer ng.Close()
			s.Nginx = ng
		}
		suites = append(suites, s)
	}
	for _, s := range suites {
		log.Info("transport", "name", s.Transport())
		h, err := s.StartHearthd(ctx)
		if err != nil {
			return err
		}
		h, err = runScenarios(ctx, log, s, h, scs, rep, *out)
		if stopErr := h.Stop(); err == nil {
			err = stopErr
		}
		if err != nil {
			return err
		}
	}
	if *coldRuns > 0 && len(suites) > 0 {
		if err := runColdStart(ctx, log, suites[0], *coldRuns, rep, *out); err != nil {
			return err
		}
	}
	if *real {
		runRealRuntime(ctx, log, rep, bench.RealOptions{
			HearthdBin: *hearthd, OllamaBin: *ollamaBin, WorkDir: work, Rounds: 4,
			Duration: time.Duration(*scale * float64(8*time.Second)), Concurrency: 1, MaxTokens: 128,
			ColdRuns: *coldRuns, Log: logw, Nginx: *withNginx, TLS: files,
		})
	}
	path, err := rep.Write(*out)
	if err != nil {
		return err
	}
	fmt.Print(rep.Markdown())
	log.Info("wrote results", "path", path)
	return nil
}

// runScenarios runs each scenario against h and records it in rep. A crash
// of hearthd is a result, not the end of the run: it is noted and the rest
// run against a fresh hearthd. It returns the hearthd started last, for the
// caller to stop.
func runScenarios(ctx context.Context, log *slog.Logger, s *bench.Suite, h *bench.Hearthd, scs []bench.Scenario, rep *bench.Report, out string) (*bench.Hearthd, error) {
	best := 0.0
	for _, sc := range scs {
		log.Info("scenario", "name", sc.Name)
		r, err := s.RunScenario(ctx, h, sc)
		if err != nil && h.Exited() {
			note := fmt.Sprintf("hearthd exited during %s: %v (see --hearthd-log)", sc.Name, err)
			log.Error("hearthd exited", "scenario", sc.Name, "err", err)
			rep.Notes = append(rep.Notes, note)
			fresh, err := s.StartHearthd(ctx)
			if err != nil {
				return h, fmt.Errorf("restart hearthd: %w", err)
			}
			h = fresh
			continue
		}
		if err != nil {
			return h, err
		}
		rep.Scenarios = append(rep.Scenarios, r)
		if r.Through.TokensPS > best {
			best, rep.MaxThroughput = r.Through.TokensPS, sc.Name
		}
		if _, err := rep.Write(out); err != nil {
			return h, err
		}
		// Let connections from the last scenario close before the next.
		time.Sleep(time.Second)
	}
	return h, nil
}

// runColdStart measures the first request after a start of hearthd, runs
// times, into rep.
func runColdStart(ctx context.Context, log *slog.Logger, s *bench.Suite, runs int, rep *bench.Report, out string) error {
	log.Info("cold start")
	if err := s.SetMock(ctx, bench.MockConfig{Tokens: 16, TTFT: 20 * time.Millisecond}); err != nil {
		return err
	}
	lc := bench.LoadConfig{Model: "bench", Key: s.Key(), MaxTokens: 16, ExpectTokens: 16, TLS: s.ClientTLS()}
	direct := lc
	direct.Target, direct.Key = s.MockURL+"/v1", ""
	cs, err := bench.ColdStart(ctx, runs, 20, s.StartHearthd, lc, direct)
	if err != nil {
		return err
	}
	rep.ColdStart = &cs
	_, err = rep.Write(out)
	return err
}

// startNginx starts a private nginx in front of the mock, serving files'
// certificate when set. One worker, as hearthd runs its own code on one
// processor of this machine's two (max_procs 0): each proxy has one core
// for its own work, the other for the load and the runtime.
func startNginx(mockURL string, scs []bench.Scenario, noFile uint64, files *bench.TLSFiles) (*nginxtest.Proxy, error) {
	streams := 16
	for _, sc := range scs {
		streams = max(streams, sc.Concurrency)
	}
	u, err := url.Parse(mockURL)
	if err != nil {
		return nil, fmt.Errorf("mock url: %w", err)
	}
	// Every stream takes two connections, within the open-file limit
	// this process may give the worker.
	conns := 2*streams + 256
	if noFile > 2048 {
		conns = min(conns, int(noFile)-1024)
	}
	cfg := nginxtest.Config{Upstream: u.Host, WorkerProcesses: 1, WorkerConnections: conns, Keepalive: 256}
	if files != nil {
		cfg.TLSCert, cfg.TLSKey = files.CertFile, files.KeyFile
	}
	return nginxtest.New(cfg)
}

// runRealRuntime compares hearthd with a real Ollama into rep; a failure is
// noted in the report rather than ending the run.
func runRealRuntime(ctx context.Context, log *slog.Logger, rep *bench.Report, o bench.RealOptions) {
	log.Info("real runtime")
	rr, err := bench.RunReal(ctx, o)
	if err != nil {
		rep.Notes = append(rep.Notes, "real runtime run failed: "+err.Error())
		log.Error("real runtime", "err", err)
		return
	}
	rep.Real = rr
}

// maxStreams is n, or fewer if hearthd's open-file limit (two descriptors
// per stream, a reserve for listeners, state and probes) cannot hold n.
func maxStreams(n int, noFile uint64) int {
	const reserve = 400
	if noFile == 0 || noFile > uint64(2*n+reserve) {
		return n
	}
	if noFile <= reserve {
		return 1
	}
	return max(int(noFile-reserve)/2, 1)
}

// startMockProcess runs this binary's mock subcommand as a child, so its CPU
// time is measured apart from the load generator's.
func startMockProcess(ctx context.Context) (url string, pid int, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", 0, nil, fmt.Errorf("find own binary: %w", err)
	}
	cmd := exec.Command(self, "mock", "--listen", "127.0.0.1:0")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", 0, nil, fmt.Errorf("mock stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return "", 0, nil, fmt.Errorf("start mock: %w", err)
	}
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	line := make(chan string, 1)
	go func() {
		var b [256]byte
		n, _ := io.ReadAtLeast(stdout, b[:], 1)
		line <- strings.TrimSpace(string(b[:n]))
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case url = <-line:
	case <-time.After(10 * time.Second):
		stop()
		return "", 0, nil, errors.New("mock did not start within 10s")
	case <-ctx.Done():
		stop()
		return "", 0, nil, ctx.Err()
	}
	if !strings.HasPrefix(url, "http://") {
		stop()
		return "", 0, nil, fmt.Errorf("mock printed %q, want its URL", url)
	}
	return url, cmd.Process.Pid, stop, nil
}

// hearthdSetup makes a work directory (prefix), builds hearthd into it
// unless *bin names one (and sets *bin), and opens logPath, if given, for
// hearthd's and Ollama's output (nil writer otherwise); cleanup closes the
// log and removes the directory.
func hearthdSetup(ctx context.Context, log *slog.Logger, prefix string, bin *string, logPath string) (work string, logw io.Writer, cleanup func(), err error) {
	if work, err = os.MkdirTemp("", prefix); err != nil {
		return "", nil, nil, fmt.Errorf("work dir: %w", err)
	}
	cleanup = func() { os.RemoveAll(work) }
	if *bin == "" {
		*bin = filepath.Join(work, "hearthd")
		log.Info("building hearthd")
		if out, err := exec.CommandContext(ctx, "go", "build", "-o", *bin, "./cmd/hearthd").CombinedOutput(); err != nil {
			cleanup()
			return "", nil, nil, fmt.Errorf("build hearthd: %w: %s", err, out)
		}
	}
	if logPath == "" {
		return work, nil, cleanup, nil
	}
	f, err := os.Create(logPath)
	if err != nil {
		cleanup()
		return "", nil, nil, fmt.Errorf("hearthd log: %w", err)
	}
	return work, f, func() { f.Close(); os.RemoveAll(work) }, nil
}
