package nodeapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
)

func TestClientRoundTrip(t *testing.T) {
	want := nodeapi.Desired{NodeID: "node_1", Revision: 7, Server: &nodeapi.Server{ID: "srv_1", Name: "web", Stack: "deployment", Model: "m"},
		Model: "m", SSHKeys: []sshkeys.Key{{ID: "sk_1", PublicKey: "ssh-ed25519 AAAA", Fingerprint: "SHA256:x"}},
		FirewallRules: []firewall.Rule{{ID: "fw_1", Direction: "inbound", Protocol: "tcp", PortRange: "22", Action: "allow"}}}
	var gotObserved nodeapi.Observed
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+nodeapi.PathEnroll, func(w http.ResponseWriter, r *http.Request) {
		var req nodeapi.EnrollRequest
		if r.Header.Get("Authorization") != "Bearer hce_tok" || json.NewDecoder(r.Body).Decode(&req) != nil || req.Hardware.RAM != 64 {
			w.Header().Set("X-Request-Id", "req_1")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":{"code":"unauthorized","message":"no","param":null,"request_id":"req_1"}}`))
			return
		}
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(nodeapi.EnrollResponse{NodeID: "node_1", Credential: "hcn_cred"})
	})
	mux.HandleFunc("GET "+nodeapi.PathDesired, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hcn_cred" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Get("after") == "7" {
			if r.URL.Query().Get("wait") != "0.25" {
				t.Errorf("wait %q", r.URL.Query().Get("wait"))
			}
			w.WriteHeader(http.StatusNoContent)
			return
		}
		_ = json.NewEncoder(w).Encode(want)
	})
	mux.HandleFunc("POST "+nodeapi.PathObserved, func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewDecoder(r.Body).Decode(&gotObserved)
		w.WriteHeader(http.StatusNoContent)
	})
	ts := httptest.NewServer(mux)
	defer ts.Close()
	ctx := context.Background()

	c := nodeapi.NewClient(ts.URL+"/", nil)
	_, err := c.Enroll(ctx, "hce_wrong", nodeapi.EnrollRequest{Hostname: "h", Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1}})
	var apiErr *nodeapi.Error
	if !nodeapi.IsUnauthorized(err) || !errors.As(err, &apiErr) || apiErr.Code != "unauthorized" || apiErr.RequestID != "req_1" {
		t.Fatalf("enroll with a wrong token: %v", err)
	}
	resp, err := c.Enroll(ctx, "hce_tok", nodeapi.EnrollRequest{Hostname: "h", Hardware: nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1}})
	if err != nil || resp.Credential != "hcn_cred" {
		t.Fatalf("enroll: %+v %v", resp, err)
	}
	if _, _, err := c.Desired(ctx, 0, 0); !nodeapi.IsUnauthorized(err) {
		t.Fatalf("desired without credential: %v", err)
	}
	c.SetCredential(resp.Credential)
	d, changed, err := c.Desired(ctx, 0, 0)
	if err != nil || !changed || !reflect.DeepEqual(d, want) {
		t.Fatalf("desired %+v changed %v err %v", d, changed, err)
	}
	_, changed, err = c.Desired(ctx, 7, 250*time.Millisecond)
	if err != nil || changed {
		t.Fatalf("desired after 7: changed %v err %v", changed, err)
	}
	o := nodeapi.Observed{Revision: 7, IP: "192.0.2.1", RuntimeHealthy: true, FirewallRevision: 7, SSHKeysRevision: 6, SSHKeysError: "x"}
	if err := c.ReportObserved(ctx, o); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotObserved, o) {
		t.Fatalf("observed %+v, want %+v", gotObserved, o)
	}
}

// A throttled node learns how long to wait: Retry-After comes with the error.
func TestClientCarriesRetryAfter(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "3")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"error":{"code":"rate_limited","message":"slow down","param":null,"request_id":"req_2"}}`))
	}))
	defer ts.Close()
	err := nodeapi.NewClient(ts.URL, nil).ReportObserved(context.Background(), nodeapi.Observed{})
	if d := nodeapi.RetryAfter(err); d != 3*time.Second {
		t.Fatalf("RetryAfter(%v) = %v, want 3s", err, d)
	}
	if d := nodeapi.RetryAfter(errors.New("other")); d != 0 {
		t.Fatalf("RetryAfter of a plain error = %v", d)
	}
}

// TestClientFailsOver: with a list of replicas, a replica that cannot be
// reached, or answers 503, sends the next request to the next replica; a
// refusal that is the caller's own (401) does not.
func TestClientFailsOver(t *testing.T) {
	var hits [2]atomic.Int32
	var status [2]atomic.Int32
	replica := func(i int) *httptest.Server {
		status[i].Store(http.StatusNoContent)
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			hits[i].Add(1)
			w.WriteHeader(int(status[i].Load()))
		}))
	}
	a, b := replica(0), replica(1)
	defer b.Close()
	c := nodeapi.NewClient(a.URL+", "+b.URL+"/", nil)
	c.SetCredential("cred")
	poll := func() error {
		_, _, err := c.Desired(context.Background(), 0, time.Millisecond)
		return err
	}
	if err := poll(); err != nil || hits[0].Load() != 1 {
		t.Fatalf("first poll: %v, hits %d/%d", err, hits[0].Load(), hits[1].Load())
	}
	a.Close() // replica A dies
	if err := poll(); err == nil {
		t.Fatal("poll to a dead replica succeeded")
	}
	if err := poll(); err != nil || hits[1].Load() != 1 || c.BaseURL() != b.URL {
		t.Fatalf("after A died: %v, hits on B %d, base %s", err, hits[1].Load(), c.BaseURL())
	}
	status[1].Store(http.StatusUnauthorized)
	_ = poll()
	if c.BaseURL() != b.URL {
		t.Fatalf("a 401 moved the client to %s", c.BaseURL())
	}
	status[1].Store(http.StatusServiceUnavailable)
	_ = poll()
	if c.BaseURL() != a.URL {
		t.Fatalf("a 503 left the client on %s", c.BaseURL())
	}
}

// TestReportSentAgainWhenTheConnectionBreaks: a report whose kept
// connection is closed before any answer is sent again on a fresh one and
// succeeds; an answer (here a 400) is never repeated.
func TestReportSentAgainWhenTheConnectionBreaks(t *testing.T) {
	var posts atomic.Int32
	var refuse atomic.Bool
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := posts.Add(1)
		if refuse.Load() {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		if n == 2 { // the second report comes on the kept connection
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer ts.Close()
	c := nodeapi.NewClient(ts.URL, nil)
	c.SetCredential("hcn_cred")
	for rev := range 2 {
		if err := c.ReportObserved(context.Background(), nodeapi.Observed{Revision: uint64(rev)}); err != nil {
			t.Fatalf("report %d: %v", rev, err)
		}
	}
	if n := posts.Load(); n != 3 {
		t.Fatalf("%d posts, want the broken report sent again once", n)
	}
	refuse.Store(true)
	if err := c.ReportObserved(context.Background(), nodeapi.Observed{Revision: 3}); err == nil {
		t.Fatal("a refused report succeeded")
	}
	if n := posts.Load(); n != 4 {
		t.Fatalf("%d posts, want a refused report sent once", n)
	}
}
