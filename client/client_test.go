package client

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// handlerTransport serves requests with a handler in memory: no sockets,
// so a client using it runs inside a synctest bubble, where time moves
// only when every goroutine waits.
type handlerTransport struct {
	h http.Handler
	// lose, if it returns true for a request, runs the handler but
	// drops its answer, as a connection that broke after the request was
	// sent.
	lose func(*http.Request) bool
}

func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if t.lose != nil && t.lose(r) {
		return nil, errors.New("connection reset by peer")
	}
	return rec.Result(), nil
}

// recorder keeps what a fake API saw.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

type seen struct {
	method, path, query, idem string
	at                        time.Time
	body                      string
}

func (r *recorder) add(req *http.Request) {
	var b []byte
	if req.Body != nil { // nil in a client's request without a body
		b, _ = io.ReadAll(req.Body)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, seen{method: req.Method, path: req.URL.EscapedPath(), query: req.URL.RawQuery,
		idem: req.Header.Get("Idempotency-Key"), at: time.Now(), body: string(b)})
}

func (r *recorder) all() []seen {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]seen(nil), r.reqs...)
}

func writeErr(w http.ResponseWriter, status int, code, param, msg string) {
	w.Header().Set("X-Request-Id", "req_test123")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	p := "null"
	if param != "" {
		p = strconv.Quote(param)
	}
	fmt.Fprintf(w, `{"error":{"code":%q,"message":%q,"param":%s,"request_id":"req_test123"}}`, code, msg, p)
}

func newTestClient(t *testing.T, tr http.RoundTripper, opts ...Option) *Client {
	t.Helper()
	opts = append([]Option{WithToken("hct_test"), WithHTTPClient(&http.Client{Transport: tr}),
		WithRetries(3, 100*time.Millisecond, time.Second)}, opts...)
	c, err := New("http://127.0.0.1:8400", opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestAPIErrorCarriesStatusCodeParamAndRequestID(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer hct_test" {
			writeErr(w, 401, CodeUnauthorized, "", "missing or invalid token")
			return
		}
		writeErr(w, 404, CodeNotFound, "id", "server srv_x not found")
	}))
	defer srv.Close()
	c, err := New(srv.URL, WithToken("hct_test"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.GetServer(context.Background(), "srv_x")
	if !errors.As(err, &APIError{}) {
		t.Fatalf("errors.As(err, &APIError{}) false for %v", err)
	}
	var e APIError
	errors.As(err, &e)
	want := APIError{StatusCode: 404, Code: CodeNotFound, Message: "server srv_x not found", Param: "id", RequestID: "req_test123"}
	if e != want {
		t.Fatalf("error %+v, want %+v", e, want)
	}
	if !IsNotFound(err) || !HasCode(err, CodeNotFound) || HasCode(err, CodeConflict) {
		t.Fatalf("IsNotFound/HasCode wrong for %v", err)
	}
	if s := err.Error(); !strings.Contains(s, "server srv_x not found") || !strings.Contains(s, "param id") ||
		!strings.Contains(s, "request req_test123") {
		t.Fatalf("message %q lacks the API's message, param or request ID", s)
	}

	bad, _ := New(srv.URL, WithToken("wrong"))
	_, err = bad.GetServer(context.Background(), "srv_x")
	if !HasCode(err, CodeUnauthorized) || IsNotFound(err) {
		t.Fatalf("wrong token: %v", err)
	}
}

func TestAnswerNotFromTheAPIIsStillAnAPIError(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
		io.WriteString(w, "<html>bad gateway</html>")
	}))
	defer srv.Close()
	c, _ := New(srv.URL, WithRetries(0, 0, 0))
	_, err := c.ListServers(context.Background(), ListServersParams{})
	var e APIError
	if !errors.As(err, &e) || e.StatusCode != 502 || e.Code != "" || !strings.Contains(e.Message, "<html>bad gateway</html>") {
		t.Fatalf("error %#v", err)
	}
	if !strings.Contains(e.Error(), "HTTP 502") {
		t.Fatalf("message %q does not say HTTP 502", e.Error())
	}
}

var idemKeyRe = regexp.MustCompile(`^hcli_[0-9A-Za-z]{24}$`)

func TestCreatesCarryAnIdempotencyKey(t *testing.T) {
	rec := &recorder{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		switch r.Method {
		case http.MethodPost:
			w.WriteHeader(201)
			io.WriteString(w, `{"id":"sk_1"}`)
		case http.MethodDelete:
			w.WriteHeader(204)
		default:
			io.WriteString(w, `{"id":"srv_1"}`)
		}
	})
	c := newTestClient(t, handlerTransport{h: h})
	ctx := context.Background()
	if _, err := c.CreateSSHKey(ctx, CreateSSHKeyRequest{Name: "a", PublicKey: "ssh-ed25519 AAAA"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSSHKey(ctx, CreateSSHKeyRequest{Name: "a", PublicKey: "ssh-ed25519 AAAA"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSSHKey(WithIdempotencyKey(ctx, "my-key-1"), CreateSSHKeyRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UpdateServer(ctx, "srv_1", UpdateServerRequest{Name: "b"}); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteServer(ctx, "srv_1"); err != nil {
		t.Fatal(err)
	}
	r := rec.all()
	if len(r) != 5 {
		t.Fatalf("%d requests", len(r))
	}
	if !idemKeyRe.MatchString(r[0].idem) || !idemKeyRe.MatchString(r[1].idem) || r[0].idem == r[1].idem {
		t.Fatalf("generated keys %q %q: want two different hcli_ keys", r[0].idem, r[1].idem)
	}
	if r[2].idem != "my-key-1" {
		t.Fatalf("WithIdempotencyKey: sent %q", r[2].idem)
	}
	if r[3].idem != "" || r[4].idem != "" {
		t.Fatalf("PATCH/DELETE sent Idempotency-Key %q %q", r[3].idem, r[4].idem)
	}
	if r[3].body != `{"name":"b"}` {
		t.Fatalf("PATCH body %s: only the fields set", r[3].body)
	}
}

func TestRateLimitedRequestWaitsRetryAfterAndKeepsItsKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec.add(r)
			if len(rec.all()) == 1 {
				w.Header().Set("Retry-After", "7")
				writeErr(w, 429, CodeRateLimited, "", "too many requests")
				return
			}
			w.WriteHeader(201)
			io.WriteString(w, `{"id":"srv_1","status":"provisioning"}`)
		})
		c := newTestClient(t, handlerTransport{h: h}, WithRetries(3, 100*time.Millisecond, 10*time.Second))
		start := time.Now()
		srv, err := c.CreateServer(context.Background(), CreateServerRequest{Name: "web"})
		if err != nil || srv.ID != "srv_1" {
			t.Fatalf("create: %+v %v", srv, err)
		}
		r := rec.all()
		if len(r) != 2 || r[0].idem == "" || r[0].idem != r[1].idem || r[0].body != r[1].body {
			t.Fatalf("attempts %+v: want 2 with one key and body", r)
		}
		if waited := r[1].at.Sub(start); waited != 7*time.Second {
			t.Fatalf("retried after %v, want Retry-After's 7s", waited)
		}
	})
}

func TestLostAnswerIsRetriedWithTheSameKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			rec.add(r)
			w.WriteHeader(201)
			io.WriteString(w, `{"id":"fw_1"}`)
		})
		lost := 0
		tr := handlerTransport{h: h, lose: func(*http.Request) bool { lost++; return lost <= 2 }}
		c := newTestClient(t, tr)
		rule, err := c.CreateFirewallRule(context.Background(), "srv_1", CreateFirewallRuleRequest{Direction: Inbound, Protocol: TCP, Action: Allow})
		if err != nil || rule.ID != "fw_1" {
			t.Fatalf("create: %+v %v", rule, err)
		}
		r := rec.all()
		if len(r) != 3 || r[0].idem != r[1].idem || r[1].idem != r[2].idem {
			t.Fatalf("attempts %+v: want 3 with one key", r)
		}
		// Jittered exponential backoff: [50, 100] ms, then [100, 200] ms.
		if d := r[1].at.Sub(r[0].at); d < 50*time.Millisecond || d > 100*time.Millisecond {
			t.Fatalf("first pause %v", d)
		}
		if d := r[2].at.Sub(r[1].at); d < 100*time.Millisecond || d > 200*time.Millisecond {
			t.Fatalf("second pause %v", d)
		}
	})
}

func TestDeleteWhoseAnswerWasLostIsDone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		exists := true
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			if !exists {
				writeErr(w, 404, CodeNotFound, "id", "not found")
				return
			}
			exists = false
			w.WriteHeader(204)
		})
		first := true
		tr := handlerTransport{h: h, lose: func(*http.Request) bool { l := first; first = false; return l }}
		if err := newTestClient(t, tr).DeleteServer(context.Background(), "srv_1"); err != nil {
			t.Fatalf("delete after a lost answer: %v", err)
		}
		// Without a lost answer, a 404 is a 404.
		if err := newTestClient(t, handlerTransport{h: h}).DeleteServer(context.Background(), "srv_1"); !IsNotFound(err) {
			t.Fatalf("second delete: %v", err)
		}
	})
}

func TestPatchIsNotSentTwiceBlindly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			w.WriteHeader(503)
		})
		tr := handlerTransport{h: h, lose: func(r *http.Request) bool { return r.Method == http.MethodPatch && calls == 1 }}
		c := newTestClient(t, tr)
		if _, err := c.UpdateServer(context.Background(), "srv_1", UpdateServerRequest{Model: "m"}); err == nil || calls != 1 {
			t.Fatalf("PATCH with a lost answer: %v after %d calls, want an error after 1", err, calls)
		}
		calls = 5 // answers 503 from now on: not retried either
		if _, err := c.UpdateServer(context.Background(), "srv_1", UpdateServerRequest{Model: "m"}); !hasStatus(err, 503) || calls != 6 {
			t.Fatalf("PATCH answered 503: %v after %d calls", err, calls-5)
		}
	})
}

// TestPatchIsRetriedWhenNothingChanged: a 503 whose code says the control
// plane's database was out of reach changed nothing, so even a PATCH is
// sent again.
func TestPatchIsRetriedWhenNothingChanged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			if calls == 1 {
				writeErr(w, 503, CodeUnavailable, "", "the control plane's database is unavailable")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id":"srv_1","name":"a","status":"updating"}`))
		})
		c := newTestClient(t, handlerTransport{h: h})
		if _, err := c.UpdateServer(context.Background(), "srv_1", UpdateServerRequest{Model: "m"}); err != nil || calls != 2 {
			t.Fatalf("PATCH after a 503 unavailable: %v after %d calls, want success after 2", err, calls)
		}
	})
}

func TestUnavailableIsRetriedUntilTheRetriesRunOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			writeErr(w, 503, "", "", "shutting down")
		})
		_, err := newTestClient(t, handlerTransport{h: h}).GetServer(context.Background(), "srv_1")
		if !hasStatus(err, 503) || calls != 4 {
			t.Fatalf("%v after %d calls, want the 503 after 1+3", err, calls)
		}
		calls = 0
		c := newTestClient(t, handlerTransport{h: h}, WithRetries(0, 0, 0))
		if _, err := c.GetServer(context.Background(), "srv_1"); !hasStatus(err, 503) || calls != 1 {
			t.Fatalf("no retries: %v after %d calls", err, calls)
		}
	})
}

func TestCancelledContextEndsTheWaitForARetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "30")
			writeErr(w, 429, CodeRateLimited, "", "slow down")
		})
		c := newTestClient(t, handlerTransport{h: h}, WithRetries(3, time.Second, time.Minute))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.ListSSHKeys(ctx, ListParams{})
		if !errors.Is(err, context.DeadlineExceeded) || !HasCode(err, CodeRateLimited) {
			t.Fatalf("error %v: want the deadline and the 429 it waited on", err)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Fatalf("returned after %v", d)
		}
	})
}

func TestRetryAfterBeyondTheLongestPauseIsReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			w.Header().Set("Retry-After", "3600")
			writeErr(w, 429, CodeRateLimited, "", "slow down")
		})
		start := time.Now()
		_, err := newTestClient(t, handlerTransport{h: h}).ListSSHKeys(context.Background(), ListParams{})
		var e APIError
		if !errors.As(err, &e) || e.RetryAfter != time.Hour || calls != 1 || time.Since(start) != 0 {
			t.Fatalf("%v (%+v) after %d calls and %v: want the 429 at once", err, e, calls, time.Since(start))
		}
	})
}

// fakeKeys serves GET /v1/ssh-keys over n keys, newest first, with the
// API's cursor rules (the cursor is the last ID served).
func fakeKeys(n int, rec *recorder) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
		if limit == 0 {
			limit = 20
		}
		start := n
		if c := r.URL.Query().Get("cursor"); c != "" {
			start, _ = strconv.Atoi(strings.TrimPrefix(c, "k"))
			if r.URL.Query().Get("cursor") == "bad" {
				writeErr(w, 400, CodeInvalidRequest, "cursor", "bad cursor")
				return
			}
		}
		var page List[SSHKey]
		for i := start; i > 0 && len(page.Data) < limit; i-- {
			page.Data = append(page.Data, SSHKey{ID: fmt.Sprintf("sk_%d", i)})
		}
		last := start - len(page.Data)
		if last > 0 {
			next := fmt.Sprintf("k%d", last)
			page.HasMore, page.NextCursor = true, &next
		}
		json.NewEncoder(w).Encode(page)
	})
}

func TestAllFollowsCursorsAndStopsWhenTheLoopDoes(t *testing.T) {
	rec := &recorder{}
	c := newTestClient(t, handlerTransport{h: fakeKeys(7, rec)})
	ctx := context.Background()
	var got []string
	for k, err := range c.AllSSHKeys(ctx, ListParams{Limit: 3}) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, k.ID)
	}
	if want := "sk_7 sk_6 sk_5 sk_4 sk_3 sk_2 sk_1"; strings.Join(got, " ") != want {
		t.Fatalf("walk %v, want %s", got, want)
	}
	r := rec.all()
	if len(r) != 3 || r[0].query != "limit=3" || r[1].query != "cursor=k4&limit=3" || r[2].query != "cursor=k1&limit=3" {
		t.Fatalf("pages %+v", r)
	}

	// Breaking out after 4 items fetches only the pages they are on; a
	// second walk of the same iterator starts over.
	rec.reqs = nil
	seq := c.AllSSHKeys(ctx, ListParams{Limit: 3})
	for range 2 {
		n := 0
		for _, err := range seq {
			if err != nil {
				t.Fatal(err)
			}
			if n++; n == 4 {
				break
			}
		}
	}
	if r := rec.all(); len(r) != 4 || r[2].query != "limit=3" {
		t.Fatalf("two walks of 4: %+v, want 2 pages each, each from the start", r)
	}

	// No limit: pages of 100, the most the API serves.
	rec.reqs = nil
	for range c.AllSSHKeys(ctx, ListParams{}) {
	}
	if r := rec.all(); len(r) != 1 || r[0].query != "limit=100" {
		t.Fatalf("default page size: %+v", r)
	}

	// An error is yielded once and ends the walk.
	n := 0
	for _, err := range c.AllSSHKeys(ctx, ListParams{Cursor: "bad"}) {
		n++
		if !HasCode(err, CodeInvalidRequest) {
			t.Fatalf("error %v", err)
		}
	}
	if n != 1 {
		t.Fatalf("%d yields after an error", n)
	}
}

func TestListParamsBecomeTheQuery(t *testing.T) {
	rec := &recorder{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		io.WriteString(w, `{"data":[],"has_more":false,"next_cursor":null}`)
	})
	c := newTestClient(t, handlerTransport{h: h})
	ctx := context.Background()
	c.ListServers(ctx, ListServersParams{ListParams: ListParams{Limit: 5, Cursor: "abc"}, Status: StatusRunning})
	c.ListFirewallRules(ctx, "srv_1", ListParams{})
	c.ListAPIKeys(ctx, "srv_1", ListParams{Limit: 100})
	r := rec.all()
	want := []string{"/v1/servers?cursor=abc&limit=5&status=running", "/v1/servers/srv_1/firewall-rules?",
		"/v1/servers/srv_1/api-keys?limit=100"}
	for i, w := range want {
		if got := r[i].path + "?" + r[i].query; got != w {
			t.Errorf("request %d: %s, want %s", i, got, w)
		}
	}
}

func TestIDsAreEscapedAndDotSegmentsRefused(t *testing.T) {
	rec := &recorder{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		writeErr(w, 404, CodeNotFound, "id", "not found")
	})
	c := newTestClient(t, handlerTransport{h: h})
	ctx := context.Background()
	for _, id := range []string{"", ".", ".."} {
		if _, err := c.GetServer(ctx, id); err == nil || errors.As(err, &APIError{}) {
			t.Errorf("GetServer(%q): %v, want a refusal before any request", id, err)
		}
	}
	if err := c.DeleteAPIKey(ctx, "srv_1", ".."); err == nil || errors.As(err, &APIError{}) {
		t.Errorf("DeleteAPIKey(.., ..): %v", err)
	}
	c.GetServer(ctx, "a/b?c")
	if r := rec.all(); len(r) != 1 || r[0].path != "/v1/servers/a%2Fb%3Fc" || r[0].query != "" {
		t.Fatalf("requests %+v", r)
	}
}

func TestNewChecksTheURL(t *testing.T) {
	for _, tc := range []struct {
		url   string
		opts  []Option
		ok    bool
		force string // the URL requests go to
	}{
		{url: "http://127.0.0.1:8400", ok: true, force: "http://127.0.0.1:8400"},
		{url: "http://localhost:8400/v1/", ok: true, force: "http://localhost:8400"},
		{url: "http://[::1]:8400", ok: true, force: "http://[::1]:8400"},
		{url: "https://control.example.com/", ok: true, force: "https://control.example.com"},
		{url: "https://example.com/hearth", ok: true, force: "https://example.com/hearth"},
		{url: "http://control.example.com"},
		{url: "http://10.0.0.5:8400"},
		{url: "http://10.0.0.5:8400", opts: []Option{WithAllowPlainHTTP()}, ok: true, force: "http://10.0.0.5:8400"},
		{url: "ftp://example.com"},
		{url: "example.com"},
		{url: "https://user:pw@example.com"},
		{url: "https://example.com?x=1"},
	} {
		c, err := New(tc.url, tc.opts...)
		if (err == nil) != tc.ok {
			t.Errorf("New(%q): %v, want ok %v", tc.url, err, tc.ok)
			continue
		}
		if c != nil && c.base.String() != tc.force {
			t.Errorf("New(%q): base %s, want %s", tc.url, c.base, tc.force)
		}
	}
	if _, err := New("https://x", WithRetries(-1, 0, 0)); err == nil {
		t.Error("negative retries accepted")
	}
}

type otherTransport struct{}

func (otherTransport) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("unused")
}

func TestCAFileIsTrusted(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"openapi":"3.1.0"}`)
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(ca, pemBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	untrusting, _ := New(srv.URL, WithRetries(0, 0, 0))
	if _, err := untrusting.GetOpenAPI(ctx); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("without the CA: %v, want a certificate error", err)
	}
	c, err := New(srv.URL, WithCAFile(ca))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := c.GetOpenAPI(ctx)
	if err != nil || string(doc) != `{"openapi":"3.1.0"}` {
		t.Fatalf("with the CA: %s %v", doc, err)
	}
	// The CA applies to a caller's client too, without changing it.
	own := &http.Client{Transport: &http.Transport{}}
	c, err = New(srv.URL, WithHTTPClient(own), WithCAFile(ca))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetOpenAPI(ctx); err != nil {
		t.Fatalf("own client with the CA: %v", err)
	}
	// (Cloning a transport sets up HTTP/2 in it, so only its roots are
	// compared.)
	if cfg := own.Transport.(*http.Transport).TLSClientConfig; cfg != nil && cfg.RootCAs != nil {
		t.Fatal("the caller's transport was given the CA")
	}

	if _, err := New(srv.URL, WithHTTPClient(&http.Client{Transport: otherTransport{}}), WithCAFile(ca)); err == nil {
		t.Fatal("CA file with a transport that cannot take it: accepted")
	}
	if _, err := New(srv.URL, WithCAFile(filepath.Join(t.TempDir(), "missing.pem"))); err == nil {
		t.Fatal("missing CA file accepted")
	}
	notPEM := filepath.Join(t.TempDir(), "x.pem")
	os.WriteFile(notPEM, []byte("hello"), 0o600)
	if _, err := New(srv.URL, WithCAFile(notPEM)); err == nil {
		t.Fatal("CA file without a certificate accepted")
	}
}

// statuses serves GET /v1/servers/srv_1 with the given statuses in turn
// (the last one repeats); "gone" answers 404.
func statuses(seq ...string) (http.Handler, *recorder) {
	rec := &recorder{}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.add(r)
		n := len(rec.all()) - 1
		s := seq[min(n, len(seq)-1)]
		if s == "gone" {
			writeErr(w, 404, CodeNotFound, "id", "server srv_1 not found")
			return
		}
		srv := Server{ID: "srv_1", Status: ServerStatus(s)}
		srv.Enforcement.Firewall.Status = EnforcementApplied
		srv.Enforcement.SSHKeys.Status = EnforcementApplied
		srv.Enforcement.APIKeys.Status = EnforcementApplied
		srv.Enforcement.Runtime.Status = EnforcementPending
		reported := time.Now()
		srv.Enforcement.ReportedAt = &reported
		if s == "failed" {
			msg := "pull llama: no space left"
			srv.Enforcement.Runtime.Status, srv.Enforcement.Runtime.Error = EnforcementFailed, &msg
		}
		json.NewEncoder(w).Encode(srv)
	}), rec
}

func TestWaitServerRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, rec := statuses("provisioning", "unreachable", "provisioning", "running")
		c := newTestClient(t, handlerTransport{h: h})
		var seenStatuses []ServerStatus
		start := time.Now()
		srv, err := c.WaitServerRunning(context.Background(), "srv_1", WaitOptions{Interval: 2 * time.Second,
			Progress: func(s Server) { seenStatuses = append(seenStatuses, s.Status) }})
		if err != nil || srv.Status != StatusRunning {
			t.Fatalf("wait: %+v %v", srv, err)
		}
		if fmt.Sprint(seenStatuses) != "[provisioning unreachable provisioning running]" {
			t.Fatalf("progress %v", seenStatuses)
		}
		if d := time.Since(start); d != 6*time.Second || len(rec.all()) != 4 {
			t.Fatalf("took %v and %d polls, want 3 intervals and 4 polls", d, len(rec.all()))
		}

		h, _ = statuses("provisioning", "failed")
		srv, err = newTestClient(t, handlerTransport{h: h}).WaitServerRunning(context.Background(), "srv_1", WaitOptions{})
		if !errors.Is(err, ErrServerFailed) || srv.Status != StatusFailed || !strings.Contains(err.Error(), "no space left") {
			t.Fatalf("failed server: %+v %v", srv, err)
		}
		h, _ = statuses("updating", "deleting")
		if _, err = newTestClient(t, handlerTransport{h: h}).WaitServerRunning(context.Background(), "srv_1", WaitOptions{}); !errors.Is(err, ErrServerDeleting) {
			t.Fatalf("deleted server: %v", err)
		}
		h, _ = statuses("gone")
		if _, err = newTestClient(t, handlerTransport{h: h}).WaitServerRunning(context.Background(), "srv_1", WaitOptions{}); !IsNotFound(err) {
			t.Fatalf("gone server: %v", err)
		}
		h, _ = statuses("provisioning")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err = newTestClient(t, handlerTransport{h: h}).WaitServerRunning(ctx, "srv_1", WaitOptions{}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("never running: %v", err)
		}
	})
}

func TestWaitServerGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, rec := statuses("deleting", "deleting", "gone")
		c := newTestClient(t, handlerTransport{h: h})
		progress := 0
		start := time.Now()
		if err := c.WaitServerGone(context.Background(), "srv_1", WaitOptions{Progress: func(Server) { progress++ }}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d != 2*time.Second || len(rec.all()) != 3 || progress != 2 {
			t.Fatalf("took %v, %d polls, %d progress calls", d, len(rec.all()), progress)
		}
	})
}

func TestDiagnose(t *testing.T) {
	e := func(s string) *string { return &s }
	now := time.Now()
	for _, tc := range []struct {
		enf  Enforcement
		want string
	}{
		{Enforcement{Firewall: EnforcementConcern{Status: "applied"}, SSHKeys: EnforcementConcern{Status: "applied"},
			APIKeys: EnforcementConcern{Status: "applied"}, Runtime: RuntimeEnforcement{Status: "applied"}, ReportedAt: &now}, ""},
		{Enforcement{Firewall: EnforcementConcern{Status: "pending"}, SSHKeys: EnforcementConcern{Status: "pending"},
			APIKeys: EnforcementConcern{Status: "pending"}, Runtime: RuntimeEnforcement{Status: "pending"}},
			"no report from the node yet"},
		{Enforcement{Firewall: EnforcementConcern{Status: "pending"}, SSHKeys: EnforcementConcern{Status: "applied"},
			APIKeys: EnforcementConcern{Status: "pending"}, Runtime: RuntimeEnforcement{Status: "pending", Healthy: true}, ReportedAt: &now},
			"firewall pending, api keys pending, model pending"},
		{Enforcement{Firewall: EnforcementConcern{Status: "failed", Error: e("nft: boom")}, SSHKeys: EnforcementConcern{Status: "applied"},
			APIKeys: EnforcementConcern{Status: "applied"}, Runtime: RuntimeEnforcement{Status: "pending", Healthy: true,
				Progress: &PullProgress{Status: "pulling abc", Completed: 25, Total: 100}}, ReportedAt: &now},
			"firewall failed: nft: boom, model pulling abc 25%"},
		{Enforcement{Firewall: EnforcementConcern{Status: "applied"}, SSHKeys: EnforcementConcern{Status: "applied"},
			APIKeys: EnforcementConcern{Status: "applied"}, Runtime: RuntimeEnforcement{Status: "failed", Error: e("no such model")}, ReportedAt: &now},
			"runtime failed: no such model"},
		{Enforcement{Firewall: EnforcementConcern{Status: "applied"}, SSHKeys: EnforcementConcern{Status: "applied"},
			APIKeys: EnforcementConcern{Status: "applied"}, Runtime: RuntimeEnforcement{Status: "pending"}, ReportedAt: &now},
			"runtime unhealthy"},
	} {
		if got := Diagnose(Server{Enforcement: tc.enf}); got != tc.want {
			t.Errorf("Diagnose = %q, want %q", got, tc.want)
		}
	}
}
