package daemon

import (
	"context"
	"log/slog"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/hearthd/hearth/deployapi"
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
