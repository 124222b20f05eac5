package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
)

// The bounds of a wedge at the defaults (--wedge-timeout 10s): found within
// 10 s of the silence's start, the runtime serving again within 15 s of
// that.
const (
	wedgeFound     = 10 * time.Second
	wedgeRecovered = 15 * time.Second
)

// A supervised Ollama that takes requests and answers none is found wedged
// within --wedge-timeout and restarted, and the requests sent meanwhile
// run on the restarted runtime: none fails. The wedge is made by freezing
// the model runner (SIGSTOP): `ollama serve` still accepts requests and
// answers /api/ps, as it does when it has lost its slots (docs/runtime-wedge.md),
// which clients leaving streams cause only now and then (TestLeftStreamsWedgeTheRuntime).
// It is a test of the current Ollama (HEARTH_OLLAMA_BIN): 0.9.6 gets over
// a frozen runner by itself within seconds, before hearthd would.
func TestWedgedRuntimeIsRestarted(t *testing.T) {
	h, metricsAddr, ollamaURL := supervisedHearthd(t)
	serve := ollamaChild(h.cmd.Process.Pid)
	runner := ollamaRunner(serve)
	if serve == 0 || runner == 0 {
		t.Fatalf("ollama serve %d, its runner %d: not found", serve, runner)
	}
	if err := syscall.Kill(runner, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(runner, syscall.SIGCONT) })
	if ollamaAnswers(ollamaURL, 3*time.Second) {
		t.Fatal("the frozen runner still answers")
	}

	// Requests sent to the wedged runtime: more than its slots, so some
	// wait in hearthd's admission; a stream among them.
	sent := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	c := h.client(h.secret)
	for i := range 4 {
		wg.Go(func() {
			out, err := c.Chat.Completions.New(context.Background(), userParams("e2e-tiny", "hi", 4))
			switch {
			case err != nil:
				errs <- fmt.Errorf("chat %d: %w", i, err)
			case out.Usage.CompletionTokens != 4:
				errs <- fmt.Errorf("chat %d: usage %+v", i, out.Usage)
			}
		})
	}
	wg.Go(func() {
		lines, status, err := streamLines(h, `{"model":"e2e-tiny","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
		if err != nil || status != 200 || len(lines) == 0 || lines[len(lines)-1] != "[DONE]" || strings.Contains(strings.Join(lines, "\n"), `"error"`) {
			errs <- fmt.Errorf("stream: %d %v %q", status, err, lines)
		}
	})
	wg.Wait()
	took := time.Since(sent)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("every request answered %v after it was sent to the wedged runtime", took.Round(time.Millisecond))
	if took > wedgeFound+wedgeRecovered {
		t.Errorf("requests answered %v after they were sent, want within %v", took, wedgeFound+wedgeRecovered)
	}
	if p := ollamaChild(h.cmd.Process.Pid); p == serve || p == 0 {
		t.Fatalf("ollama serve %d after the wedge, was %d: not restarted", p, serve)
	}
	if m := h.findLog(regexp.MustCompile(`msg="model runtime is wedged; restarting it" reason="nothing came back from \d+ request`), 0); m == nil {
		t.Errorf("no wedge logged with its reason:\n%s", grepLines(h.logs(), "wedge"))
	}
	m := h.findLog(regexp.MustCompile(`msg="model runtime restarted and the model loaded again" took=(\S+)`), 0)
	if m == nil {
		t.Fatalf("no recovery logged:\n%s", grepLines(h.logs(), "runtime"))
	}
	if d, err := time.ParseDuration(m[1]); err != nil || d > wedgeRecovered {
		t.Errorf("recovered %s (%v) after the wedge was found, want within %v", m[1], err, wedgeRecovered)
	}
	t.Logf("serving again %s after the wedge was found", m[1])
	exp, err := scrape(metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if metricValue(exp, "hearth_runtime_wedges_total") != 1 || metricValue(exp, `hearth_runtime_restarts_total{reason="wedged"}`) != 1 ||
		metricValue(exp, `hearth_runtime_health{state="healthy"}`) != 1 {
		t.Fatalf("after one wedge:\n%s", grepLines(exp, "hearth_runtime_"))
	}
}

// An Ollama hearthd does not supervise (--ollama-url) that takes requests
// and answers none turns /readyz to 503 within the bound, and back to 200
// once it answers again; the request that waited meanwhile is answered.
// The runtime is a stand-in in front of a real Ollama that holds every
// generation unanswered while it is wedged.
func TestUnsupervisedWedgedRuntimeIsNotReady(t *testing.T) {
	inst := shared.ollama.Get(t)
	target, err := url.Parse(inst.URL)
	if err != nil {
		t.Fatal(err)
	}
	var wedged atomic.Bool
	release := make(chan struct{})
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	standIn := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wedged.Load() && (r.URL.Path == "/api/chat" || r.URL.Path == "/api/generate" || r.URL.Path == "/api/embed") {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(standIn.Close)
	var once sync.Once
	unwedge := func() { once.Do(func() { wedged.Store(false); close(release) }) }
	t.Cleanup(unwedge)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", standIn.URL, "--metrics-listen", metricsAddr}})

	wedged.Store(true)
	sent := time.Now()
	answered := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c := h.client(h.secret)
		_, err := c.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4))
		answered <- err
	}()
	testutil.WaitFor(t, time.Minute, "/readyz 503", func() bool { return getOK(h.root+"/readyz") != nil })
	if d := time.Since(sent); d > wedgeRecovered {
		t.Errorf("/readyz turned 503 %v after the request was sent, want within %v", d, wedgeRecovered)
	} else {
		t.Logf("/readyz turned 503 %v after the request was sent", d.Round(time.Millisecond))
	}
	resp, err := probeClient.Get(h.root + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	if resp.StatusCode != 503 || !strings.Contains(body, "wedged") {
		t.Fatalf("/readyz while wedged: %d %s", resp.StatusCode, body)
	}
	if m := h.findLog(regexp.MustCompile(`msg="model runtime is wedged; reporting degraded until it answers again" reason=`), 0); m == nil {
		t.Errorf("no wedge logged:\n%s", grepLines(h.logs(), "wedge"))
	}
	exp, err := scrape(metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if metricValue(exp, "hearth_runtime_wedges_total") != 1 || metricValue(exp, `hearth_runtime_health{state="degraded"}`) != 1 {
		t.Fatalf("while wedged:\n%s", grepLines(exp, "hearth_runtime_"))
	}

	unwedge()
	if err := <-answered; err != nil {
		t.Fatalf("the request that waited: %v", err)
	}
	h.waitReady(time.Minute)
}

// Clients that leave streams midway make a real Ollama lose its parallel
// slots now and then (docs/runtime-wedge.md): hearthd finds it wedged and
// restarts it, and requests sent meanwhile are answered. The loss is a
// race in Ollama, so the test leaves streams until a one-token generation
// asked of Ollama directly gets no answer, and is skipped if that never
// happens; TestWedgedRuntimeIsRestarted makes the wedge for certain.
func TestLeftStreamsWedgeTheRuntime(t *testing.T) {
	h, metricsAddr, ollamaURL := supervisedHearthd(t)
	first := ollamaChild(h.cmd.Process.Pid)
	const attempts = 400
	left, stuck := 0, false
	for left < attempts && !stuck {
		leaveStream(t, h)
		left++
		stuck = !ollamaAnswers(ollamaURL, 3*time.Second)
	}
	if !stuck {
		t.Skipf("Ollama kept a free slot through %d streams left midway (the loss is a race)", attempts)
	}
	t.Logf("Ollama lost its slots after %d streams left midway", left)
	sent := time.Now()
	c := h.client(h.secret)
	out, err := c.Chat.Completions.New(context.Background(), userParams("e2e-tiny", "hi", 4))
	if err != nil || out.Usage.CompletionTokens != 4 {
		t.Fatalf("request sent to the wedged runtime: %v", err)
	}
	if d := time.Since(sent); d > wedgeFound+wedgeRecovered {
		t.Errorf("answered %v after it was sent, want within %v", d, wedgeFound+wedgeRecovered)
	} else {
		t.Logf("the request sent to the wedged runtime answered %v after it was sent", d.Round(time.Millisecond))
	}
	if p := ollamaChild(h.cmd.Process.Pid); p == first || p == 0 {
		t.Fatalf("ollama serve %d, was %d: not restarted", p, first)
	}
	exp, err := scrape(metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if metricValue(exp, "hearth_runtime_wedges_total") != 1 {
		t.Fatalf("after one wedge:\n%s", grepLines(exp, "hearth_runtime_"))
	}
}

// supervisedHearthd starts hearthd supervising an `ollama serve` of its own
// with the tiny model, at the defaults otherwise, and waits until it is
// ready.
func supervisedHearthd(t *testing.T) (h *hearthd, metricsAddr, ollamaURL string) {
	t.Helper()
	bin, err := ollamatest.FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	gguf, tmpl := tinyModelFiles(t)
	metricsAddr = fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	ollamaURL = fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t))
	h = startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", "e2e-tiny", "--model-gguf", gguf, "--model-template", tmpl,
		"--model-param", "num_thread=1", "--ollama-start", "--ollama-bin", bin,
		"--ollama-url", ollamaURL, "--ollama-models-dir", filepath.Join(t.TempDir(), "models"),
		"--metrics-listen", metricsAddr, "--max-output-tokens", "100000"}})
	return h, metricsAddr, ollamaURL
}

// ollamaRunner is the PID of the model runner `ollama serve` pid started,
// or 0.
func ollamaRunner(pid int) int {
	for _, c := range childrenOf(pid) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", c))
		if strings.Contains(string(cmd), "runner") {
			return c
		}
	}
	return 0
}

// streamLines posts a streamed chat and returns its data lines.
func streamLines(h *hearthd, body string) ([]string, int, error) {
	req, _ := http.NewRequest("POST", h.url+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+h.secret)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	lines, err := sseLines(resp.Body)
	return lines, resp.StatusCode, err
}

// leaveStream starts a long stream and disconnects after its first tokens.
func leaveStream(t *testing.T, h *hearthd) {
	t.Helper()
	resp := postChat(t, h, h.secret, `{"model":"e2e-tiny","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"go on"}]}`)
	defer resp.Body.Close() // before its end: the connection closes
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	for n := 0; n < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
		if strings.Contains(line, `"content":"`) {
			n++
		}
	}
}

// ollamaAnswers asks the Ollama at url for one token directly.
func ollamaAnswers(url string, within time.Duration) bool {
	hc := &http.Client{Timeout: within}
	defer hc.CloseIdleConnections()
	resp, err := hc.Post(url+"/api/generate", "application/json",
		strings.NewReader(`{"model":"e2e-tiny","prompt":"hi","stream":false,"options":{"num_predict":1}}`))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == 200
}

// metricValue is the value of the sample name (with its labels as
// exposed, if any), or -1.
func metricValue(exposition, name string) float64 {
	for _, line := range strings.Split(exposition, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			var got float64
			if _, err := fmt.Sscan(v, &got); err == nil {
				return got
			}
		}
	}
	return -1
}
