package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/metrics/promtest"
)

// A real Prometheus scrapes a running hearthd: up == 1 and a non-empty TTFT
// histogram after a completion; promtool finds the exposition clean; the
// public API port does not serve metrics.
func TestPrometheusScrapesHearthd(t *testing.T) {
	h, inst := attached(t)
	c := h.client(h.secret)
	p := userParams(inst.Model, "hello", 8)
	stream := c.Chat.Completions.NewStreaming(context.Background(), p)
	for stream.Next() {
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	addr := h.waitLog(metricsRe, 0, 10*time.Second)[1]

	body, err := scrape(addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`hearth_generations_total{finish_reason="length",model="` + inst.Model + `",route="chat",stream="true"} 1`,
		`hearth_tokens_total{kind="completion",model="` + inst.Model + `",route="chat"} 8`,
		`hearth_time_to_first_token_seconds_count{route="chat"} 1`,
		`hearth_runtime_up 1`,
		`hearth_build_info{`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	check := exec.Command("promtool", "check", "metrics")
	check.Stdin = strings.NewReader(body)
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}

	pub, err := http.Get(h.root + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	pub.Body.Close()
	if pub.StatusCode != 404 {
		t.Fatalf("public port serves /metrics: %d", pub.StatusCode)
	}

	prom := promtest.Start(t, addr)
	prom.WaitFor(t, `up`, func(v float64) bool { return v == 1 }, 30*time.Second)
	prom.WaitFor(t, `hearth_time_to_first_token_seconds_count`, func(v float64) bool { return v > 0 }, 30*time.Second)
}
