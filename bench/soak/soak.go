package soak

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// SoakOptions configure the soak: hearthd supervising a real `ollama serve`
// with the tiny model, under the mixed traffic of a deployment in use for
// Duration.
type SoakOptions struct {
	HearthdBin, OllamaBin string
	WorkDir               string
	Duration              time.Duration
	// Streams is the closed-loop streamed chats (32 tokens each) beside the
	// client that abandons a long stream after 0.3 s in a loop and the
	// Responses and embeddings clients.
	Streams int
	// Warmup is the same load before the start sample, not counted
	// (default 30 s): what hearthd allocates once (pools, buffers, the
	// runtime's connections) is in both samples.
	Warmup time.Duration
	// Settle is how long after the load (the warm-up's and the
	// measured one's) a sample waits, the clients' connections closed
	// (default 15 s).
	Settle time.Duration
	// Log receives hearthd's and Ollama's output beside the file the soak
	// reads it from; nil: the file only.
	Log io.Writer
}

// The soak's targets (BENCHMARKS.md, "Soak").
const (
	soakMinSuccess  = 0.99
	soakMaxWait     = 30 * time.Second
	soakMaxRecovery = 15 * time.Second
	soakMaxGrowth   = 0.10
)

// SoakKind is what one kind of client saw.
type SoakKind struct {
	Requests int            `json:"requests"`
	ByStatus map[string]int `json:"by_status"` // "200", "503", "200+error" (a stream ended by an error event), "transport"
	// Abandoned requests were left by their client on purpose; they count
	// neither as failed nor as successful.
	Abandoned int `json:"abandoned"`
	Failed    int `json:"failed"`
}

// SoakSample is hearthd's footprint at one moment.
type SoakSample struct {
	RSS         int64 `json:"rss_bytes"`
	Goroutines  int   `json:"goroutines"`
	Descriptors int   `json:"descriptors"`
}

// SoakResult is one soak's report.
type SoakResult struct {
	OllamaVersion string               `json:"ollama_version"`
	Duration      time.Duration        `json:"duration_ns"`
	Elapsed       time.Duration        `json:"elapsed_ns"` // load start to the last request's end
	Streams       int                  `json:"streams"`
	Kinds         map[string]*SoakKind `json:"kinds"`
	// FailedShare is the failed requests among those the client did not
	// abandon.
	FailedShare float64 `json:"failed_share"`
	// TTFT of the streamed chats that succeeded.
	TTFTP50 time.Duration `json:"ttft_p50_ns"`
	TTFTP99 time.Duration `json:"ttft_p99_ns"`
	// MaxWait is the longest any request waited for its answer to start
	// (headers, then a stream's first token).
	MaxWait time.Duration `json:"max_wait_ns"`
	Wedges  int           `json:"wedges"`
	// Restarts by reason (wedged, exited), from hearthd's metrics.
	Restarts map[string]int `json:"restarts"`
	// Recoveries are the restarts' times from the wedge found (or the
	// exit) to the model served again, from hearthd's log.
	Recoveries []time.Duration `json:"recoveries_ns"`
	Start      SoakSample      `json:"start"`
	End        SoakSample      `json:"end"`
}

// RunSoak starts hearthd supervising Ollama and drives the mixed load at
// it for o.Duration.
func RunSoak(ctx context.Context, o SoakOptions) (*SoakResult, error) {
	if o.OllamaBin == "" {
		bin, err := ollamatest.FindBinary()
		if err != nil {
			return nil, err
		}
		o.OllamaBin = bin
	}
	if o.Streams <= 0 {
		o.Streams = 16
	}
	if o.Warmup <= 0 {
		o.Warmup = 30 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = 15 * time.Second
	}
	dir := filepath.Join(o.WorkDir, "soak")
	state := filepath.Join(dir, "state")
	if err := bench.EnsureDir(state); err != nil {
		return nil, err
	}
	gguf, tmpl := filepath.Join(dir, "tiny.gguf"), filepath.Join(dir, "tiny.template")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{}); err != nil {
		return nil, fmt.Errorf("write tiny model: %w", err)
	}
	if err := os.WriteFile(tmpl, []byte(tinymodel.Template), 0o644); err != nil {
		return nil, fmt.Errorf("write tiny model template: %w", err)
	}
	key, err := bench.CreateKey(ctx, o.HearthdBin, state, "soak")
	if err != nil {
		return nil, err
	}
	ollamaAddr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "hearthd.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("hearthd log: %w", err)
	}
	defer logf.Close()
	var logw io.Writer = logf
	if o.Log != nil {
		logw = io.MultiWriter(logf, o.Log)
	}
	const model = "soak-tiny"
	// hearthd as it ships: its admission and wedge defaults, Ollama
	// supervised (so a wedge is restarted).
	h, err := bench.StartHearthd(ctx, bench.HearthdOptions{Bin: o.HearthdBin, StateDir: state, Model: model,
		OllamaURL: "http://" + ollamaAddr, Log: logw, ReadyTimeout: 3 * time.Minute,
		Extra: []string{"--ollama-start", "--ollama-bin", o.OllamaBin, "--ollama-models-dir", filepath.Join(dir, "models"),
			"--model-gguf", gguf, "--model-template", tmpl, "--log-level", "info",
			// One thread: the runner's threads wait for each other at every
			// token, which on a shared machine costs more than it gains.
			"--model-param", "num_thread=1"}})
	if err != nil {
		return nil, err
	}
	defer func() { _ = h.Stop() }()
	res := &SoakResult{Duration: o.Duration, Streams: o.Streams, Kinds: map[string]*SoakKind{}, Restarts: map[string]int{}}
	if v, err := ollamaVersion(ctx, "http://"+ollamaAddr); err == nil {
		res.OllamaVersion = v
	}
	sc := &soakClient{base: h.URL + "/api/v1", key: key, model: model, hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	for _, k := range []func(context.Context) soakOutcome{sc.chat, sc.responses, sc.embeddings} {
		if out := k(ctx); out.status != "200" {
			return nil, fmt.Errorf("first request: %s", out.status)
		}
	}
	// The load stopped, the clients gone: what hearthd holds then.
	sample := func() (SoakSample, error) {
		sc.hc.CloseIdleConnections()
		select {
		case <-ctx.Done():
			return SoakSample{}, ctx.Err()
		case <-time.After(o.Settle):
		}
		return soakSample(ctx, h)
	}
	sc.drive(ctx, o.Warmup, o.Streams, func(string, soakOutcome) {})
	if res.Start, err = sample(); err != nil {
		return nil, err
	}

	var mu sync.Mutex
	var ttfts []time.Duration
	start := time.Now()
	sc.drive(ctx, o.Duration, o.Streams, func(kind string, out soakOutcome) {
		mu.Lock()
		defer mu.Unlock()
		k := res.Kinds[kind]
		if k == nil {
			k = &SoakKind{ByStatus: map[string]int{}}
			res.Kinds[kind] = k
		}
		k.Requests++
		k.ByStatus[out.status]++
		res.MaxWait = max(res.MaxWait, out.wait)
		switch {
		case out.abandoned:
			k.Abandoned++
		case out.status != "200":
			k.Failed++
		case kind == "chat_stream":
			ttfts = append(ttfts, out.wait)
		}
	})
	res.Elapsed = time.Since(start)

	var total, failed int
	for _, k := range res.Kinds {
		total += k.Requests - k.Abandoned
		failed += k.Failed
	}
	if total > 0 {
		res.FailedShare = float64(failed) / float64(total)
	}
	slices.Sort(ttfts)
	res.TTFTP50, res.TTFTP99 = bench.Percentile(ttfts, 50), bench.Percentile(ttfts, 99)
	if v, err := bench.ReadMetric(ctx, h.MetricsURL, "hearth_runtime_wedges_total"); err == nil {
		res.Wedges = int(v)
	}
	for _, reason := range []string{"wedged", "exited"} {
		if v, err := bench.ReadMetric(ctx, h.MetricsURL, `hearth_runtime_restarts_total{reason="`+reason+`"}`); err == nil {
			res.Restarts[reason] = int(v)
		}
	}
	if res.End, err = sample(); err != nil {
		return nil, err
	}
	if res.Recoveries, err = recoveries(logPath); err != nil {
		return nil, err
	}
	return res, nil
}

// drive runs the mixed load for d and passes each request's outcome to
// record: streams closed-loop streamed chats, one client leaving a long
// stream after 0.3 s in a loop, a Responses and an embeddings client.
func (c *soakClient) drive(ctx context.Context, d time.Duration, streams int, record func(kind string, out soakOutcome)) {
	lctx, stop := context.WithTimeout(ctx, d)
	defer stop()
	var wg sync.WaitGroup
	loop := func(kind string, pause time.Duration, do func(context.Context) soakOutcome) {
		wg.Go(func() {
			for lctx.Err() == nil {
				// A request started is finished, whatever the clock says:
				// its outcome is what the soak measures (ctx ends it only
				// when the soak is stopped).
				record(kind, do(ctx))
				if pause > 0 {
					select {
					case <-lctx.Done():
					case <-time.After(pause):
					}
				}
			}
		})
	}
	for range streams {
		loop("chat_stream", 0, c.chat)
	}
	loop("chat_abandoned", 0, c.abandon)
	loop("responses", 250*time.Millisecond, c.responses)
	loop("embeddings", 250*time.Millisecond, c.embeddings)
	wg.Wait()
}

// soakOutcome is one request's end.
type soakOutcome struct {
	status    string
	wait      time.Duration // to the answer's start: headers, and a stream's first token
	abandoned bool
}

type soakClient struct {
	base, key, model string
	hc               *http.Client
}

func (c *soakClient) post(ctx context.Context, path, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Content-Type", "application/json")
	return c.hc.Do(req)
}

// chat streams 32 tokens.
func (c *soakClient) chat(ctx context.Context) soakOutcome {
	return c.stream(ctx, 32, 0)
}

// abandon asks for a 500-token stream and leaves it after 0.3 s.
func (c *soakClient) abandon(ctx context.Context) soakOutcome {
	return c.stream(ctx, 500, 300*time.Millisecond)
}

func (c *soakClient) stream(ctx context.Context, tokens int, leaveAfter time.Duration) soakOutcome {
	began := time.Now()
	if leaveAfter > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, leaveAfter)
		defer cancel()
	}
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":"Tell me a long story about a fox and a dog."}]}`, c.model, tokens)
	resp, err := c.post(ctx, "/chat/completions", body)
	if err != nil {
		return soakOutcome{status: "transport", wait: time.Since(began), abandoned: ctx.Err() != nil}
	}
	defer resp.Body.Close()
	out := soakOutcome{status: fmt.Sprint(resp.StatusCode), wait: time.Since(began)}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return out
	}
	r := bench.NewSSEReader(resp.Body)
	first := false
	for {
		data, err := r.Next()
		if err != nil {
			if ctx.Err() != nil {
				out.abandoned = true
			} else {
				out.status = "200+cut" // ended without [DONE]
			}
			return out
		}
		ch := bench.ClassifyChunk(data)
		switch {
		case ch.Error:
			out.status = "200+error"
			return out
		case ch.Done:
			return out
		case ch.ContentLen > 0 && !first:
			first = true
			out.wait = time.Since(began)
		}
	}
}

func (c *soakClient) responses(ctx context.Context) soakOutcome {
	return c.whole(ctx, "/responses", fmt.Sprintf(`{"model":%q,"max_output_tokens":16,"input":"Say hello."}`, c.model))
}

func (c *soakClient) embeddings(ctx context.Context) soakOutcome {
	return c.whole(ctx, "/embeddings", fmt.Sprintf(`{"model":%q,"input":"a fox and a dog"}`, c.model))
}

// whole sends a request whose answer comes whole.
func (c *soakClient) whole(ctx context.Context, path, body string) soakOutcome {
	began := time.Now()
	resp, err := c.post(ctx, path, body)
	if err != nil {
		return soakOutcome{status: "transport", wait: time.Since(began)}
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return soakOutcome{status: fmt.Sprint(resp.StatusCode), wait: time.Since(began)}
}

// soakSample reads hearthd's RSS, goroutines and open descriptors.
func soakSample(ctx context.Context, h *bench.Hearthd) (SoakSample, error) {
	p, err := bench.ReadProc(h.PID)
	if err != nil {
		return SoakSample{}, err
	}
	g, err := bench.ReadMetric(ctx, h.MetricsURL, "go_goroutines")
	if err != nil {
		return SoakSample{}, err
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", h.PID))
	if err != nil {
		return SoakSample{}, fmt.Errorf("hearthd's descriptors: %w", err)
	}
	return SoakSample{RSS: p.RSS, Goroutines: int(g), Descriptors: len(fds)}, nil
}

// recoveryLine is hearthd's log line for a restart that is over.
var recoveryLine = regexp.MustCompile(`msg="model runtime restarted and the model loaded again" took=(\S+)`)

// recoveries reads every restart's time from the wedge (or exit) to the
// model served again from hearthd's log.
func recoveries(logPath string) ([]time.Duration, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, fmt.Errorf("hearthd log: %w", err)
	}
	defer f.Close()
	var out []time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if m := recoveryLine.FindSubmatch(sc.Bytes()); m != nil {
			if d, err := time.ParseDuration(string(m[1])); err == nil {
				out = append(out, d)
			}
		}
	}
	return out, sc.Err()
}

func ollamaVersion(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/version", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var v struct{ Version string }
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return "", fmt.Errorf("ollama version: %w", err)
	}
	return v.Version, nil
}

// Met reports each target (BENCHMARKS.md, "Soak") and whether the run met
// it.
func (r *SoakResult) Met() []SoakTarget {
	grow := func(a, b float64) bool { return b <= a*(1+soakMaxGrowth) }
	slowest := time.Duration(0)
	for _, d := range r.Recoveries {
		slowest = max(slowest, d)
	}
	return []SoakTarget{
		{"≥ 99 % of the requests not abandoned succeed", fmt.Sprintf("%.2f %%", 100*(1-r.FailedShare)), r.FailedShare <= 1-soakMinSuccess},
		{"no request waits longer than 30 s", r.MaxWait.Round(time.Millisecond).String(), r.MaxWait <= soakMaxWait},
		{"every wedge recovered within 15 s", fmt.Sprintf("%d recover(ies), slowest %s", len(r.Recoveries), slowest.Round(time.Millisecond)),
			slowest <= soakMaxRecovery && len(r.Recoveries) >= r.Restarts["wedged"]},
		{"RSS within 10 % of its start", fmt.Sprintf("%s → %s bench.MiB", bench.MiB(r.Start.RSS), bench.MiB(r.End.RSS)), grow(float64(r.Start.RSS), float64(r.End.RSS))},
		{"goroutines within 10 % of their start", fmt.Sprintf("%d → %d", r.Start.Goroutines, r.End.Goroutines), grow(float64(r.Start.Goroutines), float64(r.End.Goroutines))},
		{"descriptors within 10 % of their start", fmt.Sprintf("%d → %d", r.Start.Descriptors, r.End.Descriptors), grow(float64(r.Start.Descriptors), float64(r.End.Descriptors))},
	}
}

// SoakTarget is one target and the run's value.
type SoakTarget struct {
	Target string
	Value  string
	Met    bool
}

// Markdown renders the report.
func (r *SoakResult) Markdown() string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "Soak (Ollama %s supervised by hearthd, the tiny model, hearthd's defaults; %s of load: %d streamed chats of 32 tokens, "+
		"a client leaving a 500-token stream after 0.3 s in a loop, Responses and embeddings every 0.25 s; took %s):\n\n",
		r.OllamaVersion, r.Duration, r.Streams, r.Elapsed.Round(time.Second))
	b.WriteString("| requests | total | by status | abandoned | failed |\n|---|---|---|---|---|\n")
	kinds := make([]string, 0, len(r.Kinds))
	for k := range r.Kinds {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, name := range kinds {
		k := r.Kinds[name]
		codes := make([]string, 0, len(k.ByStatus))
		for c, n := range k.ByStatus {
			codes = append(codes, fmt.Sprintf("%s × %d", c, n))
		}
		slices.Sort(codes)
		fmt.Fprintf(&b, "| %s | %d | %s | %d | %d |\n", name, k.Requests, strings.Join(codes, ", "), k.Abandoned, k.Failed)
	}
	recs := make([]string, len(r.Recoveries))
	for i, d := range r.Recoveries {
		recs[i] = d.Round(10 * time.Millisecond).String()
	}
	fmt.Fprintf(&b, "\nTTFT of the streamed chats p50 %s, p99 %s; wedges found %d; restarts %d wedged, %d exited; recoveries [%s].\n\n",
		r.TTFTP50.Round(time.Millisecond), r.TTFTP99.Round(time.Millisecond), r.Wedges, r.Restarts["wedged"], r.Restarts["exited"], strings.Join(recs, " "))
	b.WriteString("| target | this run | met |\n|---|---|---|\n")
	for _, t := range r.Met() {
		met := "yes"
		if !t.Met {
			met = "**no**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Target, t.Value, met)
	}
	return b.String()
}
