package bench

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestLoadClosedLoopReusesConnections(t *testing.T) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(NewMock("bench", MockConfig{Tokens: 3}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	res, err := RunLoad(context.Background(), LoadConfig{Target: srv.URL + "/v1", Model: "bench", Concurrency: 3, Requests: 30, ExpectTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 30 || res.Completed != 30 || res.Errors != 0 || res.Tokens != 90 ||
		len(res.TTFT) != 30 || len(res.Gaps) != 60 || len(res.Total) != 30 {
		t.Fatalf("result %+v", res)
	}
	if res.ContentBytes != int64(30*MockTokenBytes(3)) {
		t.Fatalf("content bytes %d, want %d", res.ContentBytes, 30*MockTokenBytes(3))
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections for 3 streams", n)
	}
}

func TestLoadOpenLoop(t *testing.T) {
	m := startTestMock(t, MockConfig{Tokens: 2})
	res, err := RunLoad(context.Background(), LoadConfig{Target: m.URL + "/v1", Model: "bench", Rate: 100, Concurrency: 50, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// 100/s for 200 ms starts 20 requests.
	if res.Requests != 20 || res.Completed != 20 || res.Errors != 0 {
		t.Fatalf("result %+v", res)
	}
}

func TestLoadCountsErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer k1" {
			http.Error(w, `{"error":{"message":"bad key"}}`, http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		// A stream cut short: no finish_reason, no [DONE].
		_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n"))
	}))
	defer srv.Close()
	for _, tc := range []struct{ key, want string }{
		{"k2", "status 401"},
		{"k1", "without [DONE]"},
	} {
		res, err := RunLoad(context.Background(), LoadConfig{Target: srv.URL + "/api/v1", Key: tc.key, Model: "m", Requests: 2})
		if err != nil {
			t.Fatal(err)
		}
		if res.Errors != 2 || res.Completed != 0 || len(res.ErrorSamples) == 0 || !strings.Contains(res.ErrorSamples[0], tc.want) {
			t.Fatalf("key %s: result %+v", tc.key, res)
		}
	}
}
