package daemon

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/deployapi"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/systemd"
)

// TestServeAPIStopsBeforeServing: a node told to stop the moment its API
// starts (its runtime failing at once) still stops. fasthttp's Shutdown
// before Serve has taken the listener closes nothing, and Serve then
// accepted forever: TestNodeStopsWithoutItsRuntime hung so in CI.
func TestServeAPIStopsBeforeServing(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	// One processor and many tries: under the race detector (make test)
	// the goroutine that shuts the server down runs before the one that
	// serves in some of them, as it can on a busy machine; without the
	// fix the test then fails in seconds.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range 300 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		api := deployapi.NewAPI(deployapi.APIConfig{Model: "m", Version: "test", MaxConcurrent: 1, MaxQueue: 1},
			fake.New(fake.Config{Tokens: []string{"x"}}), nil, metrics.NewNode("test"), log)
		nd := &node{cfg: Config{ShutdownTimeout: time.Second}, log: log, notify: &systemd.Fake{}, api: api, ln: ln,
			srv: api.Server(time.Second, time.Second)}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // stopped before Serve has run
		done := make(chan error, 1)
		go func() { done <- nd.serveAPI(ctx) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("serveAPI = %v, want nil after a stop", err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("serveAPI did not return after its stop: Serve still accepting")
		}
		api.Close()
		_ = ln.Close()
	}
}

// TestConnectionsPerSourceAreCapped: one address holds at most
// max_conns_per_source connections to the deployment API; the next is
// closed before anything is read, and a slot freed is usable again.
func TestConnectionsPerSourceAreCapped(t *testing.T) {
	tn := startNodeWith(t, func(c *Config) { c.MaxConnsPerSource = 3 })
	addr := strings.TrimPrefix(tn.base, "http://")
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// served reports whether c answers a request, and keeps it open.
	served := func(c net.Conn) bool {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			return false
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	// The watchdog's probes come from loopback too: wait until they
	// leave the slots free.
	var held []net.Conn
	testutil.WaitFor(t, 30*time.Second, "three connections served", func() bool {
		for _, c := range held {
			c.Close()
		}
		held = []net.Conn{dial(), dial(), dial()}
		return served(held[0]) && served(held[1]) && served(held[2])
	})
	if served(dial()) {
		t.Fatal("a fourth connection from the same address was served")
	}
	held[0].Close()
	testutil.WaitFor(t, 30*time.Second, "the freed slot taken again", func() bool { return served(dial()) })
	for _, c := range held[1:] {
		if !served(c) {
			t.Fatal("a connection within the cap was dropped")
		}
	}
}
