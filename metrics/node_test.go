package metrics

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// compare checks the named metrics in c against the text exposition want
// (HELP and TYPE lines included).
func compare(t *testing.T, c prometheus.Collector, want string, names ...string) {
	t.Helper()
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}
}

func TestRequestCountsByRouteAndCode(t *testing.T) {
	n := NewNode("test")
	for range 3 {
		n.Request(RouteChatCompletions, http.StatusOK)
	}
	n.Request(RouteChatCompletions, http.StatusTooManyRequests)
	n.Request(RouteModels, http.StatusOK)
	n.Request(RouteModels, http.StatusNotFound)
	n.Request(RouteHealthz, http.StatusOK)
	n.Request(RouteReadyz, http.StatusServiceUnavailable)
	// Unknown routes must not become label values.
	n.Request("/api/v1/../../etc/passwd", http.StatusNotFound)
	n.Request(RouteOther, http.StatusNotFound)
	compare(t, n.Registry(), `
# HELP hearth_http_requests_total Deployment API requests answered, by route and HTTP status code.
# TYPE hearth_http_requests_total counter
hearth_http_requests_total{code="200",route="chat"} 3
hearth_http_requests_total{code="429",route="chat"} 1
hearth_http_requests_total{code="200",route="healthz"} 1
hearth_http_requests_total{code="200",route="models"} 1
hearth_http_requests_total{code="404",route="models"} 1
hearth_http_requests_total{code="404",route="other"} 2
hearth_http_requests_total{code="503",route="readyz"} 1
`, "hearth_http_requests_total")
}

func TestGenerationsByRouteModelFinishReasonAndStream(t *testing.T) {
	n := NewNode("test")
	n.Generation(RouteChatCompletions, "m", FinishStop, true)
	n.Generation(RouteChatCompletions, "m", FinishStop, true)
	n.Generation(RouteChatCompletions, "m", FinishStop, false)
	n.Generation(RouteChatCompletions, "m", FinishLength, false)
	n.Generation(RouteChatCompletions, "m", FinishToolCalls, true)
	n.Generation(RouteChatCompletions, "m", FinishError, true)
	n.Generation(RouteChatCompletions, "m", FinishCancelled, true)
	n.Generation(RouteChatCompletions, "m", "unload", false) // not a known reason
	n.Generation(RouteResponses, "m", FinishStop, true)
	n.Generation(RouteEmbeddings, "m", FinishStop, false) // no generation route
	compare(t, n.Registry(), `
# HELP hearth_generations_total Generations ended (each choice of a request is one), by route (chat, responses, completions), model, finish reason and whether they were streamed.
# TYPE hearth_generations_total counter
hearth_generations_total{finish_reason="cancelled",model="m",route="chat",stream="false"} 0
hearth_generations_total{finish_reason="cancelled",model="m",route="chat",stream="true"} 1
hearth_generations_total{finish_reason="error",model="m",route="chat",stream="false"} 0
hearth_generations_total{finish_reason="error",model="m",route="chat",stream="true"} 1
hearth_generations_total{finish_reason="length",model="m",route="chat",stream="false"} 1
hearth_generations_total{finish_reason="length",model="m",route="chat",stream="true"} 0
hearth_generations_total{finish_reason="other",model="m",route="chat",stream="false"} 1
hearth_generations_total{finish_reason="stop",model="m",route="chat",stream="false"} 1
hearth_generations_total{finish_reason="stop",model="m",route="chat",stream="true"} 2
hearth_generations_total{finish_reason="tool_calls",model="m",route="chat",stream="false"} 0
hearth_generations_total{finish_reason="tool_calls",model="m",route="chat",stream="true"} 1
hearth_generations_total{finish_reason="cancelled",model="m",route="other",stream="false"} 0
hearth_generations_total{finish_reason="cancelled",model="m",route="other",stream="true"} 0
hearth_generations_total{finish_reason="error",model="m",route="other",stream="false"} 0
hearth_generations_total{finish_reason="error",model="m",route="other",stream="true"} 0
hearth_generations_total{finish_reason="length",model="m",route="other",stream="false"} 0
hearth_generations_total{finish_reason="length",model="m",route="other",stream="true"} 0
hearth_generations_total{finish_reason="stop",model="m",route="other",stream="false"} 1
hearth_generations_total{finish_reason="stop",model="m",route="other",stream="true"} 0
hearth_generations_total{finish_reason="tool_calls",model="m",route="other",stream="false"} 0
hearth_generations_total{finish_reason="tool_calls",model="m",route="other",stream="true"} 0
hearth_generations_total{finish_reason="cancelled",model="m",route="responses",stream="false"} 0
hearth_generations_total{finish_reason="cancelled",model="m",route="responses",stream="true"} 0
hearth_generations_total{finish_reason="error",model="m",route="responses",stream="false"} 0
hearth_generations_total{finish_reason="error",model="m",route="responses",stream="true"} 0
hearth_generations_total{finish_reason="length",model="m",route="responses",stream="false"} 0
hearth_generations_total{finish_reason="length",model="m",route="responses",stream="true"} 0
hearth_generations_total{finish_reason="stop",model="m",route="responses",stream="false"} 0
hearth_generations_total{finish_reason="stop",model="m",route="responses",stream="true"} 1
hearth_generations_total{finish_reason="tool_calls",model="m",route="responses",stream="false"} 0
hearth_generations_total{finish_reason="tool_calls",model="m",route="responses",stream="true"} 0
`, "hearth_generations_total")
}

func TestLatencyHistograms(t *testing.T) {
	n := NewNode("test")
	n.ObserveTTFT(RouteChatCompletions, 3*time.Millisecond)
	n.ObserveTTFT(RouteChatCompletions, 2*time.Second)
	n.ObserveTTFT(RouteChatCompletions, 90*time.Second) // beyond the last bucket
	n.ObserveInterToken(150 * time.Microsecond)
	n.ObserveInterToken(20 * time.Millisecond)
	n.ObserveRequest(RouteResponses, "m", 4*time.Minute)
	n.ObserveRequest(RouteEmbeddings, "m", time.Second)
	n.ObserveRequest(RouteHealthz, "m", time.Second) // not an API route: not observed

	compare(t, n.Registry(), `
# HELP hearth_time_to_first_token_seconds Time from accepting a generation's request to its first generated token, by route.
# TYPE hearth_time_to_first_token_seconds histogram
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.001"} 0
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.0025"} 0
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.005"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.01"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.025"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.05"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.1"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.25"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="0.5"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="1"} 1
hearth_time_to_first_token_seconds_bucket{route="chat",le="2.5"} 2
hearth_time_to_first_token_seconds_bucket{route="chat",le="5"} 2
hearth_time_to_first_token_seconds_bucket{route="chat",le="10"} 2
hearth_time_to_first_token_seconds_bucket{route="chat",le="20"} 2
hearth_time_to_first_token_seconds_bucket{route="chat",le="30"} 2
hearth_time_to_first_token_seconds_bucket{route="chat",le="60"} 2
hearth_time_to_first_token_seconds_bucket{route="chat",le="+Inf"} 3
hearth_time_to_first_token_seconds_sum{route="chat"} 92.003
hearth_time_to_first_token_seconds_count{route="chat"} 3
`, "hearth_time_to_first_token_seconds")

	if got := testutil.CollectAndCount(n.Registry(), "hearth_inter_token_latency_seconds"); got != 1 {
		t.Fatalf("inter-token histograms: %d, want 1", got)
	}
	h := gatherOne(t, n.Registry(), "hearth_inter_token_latency_seconds").GetHistogram()
	if h.GetSampleCount() != 2 || h.GetBucket()[1].GetCumulativeCount() != 1 || h.GetBucket()[1].GetUpperBound() != .00025 {
		t.Fatalf("inter-token histogram: %v", h)
	}
	got := map[string]float64{}
	for _, m := range gatherFamily(t, n.Registry(), "hearth_request_duration_seconds").GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		if l["model"] != "m" || m.GetHistogram().GetSampleCount() != 1 {
			t.Errorf("request duration %v: %v", l, m.GetHistogram())
		}
		got[l["route"]] = m.GetHistogram().GetSampleSum()
	}
	if len(got) != 2 || got[RouteResponses] != 240 || got[RouteEmbeddings] != 1 {
		t.Fatalf("request durations by route: %v", got)
	}
}

func TestTokensAndActiveStreams(t *testing.T) {
	n := NewNode("test")
	n.Tokens(RouteChatCompletions, "m", 12, 30, 10)
	n.Tokens(RouteChatCompletions, "m", 5, 0, 0)
	n.Tokens(RouteChatCompletions, "m", -1, -1, -1) // ignored
	n.Tokens(RouteEmbeddings, "m", 7, 0, 0)
	n.Embedded("m", 3)
	n.Embedded("m", 0)
	n.StreamStarted()
	n.StreamStarted()
	n.StreamStarted()
	n.StreamEnded()
	compare(t, n.Registry(), `
# HELP hearth_active_streams Generations currently running.
# TYPE hearth_active_streams gauge
hearth_active_streams 2
# HELP hearth_embeddings_total Inputs embedded (one vector each), by model.
# TYPE hearth_embeddings_total counter
hearth_embeddings_total{model="m"} 3
# HELP hearth_tokens_total Tokens processed, as reported by the model runtime, by route, model and kind (prompt, completion, and reasoning: the part of completion that was thinking).
# TYPE hearth_tokens_total counter
hearth_tokens_total{kind="completion",model="m",route="chat"} 30
hearth_tokens_total{kind="prompt",model="m",route="chat"} 17
hearth_tokens_total{kind="reasoning",model="m",route="chat"} 10
hearth_tokens_total{kind="completion",model="m",route="embeddings"} 0
hearth_tokens_total{kind="prompt",model="m",route="embeddings"} 7
hearth_tokens_total{kind="reasoning",model="m",route="embeddings"} 0
`, "hearth_active_streams", "hearth_embeddings_total", "hearth_tokens_total")
}

func TestRejectionsAndAuthFailures(t *testing.T) {
	n := NewNode("test")
	n.Rejected(RejectQueueFull)
	n.Rejected(RejectQueueFull)
	n.Rejected(RejectDraining)
	n.AuthFailure(AuthMissing)
	n.AuthFailure(AuthInvalid)
	n.AuthFailure(AuthInvalid)
	n.AuthFailure(AuthMalformed)
	compare(t, n.Registry(), `
# HELP hearth_auth_failures_total Deployment API requests refused for failed authentication, by reason.
# TYPE hearth_auth_failures_total counter
hearth_auth_failures_total{reason="invalid"} 2
hearth_auth_failures_total{reason="malformed"} 1
hearth_auth_failures_total{reason="missing"} 1
# HELP hearth_rejected_requests_total Chat completions turned away before generating (HTTP 429/503), by reason.
# TYPE hearth_rejected_requests_total counter
hearth_rejected_requests_total{reason="draining"} 1
hearth_rejected_requests_total{reason="queue_full"} 2
`, "hearth_auth_failures_total", "hearth_rejected_requests_total")
}

func TestScrapeFuncsAbsentUntilRegisteredAndReadAtScrape(t *testing.T) {
	n := NewNode("test")
	names := []string{"hearth_queue_depth", "hearth_runtime_up"}
	if got := testutil.CollectAndCount(n.Registry(), names...); got != 0 {
		t.Fatalf("%d series before registration, want 0", got)
	}
	var depth atomic.Int64
	var up atomic.Bool
	n.RegisterQueueDepth(func() int { return int(depth.Load()) })
	n.RegisterRuntimeUp(up.Load)

	depth.Store(7)
	compare(t, n.Registry(), `
# HELP hearth_queue_depth Chat completions waiting for a generation slot.
# TYPE hearth_queue_depth gauge
hearth_queue_depth 7
# HELP hearth_runtime_up Whether the model runtime is reachable with the model loaded (1) or not (0).
# TYPE hearth_runtime_up gauge
hearth_runtime_up 0
`, names...)
	depth.Store(2)
	up.Store(true)
	compare(t, n.Registry(), `
# HELP hearth_queue_depth Chat completions waiting for a generation slot.
# TYPE hearth_queue_depth gauge
hearth_queue_depth 2
# HELP hearth_runtime_up Whether the model runtime is reachable with the model loaded (1) or not (0).
# TYPE hearth_runtime_up gauge
hearth_runtime_up 1
`, names...)

	n.RegisterQueueDepth(nil)
	if got := testutil.CollectAndCount(n.Registry(), "hearth_queue_depth"); got != 0 {
		t.Fatalf("queue depth still exposed after unregistering: %d", got)
	}
}

func TestRuntimeRestartsWedgesAndModelLoad(t *testing.T) {
	n := NewNode("test")
	n.RuntimeRestarted(RestartWedged)
	n.RuntimeRestarted(RestartWedged)
	n.RuntimeRestarted(RestartExited)
	n.RuntimeWedged()
	n.RuntimeRecovered(4 * time.Second)
	n.SetModelLoadDuration(1500 * time.Millisecond)
	compare(t, n.Registry(), `
# HELP hearth_model_load_duration_seconds Time the last load of the deployment's model took.
# TYPE hearth_model_load_duration_seconds gauge
hearth_model_load_duration_seconds 1.5
# HELP hearth_runtime_restarts_total Times hearthd restarted the model runtime, by reason: wedged (it took requests and answered none), exited (the process ended on its own).
# TYPE hearth_runtime_restarts_total counter
hearth_runtime_restarts_total{reason="exited"} 1
hearth_runtime_restarts_total{reason="wedged"} 2
# HELP hearth_runtime_wedges_total Times the model runtime was found wedged: requests in flight, nothing back from any of them and no answer to a one-token probe for wedge_timeout. A supervised one is restarted (hearth_runtime_restarts_total{reason="wedged"}).
# TYPE hearth_runtime_wedges_total counter
hearth_runtime_wedges_total 1
`, "hearth_model_load_duration_seconds", "hearth_runtime_restarts_total", "hearth_runtime_wedges_total")
	if got := testutil.CollectAndCount(n.Registry(), "hearth_runtime_recovery_seconds"); got != 1 {
		t.Fatalf("recovery histogram: %d series", got)
	}
}

// hearth_runtime_health is absent until registered, then one series per
// state, 1 for the current one.
func TestRuntimeHealth(t *testing.T) {
	n := NewNode("test")
	if got := testutil.CollectAndCount(n.Registry(), "hearth_runtime_health"); got != 0 {
		t.Fatalf("exposed before registered: %d", got)
	}
	state := "restarting"
	n.RegisterRuntimeHealth(func() string { return state })
	compare(t, n.Registry(), `
# HELP hearth_runtime_health The model runtime's health: 1 for its state (healthy; degraded: it does not serve, e.g. wedged and not restarted by hearthd; restarting: hearthd restarts it), 0 for the others.
# TYPE hearth_runtime_health gauge
hearth_runtime_health{state="degraded"} 0
hearth_runtime_health{state="healthy"} 0
hearth_runtime_health{state="restarting"} 1
`, "hearth_runtime_health")
}

func TestFirewallCollectorReadsStatsAtScrape(t *testing.T) {
	n := NewNode("test")
	var mu sync.Mutex
	st := FirewallStats{
		Applies: 4, ApplyFailures: 1, DriftRepairs: 2, DriftFailures: 0, Rules: 3,
		LastApply:   time.Unix(1700000000, 0),
		LastSuccess: time.Unix(1700000060, 500_000_000),
		// LastDriftCheck zero: never checked.
	}
	n.RegisterFirewall(func() FirewallStats { mu.Lock(); defer mu.Unlock(); return st })
	want := `
# HELP hearth_firewall_applies_total Successful applies of the firewall rule set.
# TYPE hearth_firewall_applies_total counter
hearth_firewall_applies_total %d
# HELP hearth_firewall_apply_failures_total Firewall applies that failed validation or nftables.
# TYPE hearth_firewall_apply_failures_total counter
hearth_firewall_apply_failures_total 1
# HELP hearth_firewall_drift_failures_total Firewall drift checks or repairs that failed.
# TYPE hearth_firewall_drift_failures_total counter
hearth_firewall_drift_failures_total 0
# HELP hearth_firewall_drift_repairs_total Times the firewall table was found changed and re-applied.
# TYPE hearth_firewall_drift_repairs_total counter
hearth_firewall_drift_repairs_total 2
# HELP hearth_firewall_last_apply_timestamp_seconds Unix time of the last successful write of the firewall table, 0 if never.
# TYPE hearth_firewall_last_apply_timestamp_seconds gauge
hearth_firewall_last_apply_timestamp_seconds 1.7e+09
# HELP hearth_firewall_last_drift_check_timestamp_seconds Unix time of the last completed firewall drift check, 0 if never.
# TYPE hearth_firewall_last_drift_check_timestamp_seconds gauge
hearth_firewall_last_drift_check_timestamp_seconds 0
# HELP hearth_firewall_last_success_timestamp_seconds Unix time the firewall table was last known to hold the desired rules, 0 if never.
# TYPE hearth_firewall_last_success_timestamp_seconds gauge
hearth_firewall_last_success_timestamp_seconds 1.7000000605e+09
# HELP hearth_firewall_rules Firewall rules in force.
# TYPE hearth_firewall_rules gauge
hearth_firewall_rules 3
`
	compare(t, n.Registry(), strings.Replace(want, "%d", "4", 1), firewallNames...)
	mu.Lock()
	st.Applies = 5
	mu.Unlock()
	compare(t, n.Registry(), strings.Replace(want, "%d", "5", 1), firewallNames...)
}

var firewallNames = []string{
	"hearth_firewall_applies_total", "hearth_firewall_apply_failures_total",
	"hearth_firewall_drift_failures_total", "hearth_firewall_drift_repairs_total",
	"hearth_firewall_last_apply_timestamp_seconds", "hearth_firewall_last_drift_check_timestamp_seconds",
	"hearth_firewall_last_success_timestamp_seconds", "hearth_firewall_rules",
}

func TestSSHKeyCollector(t *testing.T) {
	n := NewNode("test")
	if got := testutil.CollectAndCount(n.Registry(), "hearth_ssh_key_syncs_total"); got != 0 {
		t.Fatalf("ssh key metrics before registration: %d", got)
	}
	n.RegisterSSHKeys(func() SSHKeyStats { return SSHKeyStats{Syncs: 9, Writes: 2, Failures: 1} })
	compare(t, n.Registry(), `
# HELP hearth_ssh_key_sync_failures_total Syncs of the authorized_keys entries that failed.
# TYPE hearth_ssh_key_sync_failures_total counter
hearth_ssh_key_sync_failures_total 1
# HELP hearth_ssh_key_syncs_total Syncs of the managed authorized_keys entries.
# TYPE hearth_ssh_key_syncs_total counter
hearth_ssh_key_syncs_total 9
# HELP hearth_ssh_key_writes_total Times the authorized_keys file was rewritten.
# TYPE hearth_ssh_key_writes_total counter
hearth_ssh_key_writes_total 2
`, "hearth_ssh_key_sync_failures_total", "hearth_ssh_key_syncs_total", "hearth_ssh_key_writes_total")
}

func TestControlSyncLag(t *testing.T) {
	n := NewNode("test")
	start := n.sync.start
	clock := start
	n.now = func() time.Time { return clock }
	var last time.Time
	n.RegisterControlSync(func() time.Time { return last })

	lag := func() float64 {
		t.Helper()
		return gatherOne(t, n.Registry(), "hearth_control_sync_lag_seconds").GetGauge().GetValue()
	}
	clock = start.Add(40 * time.Second)
	if got := lag(); got != 40 {
		t.Fatalf("lag before any sync = %v, want 40 (time since start)", got)
	}
	last = start.Add(35 * time.Second)
	if got := lag(); got != 5 {
		t.Fatalf("lag = %v, want 5", got)
	}
	clock = clock.Add(time.Minute)
	if got := lag(); got != 65 {
		t.Fatalf("lag = %v, want 65", got)
	}
	ts := gatherOne(t, n.Registry(), "hearth_control_last_sync_timestamp_seconds").GetGauge().GetValue()
	if want := float64(last.UnixNano()) / 1e9; ts != want {
		t.Fatalf("last sync timestamp = %v, want %v", ts, want)
	}
}

func TestBuildInfo(t *testing.T) {
	n := NewNode("v1.2.3")
	m := gatherOne(t, n.Registry(), "hearth_build_info")
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["version"] != "v1.2.3" || !strings.HasPrefix(labels["goversion"], "go") || m.GetGauge().GetValue() != 1 {
		t.Fatalf("build info: %v", m)
	}
}

func TestGoAndProcessCollectorsRegistered(t *testing.T) {
	for name, reg := range map[string]*prometheus.Registry{
		"node": NewNode("t").Registry(), "control": NewControl("t").Registry(),
	} {
		for _, metric := range []string{"go_goroutines", "process_resident_memory_bytes"} {
			if testutil.CollectAndCount(reg, metric) != 1 {
				t.Errorf("%s: %s missing", name, metric)
			}
		}
	}
}

func TestConcurrentObservationsAndScrapes(t *testing.T) {
	// Run with -race: hot-path methods, lazy child creation and scrapes
	// all at once.
	n := NewNode("test")
	n.RegisterQueueDepth(func() int { return 1 })
	const workers, per = 4, 500
	codes := []int{200, 400, 401, 404, 429, 500, 503}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				n.Request(RouteChatCompletions, codes[(w+i)%len(codes)])
				n.Rejected([]string{RejectQueueFull, RejectDraining}[i%2])
				n.ObserveTTFT(RouteChatCompletions, time.Duration(i)*time.Millisecond)
				n.Generation(RouteChatCompletions, "m", FinishStop, i%2 == 0)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			if _, err := n.Registry().Gather(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	total := 0.0
	for _, m := range gatherFamily(t, n.Registry(), "hearth_http_requests_total").GetMetric() {
		total += m.GetCounter().GetValue()
	}
	if total != workers*per {
		t.Fatalf("requests counted %v, want %d", total, workers*per)
	}
	if got := gatherOne(t, n.Registry(), "hearth_time_to_first_token_seconds").GetHistogram().GetSampleCount(); got != workers*per {
		t.Fatalf("ttft count %d, want %d", got, workers*per)
	}
}

func TestHotPathAllocs(t *testing.T) {
	n := NewNode("test")
	// Warm the lazily resolved children first.
	n.Request(RouteModels, 200)
	n.Rejected(RejectQueueFull)
	n.ObserveTTFT(RouteChatCompletions, time.Second)
	n.ObserveRequest(RouteChatCompletions, "m", time.Second)
	n.Generation(RouteChatCompletions, "m", FinishLength, false)
	n.Tokens(RouteChatCompletions, "m", 1, 1, 1)
	n.Embedded("m", 1)
	for name, f := range map[string]func(){
		"Request":           func() { n.Request(RouteModels, 200) },
		"ObserveTTFT":       func() { n.ObserveTTFT(RouteChatCompletions, 12*time.Millisecond) },
		"ObserveInterToken": func() { n.ObserveInterToken(3 * time.Millisecond) },
		"ObserveRequest":    func() { n.ObserveRequest(RouteChatCompletions, "m", time.Second) },
		"Generation":        func() { n.Generation(RouteChatCompletions, "m", FinishLength, false) },
		"Tokens":            func() { n.Tokens(RouteChatCompletions, "m", 10, 20, 5) },
		"Embedded":          func() { n.Embedded("m", 2) },
		"Rejected":          func() { n.Rejected(RejectQueueFull) },
	} {
		if a := testing.AllocsPerRun(100, f); a != 0 {
			t.Errorf("%s allocates %v times per call", name, a)
		}
	}
}

// The deployment API's routes keep their own label; anything else is other.
func TestRoutesKeepTheirLabel(t *testing.T) {
	for _, r := range []string{RouteChatCompletions, RouteCompletions, RouteEmbeddings, RouteModels, RouteHealthz, RouteReadyz} {
		if got := canonicalRoute(r); got != r {
			t.Errorf("%s counted as %s", r, got)
		}
	}
	if got := canonicalRoute("/api/v1/nope"); got != RouteOther {
		t.Errorf("unknown route counted as %s", got)
	}
}
