package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/internal/nginxtest"
	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// Ollama is a private `ollama serve` on loopback.
type Ollama struct {
	URL    string
	PID    int
	cmd    *exec.Cmd
	exited chan error
}

// StartOllama starts bin serve on a free loopback port with its models and
// keys under dir, and waits until it answers.
func StartOllama(ctx context.Context, bin, dir string, log io.Writer) (*Ollama, error) {
	addr, err := testutil.FreeAddr()
	if err != nil {
		return nil, err
	}
	models := filepath.Join(dir, "models")
	if err := EnsureDir(models); err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve")
	cmd.Dir = dir
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + dir,
		"OLLAMA_HOST=" + addr,
		"OLLAMA_MODELS=" + models,
		"OLLAMA_NOPRUNE=1",
	}
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, so Stop also ends the runner it spawns.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s serve: %w", bin, err)
	}
	o := &Ollama{URL: "http://" + addr, PID: cmd.Process.Pid, cmd: cmd, exited: make(chan error, 1)}
	go func() { o.exited <- cmd.Wait() }()
	if err := waitReady(ctx, nil, o.URL+"/api/version", 30*time.Second, o.exited); err != nil {
		o.Stop()
		return nil, fmt.Errorf("ollama not ready: %w", err)
	}
	return o, nil
}

// Stop ends the process group: SIGTERM, then SIGKILL after 10 s.
func (o *Ollama) Stop() {
	_ = syscall.Kill(-o.PID, syscall.SIGTERM)
	select {
	case <-o.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-o.PID, syscall.SIGKILL)
		<-o.exited
	}
}

// RealOptions configure the real-runtime comparison.
type RealOptions struct {
	HearthdBin, OllamaBin string
	WorkDir               string
	// Rounds alternate direct and through runs of Duration each, so drift
	// on a shared machine hits both sides alike.
	Rounds      int
	Duration    time.Duration
	Concurrency int
	MaxTokens   int
	ColdRuns    int
	Log         io.Writer
	// Nginx puts a private nginx in front of the same Ollama as a third
	// side of every round.
	Nginx bool
	// TLS, if set, has clients reach hearthd and nginx over HTTPS (the
	// production path).
	TLS *TLSFiles
}

// RealRound is one direct, one nginx (if asked) and one through run.
type RealRound struct {
	Direct  Side  `json:"direct"`
	Nginx   *Side `json:"nginx,omitempty"`
	Through Side  `json:"through"`
}

// RealResult compares Ollama's own OpenAI endpoint with hearthd in front of
// the same Ollama.
type RealResult struct {
	// OllamaVersion is what the runtime's /api/version answered.
	OllamaVersion string      `json:"ollama_version"`
	Transport     string      `json:"transport"` // "tls" or "http", as ScenarioResult's
	Model         string      `json:"model"`
	Concurrency   int         `json:"concurrency"`
	MaxTokens     int         `json:"max_tokens"`
	Rounds        []RealRound `json:"rounds"`
	// Aggregates over rounds.
	DirectTokensPS  float64 `json:"direct_tokens_per_s"`
	ThroughTokensPS float64 `json:"through_tokens_per_s"`
	TokensPSRatio   float64 `json:"tokens_per_s_ratio"`
	DirectTTFTP50   float64 `json:"direct_ttft_p50_us"`
	ThroughTTFTP50  float64 `json:"through_ttft_p50_us"`
	TTFTRatio       float64 `json:"ttft_p50_ratio"`
	Errors          int     `json:"errors"`
	// HearthdCPUusPerToken is hearthd's CPU per relayed token: on a CPU
	// runtime it is taken from generation.
	HearthdCPUusPerToken float64 `json:"hearthd_cpu_us_per_token"`
	// The nginx side's aggregates, if it ran.
	NginxTokensPS      float64 `json:"nginx_tokens_per_s,omitempty"`
	NginxTTFTP50       float64 `json:"nginx_ttft_p50_us,omitempty"`
	NginxCPUusPerToken float64 `json:"nginx_cpu_us_per_token,omitempty"`
	NginxRSSPeak       int64   `json:"nginx_rss_peak_bytes,omitempty"`
	HearthdRSSPeak     int64   `json:"hearthd_rss_peak_bytes,omitempty"`
	// PairedTTFTP50 is the median over rounds of hearthd's TTFT p50 minus
	// nginx's in the same round, in µs.
	PairedTTFTP50 float64          `json:"paired_ttft_p50_us,omitempty"`
	ColdStart     *ColdStartResult `json:"cold_start,omitempty"`
}

// Markdown renders the comparison.
func (r *RealResult) Markdown() string {
	var b strings.Builder
	over := "plain HTTP"
	if r.Transport == "tls" {
		over = "TLS"
	}
	fmt.Fprintf(&b, "Real runtime (Ollama %s + %s, %d stream(s), max_tokens %d, %d alternating rounds, hearthd and nginx over %s):\n\n",
		r.OllamaVersion, r.Model, r.Concurrency, r.MaxTokens, len(r.Rounds), over)
	if r.NginxTokensPS > 0 {
		b.WriteString("| | Ollama /v1 direct | through nginx | through hearthd | hearthd / nginx |\n|---|---|---|---|---|\n")
		fmt.Fprintf(&b, "| tokens/s | %.0f | %.0f | %.0f | **%.3f×** |\n", r.DirectTokensPS, r.NginxTokensPS, r.ThroughTokensPS, ratio(r.ThroughTokensPS, r.NginxTokensPS))
		fmt.Fprintf(&b, "| TTFT p50 | %s | %s | %s | %.3f× |\n", us(r.DirectTTFTP50), us(r.NginxTTFTP50), us(r.ThroughTTFTP50), ratio(r.ThroughTTFTP50, r.NginxTTFTP50))
		fmt.Fprintf(&b, "| added TTFT p50 | | %s | %s | |\n", us(r.NginxTTFTP50-r.DirectTTFTP50), us(r.ThroughTTFTP50-r.DirectTTFTP50))
		fmt.Fprintf(&b, "| proxy CPU per token | | %.1f µs | %.1f µs | **%.2f×** |\n", r.NginxCPUusPerToken, r.HearthdCPUusPerToken, ratio(r.HearthdCPUusPerToken, r.NginxCPUusPerToken))
		fmt.Fprintf(&b, "| proxy RSS peak | | %s MiB | %s MiB | %.2f× |\n", MiB(r.NginxRSSPeak), MiB(r.HearthdRSSPeak), ratio(float64(r.HearthdRSSPeak), float64(r.NginxRSSPeak)))
		ttft, cpu := r.pairedRounds()
		fmt.Fprintf(&b, "| each round: TTFT p50 hearthd − nginx | | | %s | median %s |\n", ttft, us(r.PairedTTFTP50))
		fmt.Fprintf(&b, "| each round: proxy CPU per token | | %s | | |\n", cpu)
		fmt.Fprintf(&b, "| errors | | | | %d |\n\n", r.Errors)
	} else {
		b.WriteString("| | Ollama /v1 direct | through hearthd | ratio |\n|---|---|---|---|\n")
		fmt.Fprintf(&b, "| tokens/s | %.0f | %.0f | **%.3f×** |\n", r.DirectTokensPS, r.ThroughTokensPS, r.TokensPSRatio)
		fmt.Fprintf(&b, "| TTFT p50 | %s | %s | %.3f× |\n", us(r.DirectTTFTP50), us(r.ThroughTTFTP50), r.TTFTRatio)
		fmt.Fprintf(&b, "| errors | | | %d |\n", r.Errors)
		fmt.Fprintf(&b, "| hearthd CPU per token | | %.1f µs | |\n\n", r.HearthdCPUusPerToken)
	}
	if c := r.ColdStart; c != nil {
		b.WriteString(c.Markdown("real runtime"))
	}
	return b.String()
}

// pairedRounds lists, round by round, hearthd's TTFT p50 minus nginx's
// (the two sides of one round run back to back, so machine drift cancels
// out of the difference) and both sides' CPU per token: how far apart the
// rounds are says whether a difference of the aggregates is more than
// noise.
func (r *RealResult) pairedRounds() (ttft, cpu string) {
	var ds, cs []string
	for _, round := range r.Rounds {
		ng := round.Nginx
		if ng == nil {
			continue
		}
		ds = append(ds, fmt.Sprintf("%+.0f", round.Through.TTFT.P50-ng.TTFT.P50))
		cs = append(cs, fmt.Sprintf("%.1f / %.1f", perToken(ng), perToken(&round.Through)))
	}
	return strings.Join(ds, ", ") + " µs", strings.Join(cs, ", ") + " µs (nginx / hearthd)"
}

// perToken is s's proxy CPU per token received, in µs.
func perToken(s *Side) float64 {
	if s.Tokens == 0 {
		return 0
	}
	return s.ProxyCPUS / float64(s.Tokens) * 1e6
}

// aggregate sets the aggregates over r.Rounds.
func (r *RealResult) aggregate() {
	var dTok, tTok, dSec, tSec, dTTFT, tTTFT, hCPU float64
	var nTok, nSec, nTTFT, nCPU float64
	var paired []float64
	r.Errors = 0
	for _, round := range r.Rounds {
		if ng := round.Nginx; ng != nil {
			paired = append(paired, round.Through.TTFT.P50-ng.TTFT.P50)
			nTok += float64(ng.Tokens)
			nSec += ng.ElapsedS
			nTTFT += ng.TTFT.P50
			nCPU += ng.ProxyCPUS
			r.NginxRSSPeak = max(r.NginxRSSPeak, ng.ProxyRSSPeak)
			r.Errors += ng.Errors
		}
		r.HearthdRSSPeak = max(r.HearthdRSSPeak, round.Through.ProxyRSSPeak)
		dTok += float64(round.Direct.Tokens)
		tTok += float64(round.Through.Tokens)
		dSec += round.Direct.ElapsedS
		tSec += round.Through.ElapsedS
		dTTFT += round.Direct.TTFT.P50
		tTTFT += round.Through.TTFT.P50
		hCPU += round.Through.ProxyCPUS
		r.Errors += round.Direct.Errors + round.Through.Errors
	}
	if len(r.Rounds) == 0 {
		return
	}
	n := float64(len(r.Rounds))
	if dSec > 0 && tSec > 0 {
		r.DirectTokensPS, r.ThroughTokensPS = dTok/dSec, tTok/tSec
		r.TokensPSRatio = r.ThroughTokensPS / r.DirectTokensPS
	}
	if tTok > 0 {
		r.HearthdCPUusPerToken = hCPU / tTok * 1e6
	}
	r.DirectTTFTP50, r.ThroughTTFTP50 = dTTFT/n, tTTFT/n
	if nSec > 0 && nTok > 0 {
		r.NginxTokensPS, r.NginxTTFTP50, r.NginxCPUusPerToken = nTok/nSec, nTTFT/n, nCPU/nTok*1e6
	}
	if len(paired) > 0 {
		r.PairedTTFTP50 = median(paired)
	}
	if dTTFT > 0 {
		r.TTFTRatio = tTTFT / dTTFT
	}
}

// RunReal starts Ollama with the tiny model and hearthd in front of it and
// drives the same prompts at both.
func RunReal(ctx context.Context, o RealOptions) (*RealResult, error) {
	if o.Log == nil {
		o.Log = io.Discard
	}
	if o.OllamaBin == "" {
		bin, err := ollamatest.FindBinary()
		if err != nil {
			return nil, err
		}
		o.OllamaBin = bin
	}
	dir := filepath.Join(o.WorkDir, "real")
	if err := EnsureDir(dir); err != nil {
		return nil, err
	}
	ol, err := StartOllama(ctx, o.OllamaBin, dir, o.Log)
	if err != nil {
		return nil, err
	}
	defer ol.Stop()
	gguf := filepath.Join(dir, "tiny.gguf")
	if err := tinymodel.WriteFile(gguf, tinymodel.Options{}); err != nil {
		return nil, fmt.Errorf("write tiny model: %w", err)
	}
	u, err := url.Parse(ol.URL)
	if err != nil {
		return nil, fmt.Errorf("parse ollama url: %w", err)
	}
	model := ollamatest.ModelName
	if err := ollamatest.CreateModel(ctx, api.NewClient(u, http.DefaultClient), model, gguf); err != nil {
		return nil, err
	}
	state := filepath.Join(dir, "hearthd-state")
	if err := EnsureDir(state); err != nil {
		return nil, err
	}
	key, err := CreateKey(ctx, o.HearthdBin, state, "bench")
	if err != nil {
		return nil, err
	}
	start := func(ctx context.Context) (*Hearthd, error) {
		return StartHearthd(ctx, HearthdOptions{
			Bin: o.HearthdBin, StateDir: state, Model: model, OllamaURL: ol.URL,
			MaxConcurrent: 64, MaxQueue: 256, Log: o.Log, TLS: o.TLS,
		})
	}
	h, err := start(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = h.Stop() }()

	res := &RealResult{Model: model, Concurrency: o.Concurrency, MaxTokens: o.MaxTokens, Transport: "http"}
	var clientTLS *tls.Config
	ncfg := nginxtest.Config{Upstream: u.Host}
	if o.TLS != nil {
		res.Transport, clientTLS = "tls", o.TLS.Client
		ncfg.TLSCert, ncfg.TLSKey = o.TLS.CertFile, o.TLS.KeyFile
	}
	if v, err := api.NewClient(u, http.DefaultClient).Version(ctx); err == nil {
		res.OllamaVersion = v
	}
	lc := LoadConfig{Model: model, MaxTokens: o.MaxTokens, Concurrency: o.Concurrency, Duration: o.Duration,
		Prompt: "Tell me a long story about a fox and a dog."}
	direct, through := lc, lc
	direct.Target = ol.URL + "/v1"
	through.Target, through.Key, through.TLS = h.URL+"/api/v1", key, clientTLS
	sides := []LoadConfig{direct, through}
	var ng *nginxtest.Proxy
	if o.Nginx {
		if ng, err = nginxtest.New(ncfg); err != nil {
			return nil, fmt.Errorf("nginx: %w", err)
		}
		defer ng.Close()
		viaNginx := lc
		viaNginx.Target, viaNginx.TLS = ng.URL+"/v1", clientTLS
		sides = append(sides, viaNginx)
	}
	// Warm every path (connections, the runner's caches) before measuring.
	for _, w := range sides {
		w.Duration, w.Requests = 0, 2
		if _, err := RunLoad(ctx, w); err != nil {
			return nil, fmt.Errorf("warm up: %w", err)
		}
	}
	for i := range max(o.Rounds, 1) {
		var round RealRound
		// Each round runs the sides in a rotated order, so drift on a
		// shared machine hits them alike.
		runs := []func() error{
			func() (err error) { round.Direct, err = MeasureSide(ctx, direct, ol.PID); return err },
			func() (err error) { round.Through, err = MeasureSide(ctx, through, ol.PID, h.PID); return err },
		}
		if ng != nil {
			runs = append(runs, func() error {
				s, err := MeasureSide(ctx, sides[2], ol.PID, ng.PIDs()...)
				round.Nginx = &s
				return err
			})
		}
		for k := range runs {
			if err := runs[(i+k)%len(runs)](); err != nil {
				return nil, fmt.Errorf("real round %d: %w", i, err)
			}
		}
		res.Rounds = append(res.Rounds, round)
	}
	res.aggregate()
	if o.ColdRuns > 0 {
		if err := h.Stop(); err != nil {
			return nil, err
		}
		clc := lc
		clc.Key, clc.TLS = key, clientTLS
		cs, err := ColdStart(ctx, o.ColdRuns, 10, start, clc, direct)
		if err != nil {
			return nil, err
		}
		res.ColdStart = &cs
	}
	return res, nil
}

// median is the median of vs (the mean of the middle two for an even
// count); vs is sorted in place.
func median(vs []float64) float64 {
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}
