package metrics

import (
	"bytes"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

// scriptedNode builds a Node with a fixed clock and a known history of
// observations, touching every node metric.
func scriptedNode() *Node {
	n := NewNode("v0.1.0-test")
	start := time.Unix(1750000000, 0)
	n.now = func() time.Time { return start.Add(90 * time.Second) }
	n.sync.start = start

	for range 5 {
		n.Request(RouteChatCompletions, http.StatusOK)
	}
	n.Request(RouteChatCompletions, http.StatusTooManyRequests)
	n.Request(RouteChatCompletions, http.StatusUnauthorized)
	n.Request(RouteModels, http.StatusOK)
	n.Request(RouteModels, http.StatusNotFound)
	n.Request(RouteHealthz, http.StatusOK)
	n.Request(RouteReadyz, http.StatusOK)
	n.Request("/nope", http.StatusNotFound)

	n.Generation(RouteChatCompletions, "hearth-tiny", FinishStop, true)
	n.Generation(RouteChatCompletions, "hearth-tiny", FinishStop, true)
	n.Generation(RouteChatCompletions, "hearth-tiny", FinishStop, false)
	n.Generation(RouteChatCompletions, "hearth-tiny", FinishLength, true)
	n.Generation(RouteChatCompletions, "hearth-tiny", FinishCancelled, true)
	n.Generation(RouteResponses, "hearth-tiny", FinishStop, true)
	n.Generation(RouteCompletions, "hearth-tiny", FinishStop, false)

	for _, ms := range []int{40, 85, 120, 900, 4000} {
		n.ObserveTTFT(RouteChatCompletions, time.Duration(ms)*time.Millisecond)
		n.ObserveTTFT(RouteResponses, time.Duration(ms)*time.Millisecond)
	}
	for _, us := range []int{300, 800, 1500, 9000, 30000, 700000} {
		n.ObserveInterToken(time.Duration(us) * time.Microsecond)
	}
	for _, s := range []float64{0.5, 3, 12, 75} {
		n.ObserveRequest(RouteChatCompletions, "hearth-tiny", time.Duration(s*float64(time.Second)))
	}
	for _, r := range []string{RouteResponses, RouteEmbeddings, RouteCompletions, RouteModels} {
		n.ObserveRequest(r, "hearth-tiny", 40*time.Millisecond)
	}
	n.Tokens(RouteChatCompletions, "hearth-tiny", 120, 64, 20)
	n.Tokens(RouteChatCompletions, "hearth-tiny", 30, 200, 0)
	n.Tokens(RouteResponses, "hearth-tiny", 50, 80, 30)
	n.Tokens(RouteEmbeddings, "hearth-tiny", 12, 0, 0)
	n.Embedded("hearth-tiny", 4)
	n.StreamStarted()
	n.StreamStarted()
	n.StreamEnded()
	n.Rejected(RejectQueueFull)
	n.AuthFailure(AuthInvalid)
	n.RegisterQueueDepth(func() int { return 3 })
	n.RegisterRuntimeUp(func() bool { return true })
	n.RegisterRuntimeHealth(func() string { return "healthy" })
	n.RuntimeRestarted(RestartWedged)
	n.RuntimeWedged()
	n.RuntimeRecovered(6 * time.Second)
	n.SetModelLoadDuration(2250 * time.Millisecond)
	n.RegisterFirewall(func() FirewallStats {
		return FirewallStats{Applies: 3, ApplyFailures: 1, DriftRepairs: 1, Rules: 4,
			LastApply: start.Add(10 * time.Second), LastSuccess: start.Add(80 * time.Second),
			LastDriftCheck: start.Add(80 * time.Second)}
	})
	n.RegisterSSHKeys(func() SSHKeyStats { return SSHKeyStats{Syncs: 6, Writes: 2} })
	n.RegisterControlSync(func() time.Time { return start.Add(75 * time.Second) })
	n.DesiredStateReceived()
	n.DesiredStateReceived()
	n.PanicRecovered()
	return n
}

// scrape fetches the text exposition from h, as Prometheus without
// protobuf or OpenMetrics would.
func scrape(t *testing.T, h http.Handler) []byte {
	t.Helper()
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("scrape: %s %q\n%s", resp.Status, resp.Header.Get("Content-Type"), body)
	}
	return body
}

// withoutRuntimeMetrics drops the go_ and process_ families, whose values
// depend on the machine, and replaces the Go version in build info.
func withoutRuntimeMetrics(expo []byte) []byte {
	var out bytes.Buffer
	for line := range strings.Lines(string(expo)) {
		name := line
		if rest, ok := strings.CutPrefix(line, "# HELP "); ok {
			name = rest
		} else if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name = rest
		}
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		out.WriteString(line)
	}
	return bytes.ReplaceAll(out.Bytes(), []byte(`goversion="`+runtime.Version()+`"`), []byte(`goversion="GOVERSION"`))
}

func TestNodeExpositionGolden(t *testing.T) {
	got := withoutRuntimeMetrics(scrape(t, scriptedNode().Handler()))
	golden := filepath.Join("testdata", "node.metrics")
	if *update {
		if err := os.WriteFile(golden, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run TestNodeExpositionGolden -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("exposition differs from %s (rerun with -update if intended):\n%s", golden, lineDiff(string(want), string(got)))
	}
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	in := func(s string) map[string]bool {
		m := map[string]bool{}
		for l := range strings.Lines(s) {
			m[l] = true
		}
		return m
	}
	w, g := in(want), in(got)
	var b strings.Builder
	for l := range strings.Lines(want) {
		if !g[l] {
			b.WriteString("- " + l)
		}
	}
	for l := range strings.Lines(got) {
		if !w[l] {
			b.WriteString("+ " + l)
		}
	}
	return b.String()
}

// promtool finds the promtool binary; CI installs it with the Debian
// prometheus package, so its absence is a broken environment, not a skip.
func promtool(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/promtool"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (apt-get install prometheus): %v", err)
	}
	return p
}

func checkMetrics(t *testing.T, expo []byte) {
	t.Helper()
	cmd := exec.Command(promtool(t), "check", "metrics")
	cmd.Stdin = bytes.NewReader(expo)
	out, err := cmd.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) != 0 {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}

func TestPromtoolCheckMetrics(t *testing.T) {
	checkMetrics(t, scrape(t, scriptedNode().Handler()))
	c := scriptedControl()
	checkMetrics(t, scrape(t, c.Handler()))
}

func TestPromtoolCatchesBadMetrics(t *testing.T) {
	// The check above is only worth something if promtool rejects a
	// badly named metric fed the same way.
	cmd := exec.Command(promtool(t), "check", "metrics")
	cmd.Stdin = strings.NewReader("# HELP hearth_requests Requests.\n# TYPE hearth_requests counter\nhearth_requests 1\n")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "_total") {
		t.Fatalf("promtool accepted a counter without _total: %v\n%s", err, out)
	}
}

func TestNativeHistogramsNegotiated(t *testing.T) {
	// Scrapers that ask for protobuf get native buckets alongside the
	// classic ones.
	n := NewNode("test")
	n.ObserveTTFT(RouteChatCompletions, 30*time.Millisecond)
	n.ObserveTTFT(RouteChatCompletions, 31*time.Millisecond)
	n.ObserveTTFT(RouteChatCompletions, 2*time.Second)
	srv := httptest.NewServer(n.Handler())
	defer srv.Close()
	req, err := http.NewRequest(http.MethodGet, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", string(expfmt.FmtProtoDelim))
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	dec := expfmt.NewDecoder(resp.Body, expfmt.ResponseFormat(resp.Header))
	for {
		var mf dto.MetricFamily
		if err := dec.Decode(&mf); err != nil {
			t.Fatalf("hearth_time_to_first_token_seconds not found: %v", err)
		}
		if mf.GetName() != "hearth_time_to_first_token_seconds" {
			continue
		}
		h := mf.GetMetric()[0].GetHistogram()
		var spans, deltas int
		for _, s := range h.GetPositiveSpan() {
			spans += int(s.GetLength())
		}
		deltas = len(h.GetPositiveDelta())
		// 30 and 31 ms share a native bucket at factor 1.1; 2 s is another.
		if h.GetSchema() != 3 || deltas != 2 || spans < 2 || len(h.GetBucket()) != 16 {
			t.Fatalf("TTFT histogram: schema %d, %d native buckets, %d classic buckets", h.GetSchema(), deltas, len(h.GetBucket()))
		}
		return
	}
}
