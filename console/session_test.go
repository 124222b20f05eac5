package console

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a settable time.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fakeAPI answers the lists the pages read, for the one token it knows.
func fakeAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Header.Get("Authorization") != "Bearer hct_good" {
		w.WriteHeader(http.StatusUnauthorized)
		_, _ = io.WriteString(w, `{"error":{"code":"unauthorized","message":"no"}}`)
		return
	}
	_, _ = io.WriteString(w, `{"data":[],"has_more":false,"next_cursor":null}`)
}

func newTestConsole(t *testing.T, clk *clock) *httptest.Server {
	t.Helper()
	c, err := New(Config{API: http.HandlerFunc(fakeAPI), Now: clk.now, IdleTimeout: 10 * time.Minute, MaxAge: time.Hour,
		Identify: func(tok string) (Identity, error) {
			if tok != "hct_good" {
				return Identity{}, ErrInvalidToken
			}
			return Identity{Project: "prj_1", ProjectName: "default"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(c.Handler())
	t.Cleanup(ts.Close)
	return ts
}

func noFollow() *http.Client {
	return &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func signIn(t *testing.T, ts *httptest.Server, next string, had *http.Cookie) (*http.Cookie, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", ts.URL+"/console/sign-in", strings.NewReader(url.Values{"token": {"hct_good"}, "next": {next}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", ts.URL)
	if had != nil {
		req.AddCookie(had)
	}
	resp, err := noFollow().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(resp.Cookies()) != 1 {
		t.Fatalf("sign-in: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	return resp.Cookies()[0], resp.Header.Get("Location")
}

func get(t *testing.T, ts *httptest.Server, path string, ck *http.Cookie) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", ts.URL+path, nil)
	if ck != nil {
		req.AddCookie(ck)
	}
	resp, err := noFollow().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// A session ends after its idle time and after its maximum age, however
// busy; an ended session sends the page to sign-in, which sends it back.
func TestSessionExpiry(t *testing.T) {
	clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ts := newTestConsole(t, clk)
	ck, _ := signIn(t, ts, "/console/servers", nil)
	if resp := get(t, ts, "/console/ssh-keys", ck); resp.StatusCode != http.StatusOK {
		t.Fatalf("fresh session: %d", resp.StatusCode)
	}
	clk.add(11 * time.Minute)
	resp := get(t, ts, "/console/ssh-keys?x=1", ck)
	want := "/console/sign-in?next=" + url.QueryEscape("/console/ssh-keys?x=1")
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != want {
		t.Fatalf("idle session: %d %q, want %q", resp.StatusCode, resp.Header.Get("Location"), want)
	}
	// Signing in again goes back to where the user was.
	ck, loc := signIn(t, ts, "/console/ssh-keys?x=1", nil)
	if loc != "/console/ssh-keys?x=1" {
		t.Fatalf("back to %q", loc)
	}
	// Signing in over a live session ends that one.
	old := ck
	ck, _ = signIn(t, ts, "/console/servers", old)
	if resp := get(t, ts, "/console/servers", old); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the replaced session: %d", resp.StatusCode)
	}
	// Used every 9 minutes, it still ends an hour after sign-in.
	for i := 0; i < 6; i++ {
		clk.add(9 * time.Minute)
		if resp := get(t, ts, "/console/servers", ck); resp.StatusCode != http.StatusOK {
			t.Fatalf("after %d×9 min: %d", i+1, resp.StatusCode)
		}
	}
	clk.add(9 * time.Minute)
	if resp := get(t, ts, "/console/servers", ck); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("past the maximum age: %d", resp.StatusCode)
	}
}

// The return address after sign-in stays inside the console.
func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"/console/servers/srv_1":  "/console/servers/srv_1",
		"//evil.example/console/": "/console/servers",
		"https://evil.example":    "/console/servers",
		"/v1/servers":             "/console/servers",
		"/console/\\evil":         "/console/servers",
		"":                        "/console/servers",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		origin, referer string
		tls             bool
		want            bool
	}{
		{"http://console.test", "", false, true},
		{"https://console.test", "", false, true}, // TLS ended by a proxy
		{"http://console.test", "", true, false},
		{"https://console.test", "", true, true},
		{"http://console.test:1", "", false, false},
		{"http://evil.test", "", false, false},
		{"null", "", false, false},
		{"", "http://console.test/console/servers", false, true},
		{"", "http://evil.test/console/servers", false, false},
		{"", "", false, false},
	} {
		r := httptest.NewRequest("POST", "http://console.test/console/servers", nil)
		if tc.origin != "" {
			r.Header.Set("Origin", tc.origin)
		}
		if tc.referer != "" {
			r.Header.Set("Referer", tc.referer)
		}
		if tc.tls {
			r.TLS = &tls.ConnectionState{}
		}
		if got := sameOrigin(r); got != tc.want {
			t.Errorf("origin %q referer %q tls %v: %v, want %v", tc.origin, tc.referer, tc.tls, got, tc.want)
		}
	}
}
