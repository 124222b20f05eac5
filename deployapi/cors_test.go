package deployapi

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/hearthd/hearth/llm/fake"
)

// preflight sends the preflight a browser sends before a page of origin
// POSTs JSON with a key and the OpenAI SDK's own headers to path.
func (ta *testAPI) preflight(t *testing.T, path, origin, method string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodOptions, ta.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Origin", origin)
	req.Header.Set("Access-Control-Request-Method", method)
	req.Header.Set("Access-Control-Request-Headers", "authorization,content-type,x-stainless-lang,x-stainless-retry-count")
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func headerList(h http.Header, name string) []string {
	var out []string
	for _, v := range h.Values(name) {
		for f := range strings.SplitSeq(v, ",") {
			out = append(out, strings.ToLower(strings.TrimSpace(f)))
		}
	}
	return out
}

// Without cors_allowed_origins a browser may not call the API: no
// preflight is answered and no answer is readable by another origin.
func TestCORSOffByDefault(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"hi"}}, nil)
	if r := ta.preflight(t, "/chat/completions", "https://app.example", "POST"); r.StatusCode != http.StatusMethodNotAllowed ||
		r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("preflight: %d %v", r.StatusCode, r.Header)
	}
	r := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Origin": "https://app.example"})
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "" || r.Header.Get("Vary") != "" {
		t.Fatalf("answer: %d %v", r.StatusCode, r.Header)
	}
}

func TestCORSListedOrigins(t *testing.T) {
	const app = "https://app.example"
	ta := startAPI(t, fake.Config{Tokens: []string{"hi"}}, func(c *APIConfig) {
		var err error
		if c.CORS, err = ParseCORSOrigins([]string{"http://localhost:5173", "HTTPS://App.Example"}); err != nil {
			t.Fatal(err)
		}
	})
	ta.secret, _ = ta.keys.AddLimited("limited", 100, 0)

	for _, tc := range []struct{ path, method, methods string }{
		{"/chat/completions", "POST", "POST"},
		{"/responses", "POST", "POST"},
		{"/embeddings", "POST", "POST"},
		{"/completions", "POST", "POST"},
		{"/models", "GET", "GET, HEAD"},
		{"/models/hearth-tiny", "GET", "GET, HEAD"},
	} {
		r := ta.preflight(t, tc.path, app, tc.method)
		h := r.Header
		if r.StatusCode != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != app ||
			h.Get("Access-Control-Allow-Methods") != tc.methods || h.Get("Access-Control-Max-Age") != "7200" ||
			!slices.Contains(headerList(h, "Vary"), "origin") {
			t.Errorf("%s preflight: %d %v", tc.path, r.StatusCode, h)
		}
		allowed := headerList(h, "Access-Control-Allow-Headers")
		for _, want := range []string{"authorization", "content-type", "x-stainless-lang", "x-stainless-retry-count"} {
			if !slices.Contains(allowed, want) {
				t.Errorf("%s preflight allows headers %v, not %s", tc.path, allowed, want)
			}
		}
	}

	// Another origin's preflight is refused, and its answers carry nothing
	// that lets its page read them.
	r := ta.preflight(t, "/chat/completions", "https://evil.example", "POST")
	if r.StatusCode != http.StatusForbidden || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("other origin's preflight: %d %v", r.StatusCode, r.Header)
	}
	r = ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Origin": "https://evil.example"})
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "" || !slices.Contains(headerList(r.Header, "Vary"), "origin") {
		t.Errorf("other origin's answer: %d %v", r.StatusCode, r.Header)
	}

	// The allowed origin reads the answer, and its request id and limits;
	// an error too (its page must see why).
	r = ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Origin": app})
	r.Body.Close()
	exposed := headerList(r.Header, "Access-Control-Expose-Headers")
	if r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != app || r.Header.Get("x-ratelimit-limit-requests") != "100" {
		t.Errorf("answer: %d %v", r.StatusCode, r.Header)
	}
	for _, h := range []string{"x-request-id", "retry-after", "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
		"x-ratelimit-reset-requests", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"} {
		if !slices.Contains(exposed, h) {
			t.Errorf("exposed headers %v lack %s", exposed, h)
		}
	}
	r = ta.post(t, `{}`, map[string]string{"Origin": app, "Authorization": "Bearer hearth_live_nope"})
	r.Body.Close()
	if r.StatusCode != 401 || r.Header.Get("Access-Control-Allow-Origin") != app {
		t.Errorf("401: %d %v", r.StatusCode, r.Header)
	}
	// An OPTIONS that is no preflight is still no method of the route.
	req, _ := http.NewRequest(http.MethodOptions, ta.url+"/chat/completions", nil)
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("OPTIONS without a preflight's headers: %d", resp.StatusCode)
	}
}

func TestCORSAnyOrigin(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"hi"}}, func(c *APIConfig) {
		c.CORS, _ = ParseCORSOrigins([]string{"*"})
	})
	r := ta.preflight(t, "/embeddings", "http://127.0.0.1:1234", "POST")
	if r.StatusCode != http.StatusNoContent || r.Header.Get("Access-Control-Allow-Origin") != "*" || r.Header.Get("Vary") != "" {
		t.Errorf("preflight: %d %v", r.StatusCode, r.Header)
	}
	r = ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"Origin": "null"})
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("answer: %d %v", r.StatusCode, r.Header)
	}
	// Without an Origin (not a browser's cross-origin request) nothing is
	// needed, and the wildcard changes nothing either.
	r = ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
	r.Body.Close()
	if r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("answer without an Origin: %d %v", r.StatusCode, r.Header)
	}
}

func TestParseCORSOrigins(t *testing.T) {
	for _, bad := range []string{"app.example", "https://app.example/", "https://app.example/x", "ftp://app.example",
		"https://", "https://u@app.example", "https://app.example?x", "null"} {
		if _, err := ParseCORSOrigins([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	p, err := ParseCORSOrigins([]string{"https://app.example:8443", "http://[::1]:3000"})
	if err != nil || !p.Enabled() || !p.allows([]byte("http://[::1]:3000")) || p.allows([]byte("https://app.example")) {
		t.Errorf("%+v %v", p, err)
	}
	if p, _ := ParseCORSOrigins(nil); p.Enabled() {
		t.Error("no origins: enabled")
	}
}
