package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/hearthd/hearth/internal/nginxtest"
)

// Scenario is one load shape, driven once directly at the runtime and once
// through hearthd.
type Scenario struct {
	Name string `json:"name"`
	// Concurrency is the number of closed-loop streams, or with Rate the cap
	// on requests in flight.
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"rate,omitempty"`
	// Duration and Ramp as in LoadConfig.
	Duration time.Duration `json:"duration_ns"`
	Ramp     time.Duration `json:"ramp_ns,omitempty"`
	// Tokens per response, asked for with max_tokens.
	Tokens int `json:"tokens"`
	// Mock paces the mock runtime (ignored for a real runtime).
	Mock MockConfig `json:"mock"`
}

// Side is what the load generator measured against one target.
type Side struct {
	Target        string   `json:"target"`
	Requests      int      `json:"requests"`
	Completed     int      `json:"completed"`
	Errors        int      `json:"errors"`
	ErrorSamples  []string `json:"error_samples,omitempty"`
	Tokens        int64    `json:"tokens"`
	ElapsedS      float64  `json:"elapsed_s"`
	TTFT          Dist     `json:"ttft"`
	Gap           Dist     `json:"inter_token"`
	Total         Dist     `json:"total"`
	CompletionsPS float64  `json:"completions_per_s"`
	TokensPS      float64  `json:"tokens_per_s"`
	LoadgenCPUS   float64  `json:"loadgen_cpu_s"`
	MockCPUS      float64  `json:"mock_cpu_s,omitempty"`
	// The proxy's (hearthd's, or nginx's: master and workers summed) CPU
	// and memory.
	ProxyCPUS float64 `json:"proxy_cpu_s,omitempty"`
	// ProxyCPUS split into user and system time.
	ProxyUserS   float64 `json:"proxy_user_s,omitempty"`
	ProxySysS    float64 `json:"proxy_sys_s,omitempty"`
	ProxyRSSPeak int64   `json:"proxy_rss_peak_bytes,omitempty"`
	ProxyHWM     int64   `json:"proxy_hwm_bytes,omitempty"`
}

// CPUusPerToken is the proxy's CPU per relayed token, in microseconds.
func (s Side) CPUusPerToken() float64 {
	if s.Tokens == 0 {
		return 0
	}
	return s.ProxyCPUS / float64(s.Tokens) * 1e6
}

// CPUSplitusPerToken is CPUusPerToken split into user and system time.
func (s Side) CPUSplitusPerToken() (user, sys float64) {
	if s.Tokens == 0 {
		return 0, 0
	}
	return s.ProxyUserS / float64(s.Tokens) * 1e6, s.ProxySysS / float64(s.Tokens) * 1e6
}

// ScenarioResult compares the sides of a scenario: the runtime directly,
// through nginx (if the suite has one) and through hearthd.
type ScenarioResult struct {
	Scenario Scenario `json:"scenario"`
	// Transport is how clients reached hearthd and nginx: "tls" (the
	// production path) or "http".
	Transport string `json:"transport"`
	Direct    Side   `json:"direct"`
	Nginx     *Side  `json:"nginx,omitempty"`
	Through   Side   `json:"through"`
	// Added time to first token: through minus direct, per percentile.
	AddedTTFTP50us float64 `json:"added_ttft_p50_us"`
	AddedTTFTP99us float64 `json:"added_ttft_p99_us"`
	// hearthd's CPU per relayed token.
	HearthdCPUSPerMTokens float64 `json:"hearthd_cpu_s_per_million_tokens"`
	HearthdCPUusPerToken  float64 `json:"hearthd_cpu_us_per_token"`
	// HearthdMallocsPerRequest is hearthd's heap allocations (its
	// go_memstats_mallocs_total) over the through side per completed
	// request; 0 if the counter could not be read.
	HearthdMallocsPerRequest float64 `json:"hearthd_mallocs_per_request,omitempty"`
}

// Suite runs scenarios against a mock runtime, directly and through hearthd.
type Suite struct {
	// HearthdBin is the hearthd binary.
	HearthdBin string
	// MockURL is the base URL of a running Mock; MockPID its process, or 0
	// when it runs inside this process (its CPU is then in the loadgen's).
	MockURL string
	MockPID int
	Model   string
	// WorkDir holds hearthd's state directories.
	WorkDir string
	// HearthdLog receives hearthd's output; nil discards it.
	HearthdLog io.Writer
	// HearthdArgs are extra `hearthd serve` arguments (e.g. a profile flag).
	HearthdArgs []string
	// MaxStreams sizes hearthd's admission limits.
	MaxStreams int
	// Verify decodes every chunk fully (slow; for tests).
	Verify bool
	// ProfileDir, if set, receives hearthd's CPU, heap and goroutine
	// profiles for every scenario, taken during its through side.
	ProfileDir string
	// ProfileRamp starts those profiles with the load, its execution
	// trace covering the ramp, instead of after the ramp.
	ProfileRamp bool
	// Nginx, if set, is a reverse proxy in front of the mock: every
	// scenario is also driven through it, the cost of one tuned hop.
	Nginx *nginxtest.Proxy
	// TLS, if set, has hearthd (and Nginx, which must be started with the
	// same files) serve HTTPS.
	TLS *TLSFiles
	Log *slog.Logger

	key      string
	stateDir string
}

// Setup creates hearthd's state directory and API key.
func (s *Suite) Setup(ctx context.Context) error {
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	s.stateDir = filepath.Join(s.WorkDir, "hearthd-state")
	if err := EnsureDir(s.stateDir); err != nil {
		return err
	}
	key, err := CreateKey(ctx, s.HearthdBin, s.stateDir, "bench")
	if err != nil {
		return err
	}
	s.key = key
	return nil
}

// StartHearthd starts hearthd in front of the mock.
func (s *Suite) StartHearthd(ctx context.Context) (*Hearthd, error) {
	n := max(s.MaxStreams, 16)
	return StartHearthd(ctx, HearthdOptions{
		Bin: s.HearthdBin, StateDir: s.stateDir, Model: s.Model, OllamaURL: s.MockURL,
		MaxConcurrent: n, MaxQueue: n, Log: s.HearthdLog, Extra: s.HearthdArgs, TLS: s.TLS,
	})
}

// Transport is "tls" when hearthd serves HTTPS, else "http".
func (s *Suite) Transport() string {
	if s.TLS != nil {
		return "tls"
	}
	return "http"
}

// ClientTLS is the TLS configuration of the proxied sides, nil for plain HTTP.
func (s *Suite) ClientTLS() *tls.Config {
	if s.TLS == nil {
		return nil
	}
	return s.TLS.Client
}

// SetMock changes the mock's pace.
func (s *Suite) SetMock(ctx context.Context, c MockConfig) error {
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("encode mock config: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.MockURL+"/mock/config", bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("mock config request: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("set mock config: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("set mock config: status %d", resp.StatusCode)
	}
	return nil
}

// RunScenario drives sc against the mock directly, then through h.
func (s *Suite) RunScenario(ctx context.Context, h *Hearthd, sc Scenario) (ScenarioResult, error) {
	res := ScenarioResult{Scenario: sc, Transport: s.Transport()}
	mc := sc.Mock
	mc.Tokens = max(mc.Tokens, sc.Tokens)
	if err := s.SetMock(ctx, mc); err != nil {
		return res, err
	}
	lc := LoadConfig{
		Model: s.Model, MaxTokens: sc.Tokens, Concurrency: sc.Concurrency, Rate: sc.Rate,
		Duration: sc.Duration, Ramp: sc.Ramp, ExpectTokens: sc.Tokens, Verify: s.Verify,
	}
	lc.Target = s.MockURL + "/v1"
	direct, err := MeasureSide(ctx, lc, s.MockPID)
	if err != nil {
		return res, fmt.Errorf("%s direct: %w", sc.Name, err)
	}
	if s.Nginx != nil {
		nlc := lc
		nlc.Target, nlc.TLS = s.Nginx.URL+"/v1", s.ClientTLS()
		ng, err := MeasureSide(ctx, nlc, s.MockPID, s.Nginx.PIDs()...)
		if err != nil {
			return res, fmt.Errorf("%s through nginx: %w", sc.Name, err)
		}
		res.Nginx = &ng
		// Let nginx's client connections close before hearthd's turn.
		time.Sleep(time.Second)
	}
	lc.Target, lc.Key, lc.TLS = h.URL+"/api/v1", s.key, s.ClientTLS()
	mallocs0, mallocsErr := ReadMallocs(ctx, h.MetricsURL)
	var profiled func() error
	if s.ProfileDir != "" {
		profiled = profileHearthd(ctx, h.MetricsURL, s.ProfileDir, sc, s.ProfileRamp)
	}
	through, err := MeasureSide(ctx, lc, s.MockPID, h.PID)
	var mallocs1 float64
	if mallocsErr == nil && err == nil {
		mallocs1, mallocsErr = ReadMallocs(ctx, h.MetricsURL)
	}
	if profiled != nil {
		if perr := profiled(); perr != nil {
			s.Log.Warn("profile hearthd", "scenario", sc.Name, "err", perr)
		}
	}
	if err != nil {
		return res, fmt.Errorf("%s through hearthd: %w", sc.Name, err)
	}
	res.Direct, res.Through = direct, through
	res.AddedTTFTP50us = through.TTFT.P50 - direct.TTFT.P50
	res.AddedTTFTP99us = through.TTFT.P99 - direct.TTFT.P99
	if through.Tokens > 0 {
		res.HearthdCPUSPerMTokens = through.CPUusPerToken()
		res.HearthdCPUusPerToken = res.HearthdCPUSPerMTokens
	}
	// A missing figure is not worth the run: the report shows n/a.
	switch {
	case mallocsErr != nil:
		s.Log.Warn("hearthd mallocs per request", "scenario", sc.Name, "err", mallocsErr)
	case through.Completed > 0:
		res.HearthdMallocsPerRequest = (mallocs1 - mallocs0) / float64(through.Completed)
	}
	s.Log.Info("scenario done", "name", sc.Name,
		"direct_ttft_p50_us", direct.TTFT.P50, "through_ttft_p50_us", through.TTFT.P50,
		"through_tokens_per_s", through.TokensPS, "errors", direct.Errors+through.Errors)
	return res, nil
}

// MeasureSide runs one load and samples the CPU of this process, of the
// mock (mockPID, if not 0) and of the proxy's processes (hearthd, or
// nginx's master and workers), and the proxy's memory, summed over them.
func MeasureSide(ctx context.Context, lc LoadConfig, mockPID int, proxyPIDs ...int) (Side, error) {
	side := Side{Target: lc.Target}
	self0 := SelfCPU()
	var mock0 ProcSample
	var err error
	if mockPID != 0 {
		if mock0, err = ReadProc(mockPID); err != nil {
			return side, err
		}
	}
	proxy0, err := readProcs(proxyPIDs)
	if err != nil {
		return side, err
	}
	var (
		peak   = proxy0.RSS
		wg     sync.WaitGroup
		stopMu sync.Mutex
	)
	stop := make(chan struct{})
	if len(proxyPIDs) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					if p, err := readProcs(proxyPIDs); err == nil {
						stopMu.Lock()
						peak = max(peak, p.RSS)
						stopMu.Unlock()
					}
				}
			}
		}()
	}
	r, err := RunLoad(ctx, lc)
	close(stop)
	wg.Wait()
	if err != nil {
		return side, err
	}
	side.LoadgenCPUS = (SelfCPU() - self0).Seconds()
	if mockPID != 0 {
		if p, err := ReadProc(mockPID); err == nil {
			side.MockCPUS = (p.CPU - mock0.CPU).Seconds()
		}
	}
	if len(proxyPIDs) > 0 {
		p, err := readProcs(proxyPIDs)
		if err != nil {
			return side, err
		}
		side.ProxyCPUS = (p.CPU - proxy0.CPU).Seconds()
		side.ProxyUserS = (p.User - proxy0.User).Seconds()
		side.ProxySysS = (p.Sys - proxy0.Sys).Seconds()
		side.ProxyRSSPeak = max(peak, p.RSS)
		side.ProxyHWM = p.HWM
	}
	fillSide(&side, r)
	return side, nil
}

// readProcs sums the samples of several processes (nginx's master and
// workers); none is a zero sample.
func readProcs(pids []int) (ProcSample, error) {
	var sum ProcSample
	for _, pid := range pids {
		p, err := ReadProc(pid)
		if err != nil {
			return sum, err
		}
		sum.CPU += p.CPU
		sum.User += p.User
		sum.Sys += p.Sys
		sum.RSS += p.RSS
		sum.HWM += p.HWM
	}
	return sum, nil
}

func fillSide(side *Side, r *LoadResult) {
	side.Requests, side.Completed, side.Errors = r.Requests, r.Completed, r.Errors
	side.ErrorSamples = r.ErrorSamples
	side.Tokens = r.Tokens
	side.ElapsedS = r.Elapsed.Seconds()
	side.TTFT, side.Gap, side.Total = Summarize(r.TTFT), Summarize(r.Gaps), Summarize(r.Total)
	if e := r.Elapsed.Seconds(); e > 0 {
		side.CompletionsPS = float64(r.Completed) / e
		side.TokensPS = float64(r.Tokens) / e
	}
}

// ColdStartResult compares the first request after hearthd starts with the
// steady state, and with a request straight to the runtime after the same
// pause: a runtime left idle (its threads asleep, its caches cold) answers
// its next request slower whoever sends it, so only the second comparison
// tells hearthd's own part.
type ColdStartResult struct {
	Runs int `json:"runs"`
	// FirstTTFTus is the first request's TTFT in each run.
	FirstTTFTus []float64 `json:"first_ttft_us"`
	// SteadyTTFT is the TTFT of the sequential requests that followed.
	SteadyTTFT   Dist    `json:"steady_ttft"`
	FirstMedian  float64 `json:"first_ttft_median_us"`
	Ratio        float64 `json:"first_over_steady_p50"`
	StartToReady float64 `json:"start_to_ready_ms_median"`
	// IdleMs is, in each run, how long the runtime had had no request
	// from the benchmark before hearthd's first request (hearthd's stop,
	// start and readiness; hearthd's own start-up requests fall in it).
	IdleMs []float64 `json:"idle_ms,omitempty"`
	// DirectIdleTTFTus is, in each run, the TTFT of one request sent
	// straight to the runtime after it was left idle as long again.
	DirectIdleTTFTus []float64 `json:"direct_idle_ttft_us,omitempty"`
	DirectIdleMedian float64   `json:"direct_idle_ttft_median_us,omitempty"`
	// IdleRatio is FirstMedian over DirectIdleMedian.
	IdleRatio float64 `json:"first_over_direct_idle,omitempty"`
}

// Markdown is the result's line in a report; runtime names the runtime.
func (c *ColdStartResult) Markdown(runtime string) string {
	line := fmt.Sprintf("First request after hearthd start (%s, %d restarts): TTFT median %s vs steady p50 %s → **%.2f×**",
		runtime, c.Runs, us(c.FirstMedian), us(c.SteadyTTFT.P50), c.Ratio)
	if c.DirectIdleMedian > 0 {
		line += fmt.Sprintf("; straight to the runtime after the same pause (median %.0f ms) %s → hearthd's first request **%.2f×** that",
			medianUs(c.IdleMs), us(c.DirectIdleMedian), c.IdleRatio)
	}
	return line + fmt.Sprintf("; start → ready median %.0f ms.\n\n", c.StartToReady)
}

// maxColdIdle bounds the pause before the direct request of a cold-start
// run (a run's idle time is normally well under a second).
const maxColdIdle = 10 * time.Second

// ColdStart restarts hearthd runs times; each time it sends one request as
// soon as /readyz answers, then, if direct names the runtime (Target set),
// one request straight to the runtime after the same idle time, then steady
// sequential requests through hearthd.
func ColdStart(ctx context.Context, runs, steady int, start func(context.Context) (*Hearthd, error), lc, direct LoadConfig) (ColdStartResult, error) {
	res := ColdStartResult{Runs: runs}
	var steadyTTFT []time.Duration
	var readies []time.Duration
	// lastBusy is when the runtime last served the benchmark: before the
	// first run, whatever ran before ColdStart was called.
	lastBusy := time.Now()
	for i := range runs {
		h, err := start(ctx)
		if err != nil {
			return res, fmt.Errorf("cold start %d: %w", i, err)
		}
		readies = append(readies, h.Ready.Sub(h.Started))
		err = coldRun(ctx, &res, h, lc, direct, steady, lastBusy, &steadyTTFT)
		lastBusy = time.Now()
		if stopErr := h.Stop(); stopErr != nil && err == nil {
			err = stopErr
		}
		if err != nil {
			return res, fmt.Errorf("cold start %d: %w", i, err)
		}
	}
	res.SteadyTTFT = Summarize(steadyTTFT)
	res.FirstMedian = medianUs(res.FirstTTFTus)
	if res.SteadyTTFT.P50 > 0 {
		res.Ratio = res.FirstMedian / res.SteadyTTFT.P50
	}
	if len(res.DirectIdleTTFTus) > 0 {
		res.DirectIdleMedian = medianUs(res.DirectIdleTTFTus)
		if res.DirectIdleMedian > 0 {
			res.IdleRatio = res.FirstMedian / res.DirectIdleMedian
		}
	}
	res.StartToReady = Summarize(readies).P50 / 1e3
	return res, nil
}

// coldRun is one run of ColdStart against a hearthd just started.
func coldRun(ctx context.Context, res *ColdStartResult, h *Hearthd, lc, direct LoadConfig, steady int, lastBusy time.Time, steadyTTFT *[]time.Duration) error {
	one := func(lc LoadConfig) (time.Duration, error) {
		lc.Concurrency, lc.Rate, lc.Duration, lc.Requests = 1, 0, 0, 1
		r, err := RunLoad(ctx, lc)
		if err == nil && (r.Errors > 0 || len(r.TTFT) != 1) {
			err = fmt.Errorf("request to %s failed: %v", lc.Target, r.ErrorSamples)
		}
		if err != nil {
			return 0, err
		}
		return r.TTFT[0], nil
	}
	lc.Target = h.URL + "/api/v1"
	idle := time.Since(lastBusy)
	first, err := one(lc)
	if err != nil {
		return fmt.Errorf("first request: %w", err)
	}
	res.FirstTTFTus = append(res.FirstTTFTus, float64(first)/1e3)
	if direct.Target != "" {
		idle = min(idle, maxColdIdle)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(idle):
		}
		d, err := one(direct)
		if err != nil {
			return fmt.Errorf("direct request after the pause: %w", err)
		}
		res.IdleMs = append(res.IdleMs, float64(idle)/1e6)
		res.DirectIdleTTFTus = append(res.DirectIdleTTFTus, float64(d)/1e3)
	}
	lc.Concurrency, lc.Rate, lc.Duration, lc.Requests = 1, 0, 0, steady
	rest, err := RunLoad(ctx, lc)
	if err == nil && rest.Errors > 0 {
		err = fmt.Errorf("steady requests failed: %v", rest.ErrorSamples)
	}
	if err != nil {
		return err
	}
	*steadyTTFT = append(*steadyTTFT, rest.TTFT...)
	return nil
}

// medianUs is the median of values in µs.
func medianUs(vs []float64) float64 {
	ds := make([]time.Duration, len(vs))
	for i, v := range vs {
		ds[i] = time.Duration(v * 1e3)
	}
	return Summarize(ds).P50
}

// writeFile writes data to path through a temporary file and a rename, so a
// reader never sees half a report.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename %s: %w", tmp, err)
	}
	return nil
}

// Key is the API key Setup created.
func (s *Suite) Key() string { return s.key }
