package metrics

import (
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/metrics/promtest"
)

// isPositive and equals are WaitFor conditions.
func isPositive(v float64) bool { return v > 0 }

func equals(want float64) func(float64) bool { return func(v float64) bool { return v == want } }

func TestRealPrometheusScrapesNode(t *testing.T) {
	n := NewNode("v9.9.9-prom")
	n.ObserveTTFT(RouteChatCompletions, 42*time.Millisecond)
	n.Request(RouteChatCompletions, 200)
	n.Request(RouteChatCompletions, 200)
	n.RegisterFirewall(func() FirewallStats {
		return FirewallStats{Applies: 1, LastSuccess: time.Unix(1750000000, 0)}
	})
	srv := httptest.NewServer(n.Handler())
	defer srv.Close()

	p := promtest.Start(t, strings.TrimPrefix(srv.URL, "http://"))
	const wait = 30 * time.Second
	p.WaitFor(t, `up`, equals(1), wait)
	if got := p.WaitFor(t, `hearth_time_to_first_token_seconds_count`, isPositive, wait); got != 1 {
		t.Fatalf("TTFT count %v, want 1", got)
	}
	if got := p.Query(t, `hearth_time_to_first_token_seconds_bucket{le="0.05"}`); got != 1 {
		t.Fatalf("TTFT le=0.05 bucket %v, want 1", got)
	}
	if got := p.Query(t, `hearth_http_requests_total{route="chat",code="200"}`); got != 2 {
		t.Fatalf("requests %v, want 2", got)
	}
	if got := p.Query(t, `hearth_build_info{version="v9.9.9-prom"}`); got != 1 {
		t.Fatalf("build info %v, want 1", got)
	}
	if got := p.Query(t, `hearth_firewall_last_success_timestamp_seconds`); got != 1750000000 {
		t.Fatalf("firewall last success %v", got)
	}

	// A later observation reaches Prometheus with the next scrape.
	n.ObserveTTFT(RouteChatCompletions, 3*time.Second)
	p.WaitFor(t, `hearth_time_to_first_token_seconds_count`, equals(2), wait)
}

func TestRealPrometheusIngestsNativeHistograms(t *testing.T) {
	n := NewNode("test")
	for _, ms := range []int{20, 21, 400} {
		n.ObserveTTFT(RouteChatCompletions, time.Duration(ms)*time.Millisecond)
	}
	srv := httptest.NewServer(n.Handler())
	defer srv.Close()

	p := promtest.StartWithOptions(t, promtest.Options{NativeHistograms: true}, strings.TrimPrefix(srv.URL, "http://"))
	p.WaitFor(t, `histogram_count(hearth_time_to_first_token_seconds)`, equals(3), 30*time.Second)
	// The median of the native histogram lies near the 20–21 ms pair
	// (native buckets at factor 1.1 are ~9% wide); the classic buckets
	// could only place it somewhere in 10–25 ms.
	med := p.Query(t, `histogram_quantile(0.5, hearth_time_to_first_token_seconds)`)
	if med < 0.018 || med > 0.023 {
		t.Fatalf("native median %v, want about 0.02", med)
	}
}
