package bench

import (
	"context"
	"math"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/nginxtest"
)

// buildHearthd builds the hearthd binary the smoke run drives.
func buildHearthd(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "hearthd")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/hearthd/hearth/cmd/hearthd").CombinedOutput()
	if err != nil {
		t.Fatalf("build hearthd: %v\n%s", err, out)
	}
	return bin
}

// TestSmoke runs the benchmark end to end with tiny numbers — mock runtime,
// load generator and a real hearthd process — so that it cannot rot, over
// TLS and plain HTTP as make bench runs it. It checks that the numbers are
// sane, never how fast they are.
func TestSmoke(t *testing.T) {
	bin := buildHearthd(t)
	for _, tr := range []string{"tls", "http"} {
		t.Run(tr, func(t *testing.T) { testSmoke(t, bin, tr == "tls") })
	}
}

func testSmoke(t *testing.T, bin string, overTLS bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mock := startTestMock(t, MockConfig{})
	var logs strings.Builder
	s := &Suite{
		HearthdBin: bin, MockURL: mock.URL, Model: "bench",
		WorkDir: t.TempDir(), MaxStreams: 64, Verify: true, HearthdLog: &logs,
	}
	// nginx in front of the same mock, as make bench runs it.
	ncfg := nginxtest.Config{Upstream: strings.TrimPrefix(mock.URL, "http://")}
	if overTLS {
		files, err := NewTLSFiles(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		s.TLS = files
		ncfg.TLSCert, ncfg.TLSKey = files.CertFile, files.KeyFile
	}
	s.Nginx = nginxtest.Start(t, ncfg)
	if err := s.Setup(ctx); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.key, "hearth_live_") {
		t.Fatalf("key %q", s.key)
	}
	h, err := s.StartHearthd(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := h.Stop(); err != nil { // a second Stop is a no-op
			t.Error(err)
		}
		if t.Failed() {
			t.Logf("hearthd output:\n%s", logs.String())
		}
	}()
	scenarios := []Scenario{
		{Name: "closed", Concurrency: 4, Duration: 300 * time.Millisecond, Tokens: 12,
			Mock: MockConfig{TPS: 2000, TTFT: time.Millisecond}},
		{Name: "open", Concurrency: 16, Rate: 40, Duration: 300 * time.Millisecond, Tokens: 5,
			Mock: MockConfig{TPS: 0, TTFT: time.Millisecond}},
	}
	for _, sc := range scenarios {
		before := mock.Stats()
		r, err := s.RunScenario(ctx, h, sc)
		if err != nil {
			t.Fatal(err)
		}
		after := mock.Stats()
		if r.Nginx == nil {
			t.Fatalf("%s: no nginx side", sc.Name)
		}
		if want := s.Transport(); r.Transport != want || strings.HasPrefix(r.Through.Target, "https:") != overTLS ||
			strings.HasPrefix(r.Nginx.Target, "https:") != overTLS {
			t.Fatalf("%s: transport %q, targets %s and %s; want %s", sc.Name, r.Transport, r.Through.Target, r.Nginx.Target, want)
		}
		for name, side := range map[string]Side{"direct": r.Direct, "nginx": *r.Nginx, "through": r.Through} {
			if side.Errors != 0 || side.Completed == 0 || side.Completed != side.Requests {
				t.Errorf("%s %s: %d of %d completed, %d errors %v", sc.Name, name, side.Completed, side.Requests, side.Errors, side.ErrorSamples)
			}
			if side.Tokens != int64(side.Completed*sc.Tokens) {
				t.Errorf("%s %s: %d tokens for %d completions of %d", sc.Name, name, side.Tokens, side.Completed, sc.Tokens)
			}
			if side.TTFT.N != side.Completed || side.TTFT.P50 <= 0 || side.TTFT.P99 < side.TTFT.P50 {
				t.Errorf("%s %s: TTFT %+v", sc.Name, name, side.TTFT)
			}
			if side.Gap.N != side.Completed*(sc.Tokens-1) || side.TokensPS <= 0 {
				t.Errorf("%s %s: gaps %+v tokens/s %v", sc.Name, name, side.Gap, side.TokensPS)
			}
		}
		// Every token the mock generated reached the client.
		if got, want := r.Direct.Tokens+r.Nginx.Tokens+r.Through.Tokens, after.Tokens-before.Tokens; got != want {
			t.Errorf("%s: clients got %d tokens, mock sent %d", sc.Name, got, want)
		}
		for name, side := range map[string]Side{"hearthd": r.Through, "nginx": *r.Nginx} {
			if side.ProxyCPUS < 0 || side.ProxyRSSPeak <= 0 || side.ProxyHWM < side.ProxyRSSPeak/2 {
				t.Errorf("%s: %s process stats %+v", sc.Name, name, side)
			}
			if side.ProxyUserS < 0 || side.ProxySysS < 0 || math.Abs(side.ProxyUserS+side.ProxySysS-side.ProxyCPUS) > 1e-9 {
				t.Errorf("%s: %s user %v + sys %v s is not its CPU %v s", sc.Name, name, side.ProxyUserS, side.ProxySysS, side.ProxyCPUS)
			}
		}
		// Even a request that does nothing allocates: 0 means no reading.
		if r.HearthdMallocsPerRequest <= 0 {
			t.Errorf("%s: hearthd mallocs per request %v", sc.Name, r.HearthdMallocsPerRequest)
		}
		if r.Direct.ProxyRSSPeak != 0 {
			t.Errorf("%s: the direct side measured a proxy: %+v", sc.Name, r.Direct)
		}
		rep := Report{Scenarios: []ScenarioResult{r}}
		if md := rep.Markdown(); !strings.Contains(md, sc.Name) || !strings.Contains(md, "Against nginx") {
			t.Errorf("markdown lacks scenario %s or the nginx table:\n%s", sc.Name, md)
		}
	}

	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	// ColdStart starts and stops its own daemons.
	lc := LoadConfig{Model: "bench", Key: s.key, MaxTokens: 3, ExpectTokens: 3, Verify: true, TLS: s.ClientTLS()}
	direct := lc
	direct.Target, direct.Key = s.MockURL+"/v1", ""
	cs, err := ColdStart(ctx, 2, 5, s.StartHearthd, lc, direct)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs.FirstTTFTus) != 2 || cs.FirstTTFTus[0] <= 0 || cs.SteadyTTFT.N != 10 || cs.Ratio <= 0 {
		t.Fatalf("cold start %+v", cs)
	}
	// The second run's pause spans the first hearthd's stop and the second's
	// start, so it cannot be zero; the direct request waited it out.
	if len(cs.DirectIdleTTFTus) != 2 || len(cs.IdleMs) != 2 || cs.IdleMs[1] <= 0 || cs.DirectIdleMedian <= 0 || cs.IdleRatio <= 0 {
		t.Fatalf("cold start, the direct request after the pause: %+v", cs)
	}
	if md := cs.Markdown("mock runtime"); !strings.Contains(md, "straight to the runtime after the same pause") {
		t.Errorf("cold start line lacks the direct comparison: %s", md)
	}
}
