package metrics

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestServeListenerServesMetricsAndStopsOnCancel(t *testing.T) {
	n := NewNode("v1-serve")
	n.Request(RouteHealthz, 200)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeListener(ctx, ln, n.Handler(), slog.New(slog.DiscardHandler)) }()

	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `hearth_http_requests_total{code="200",route="healthz"} 1`) ||
		!strings.Contains(body, `version="v1-serve"`) {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	if code, body := get("/"); code != 200 || !strings.Contains(body, `href="/metrics"`) {
		t.Fatalf("/: %d %s", code, body)
	}
	if code, _ := get("/other"); code != http.StatusNotFound {
		t.Fatalf("/other: %d", code)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeListener after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeListener did not return after cancel")
	}
	if _, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second); err == nil {
		t.Fatal("listener still accepting after shutdown")
	}
}

func TestServeReportsListenErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// The port is taken, so Serve must fail at once rather than block.
	err = Serve(context.Background(), ln.Addr().String(), http.NotFoundHandler(), nil)
	if err == nil || !strings.Contains(err.Error(), "listen on "+ln.Addr().String()) {
		t.Fatalf("Serve on a busy port: %v", err)
	}
}

func TestDefaultAddrsAreLoopback(t *testing.T) {
	for _, a := range []string{DefaultNodeAddr, DefaultControlAddr} {
		host, _, err := net.SplitHostPort(a)
		if err != nil || !net.ParseIP(host).IsLoopback() {
			t.Errorf("%s is not a loopback address (%v)", a, err)
		}
	}
}
