package metrics

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func scriptedControl() *Control {
	c := NewControl("v0.1.0-test")
	c.Request("/v1/servers", http.MethodGet, 200)
	c.Request("/v1/servers/{id}", http.MethodDelete, 404)
	c.RegisterNodesConnected(func() int { return 2 })
	c.RegisterServers(func() map[string]int { return map[string]int{"active": 3, "provisioning": 1} })
	c.RegisterNodes(func() map[string]int { return map[string]int{"idle": 1, "serving": 3, "unreachable": 0} })
	c.ObservePropagation(300 * time.Millisecond)
	c.ObservePropagation(40 * time.Second)
	return c
}

func TestControlMiddlewareCountsByPattern(t *testing.T) {
	c := NewControl("test")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/servers/{id}", func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("{}")) // implicit 200
	})
	mux.HandleFunc("POST /v1/servers", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	mux.HandleFunc("/v1/nodes/self/desired", func(w http.ResponseWriter, r *http.Request) {
		// A long poll flushes headers before answering.
		w.WriteHeader(http.StatusEarlyHints)
		w.(http.Flusher).Flush()
	})
	mux.HandleFunc("GET /panic", func(w http.ResponseWriter, r *http.Request) { panic("boom") })
	h := c.Middleware(mux)

	do := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	do("GET", "/v1/servers/srv_1")
	do("GET", "/v1/servers/srv_2")
	do("POST", "/v1/servers")
	do("DELETE", "/v1/servers") // mux answers 405
	do("GET", "/nothing/here")  // mux answers 404, no pattern
	do("BREW", "/v1/servers/srv_1")
	if rec := do("GET", "/v1/nodes/self/desired"); !rec.Flushed {
		t.Fatal("Flush did not reach the underlying writer")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("panic swallowed by the middleware")
			}
		}()
		do("GET", "/panic")
	}()

	compare(t, c.Registry(), `
# HELP hearth_control_http_requests_total Control-plane API requests answered, by route pattern, method and HTTP status code.
# TYPE hearth_control_http_requests_total counter
hearth_control_http_requests_total{code="200",method="GET",route="/v1/nodes/self/desired"} 1
hearth_control_http_requests_total{code="200",method="GET",route="/v1/servers/{id}"} 2
hearth_control_http_requests_total{code="201",method="POST",route="/v1/servers"} 1
hearth_control_http_requests_total{code="404",method="GET",route="other"} 1
hearth_control_http_requests_total{code="405",method="DELETE",route="other"} 1
hearth_control_http_requests_total{code="405",method="other",route="other"} 1
hearth_control_http_requests_total{code="500",method="GET",route="/panic"} 1
`, "hearth_control_http_requests_total")

	// Each request counted is timed under the same labels.
	var n uint64
	for _, m := range gatherFamily(t, c.Registry(), "hearth_control_http_request_duration_seconds").GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	if n != 8 {
		t.Errorf("%d requests timed, want 8", n)
	}
}

func TestControlScrapeFuncs(t *testing.T) {
	c := scriptedControl()
	compare(t, c.Registry(), `
# HELP hearth_control_nodes_connected Nodes currently connected to the control plane.
# TYPE hearth_control_nodes_connected gauge
hearth_control_nodes_connected 2
# HELP hearth_control_servers Servers known to the control plane, by status.
# TYPE hearth_control_servers gauge
hearth_control_servers{status="active"} 3
hearth_control_servers{status="provisioning"} 1
# HELP hearth_control_http_requests_total Control-plane API requests answered, by route pattern, method and HTTP status code.
# TYPE hearth_control_http_requests_total counter
hearth_control_http_requests_total{code="200",method="GET",route="/v1/servers"} 1
hearth_control_http_requests_total{code="404",method="DELETE",route="/v1/servers/{id}"} 1
# HELP hearth_control_nodes Enrolled nodes by state: idle (in the pool), serving, wiping (its server gone, not yet wiped), unreachable.
# TYPE hearth_control_nodes gauge
hearth_control_nodes{state="idle"} 1
hearth_control_nodes{state="serving"} 3
hearth_control_nodes{state="unreachable"} 0
`, "hearth_control_nodes_connected",
		"hearth_control_servers", "hearth_control_http_requests_total", "hearth_control_nodes")
	if h := gatherOne(t, c.Registry(), "hearth_control_propagation_delay_seconds").GetHistogram(); h.GetSampleCount() != 2 ||
		h.GetSampleSum() != 40.3 {
		t.Errorf("propagation delay: %v", h)
	}
	if m := gatherOne(t, c.Registry(), "hearth_build_info"); m.GetGauge().GetValue() != 1 {
		t.Fatalf("control build info: %v", m)
	}
}
