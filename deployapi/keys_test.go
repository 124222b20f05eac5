package deployapi

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
)

// postAs sends a chat body with key's secret.
func (ta *testAPI) postAs(t *testing.T, secret, body string) *http.Response {
	t.Helper()
	return ta.post(t, body, map[string]string{"Authorization": "Bearer " + secret})
}

// rateHeaders returns the x-ratelimit headers of resp for what
// ("requests" or "tokens"): limit, remaining, reset.
func rateHeaders(resp *http.Response, what string) [3]string {
	h := resp.Header
	return [3]string{h.Get("x-ratelimit-limit-" + what), h.Get("x-ratelimit-remaining-" + what), h.Get("x-ratelimit-reset-" + what)}
}

const hiBody = `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`

func TestRequestsPerMinuteGive429WithOpenAIHeaders(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	clk := testutil.NewClock()
	ta.keys.Now = clk.Now
	secret, _ := ta.keys.AddLimited("limited", 2, 0)

	for i, want := range [][3]string{{"2", "1", "30s"}, {"2", "0", "1m0s"}} {
		resp := ta.postAs(t, secret, hiBody)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || rateHeaders(resp, "requests") != want || resp.Header.Get("x-ratelimit-limit-tokens") != "" {
			t.Fatalf("request %d: %d %v (tokens limit %q)", i, resp.StatusCode, rateHeaders(resp, "requests"), resp.Header.Get("x-ratelimit-limit-tokens"))
		}
	}
	resp := ta.postAs(t, secret, hiBody)
	e := errorOf(t, resp)
	if resp.StatusCode != 429 || e["code"] != "rate_limit_exceeded" || e["type"] != "requests" ||
		resp.Header.Get("Retry-After") != "30" || rateHeaders(resp, "requests") != [3]string{"2", "0", "1m0s"} ||
		!strings.Contains(e["message"].(string), "2 requests per minute") {
		t.Fatalf("over the limit: %d %v %v Retry-After %q", resp.StatusCode, e, rateHeaders(resp, "requests"), resp.Header.Get("Retry-After"))
	}
	// Another key is not affected; an unlimited key gets no headers.
	resp = ta.post(t, hiBody, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("x-ratelimit-limit-requests") != "" {
		t.Fatalf("unlimited key: %d %v", resp.StatusCode, rateHeaders(resp, "requests"))
	}
	// Half a minute later one request's worth is back.
	clk.Add(30 * time.Second)
	resp = ta.postAs(t, secret, hiBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rateHeaders(resp, "requests") != [3]string{"2", "0", "1m0s"} {
		t.Fatalf("after 30 s: %d %v", resp.StatusCode, rateHeaders(resp, "requests"))
	}
}

// A request reserves its estimated tokens at admission (the headers show
// what is left after it) and its real tokens are counted when it ends:
// the one that goes over finishes, the next one waits until tokens are
// back — streams included.
func TestTokensPerMinuteCountAfterTheRequest(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 10, PromptTokens: 5}, nil)
	clk := testutil.NewClock()
	ta.keys.Now = clk.Now
	secret, key := ta.keys.AddLimited("tokens", 0, 10)

	resp := ta.postAs(t, secret, `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	evs := readSSE(t, resp.Body)
	resp.Body.Close()
	// "hi" is reserved as 1 token (the fake runtime names no output limit).
	if resp.StatusCode != 200 || evs[len(evs)-1].data != "[DONE]" || rateHeaders(resp, "tokens") != [3]string{"10", "9", "6s"} {
		t.Fatalf("first stream: %d %v", resp.StatusCode, rateHeaders(resp, "tokens"))
	}
	if u := ta.keys.Usage(key.ID); u.PromptTokens != 5 || u.CompletionTokens != 10 {
		t.Fatalf("usage %+v", u)
	}
	// 15 used of 10 a minute: 5 below zero, 6 tokens (36 s) to wait.
	resp = ta.postAs(t, secret, hiBody)
	e := errorOf(t, resp)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "36" ||
		rateHeaders(resp, "tokens") != [3]string{"10", "0", "1m30s"} || !strings.Contains(e["message"].(string), "10 tokens per minute") {
		t.Fatalf("over the token limit: %d %v %v Retry-After %q", resp.StatusCode, e, rateHeaders(resp, "tokens"), resp.Header.Get("Retry-After"))
	}
	clk.Add(36 * time.Second)
	resp = ta.postAs(t, secret, hiBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rateHeaders(resp, "tokens")[1] != "0" { // 1 back, 1 reserved
		t.Fatalf("after 36 s: %d %v", resp.StatusCode, rateHeaders(resp, "tokens"))
	}
}

// openStream starts a streaming request with secret and returns once its
// answer started (the role chunk arrived): it holds a generation slot.
func (ta *testAPI) openStream(t *testing.T, ctx context.Context, secret string) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", ta.url+"/chat/completions",
		strings.NewReader(`{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"go"}]}`))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event %q %v", line, err)
	}
	return resp
}

// One key flooding the node takes neither all of the queue nor the next
// free slot: another key's request is queued in place of the flood's
// newest, and runs as soon as a slot frees, while the flood's earlier
// requests keep waiting.
func TestFloodingKeyCannotStarveAnother(t *testing.T) {
	// Generations that last until their client leaves.
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1, FirstTokenDelay: time.Hour},
		func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 2, 2 })
	flood, polite := ta.secret, func() string { s, _ := ta.keys.Add("polite"); return s }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	running := []context.CancelFunc{}
	for range 2 {
		rctx, rcancel := context.WithCancel(ctx)
		running = append(running, rcancel)
		defer ta.openStream(t, rctx, flood).Body.Close()
	}
	type answer struct {
		code int
		who  string
	}
	answers := make(chan answer, 8)
	send := func(who, secret string) {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", ta.url+"/chat/completions",
				strings.NewReader(`{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"go"}]}`))
			req.Header.Set("Authorization", "Bearer "+secret)
			resp, err := ta.client.Do(req)
			if err != nil {
				return // cancelled at the end
			}
			answers <- answer{resp.StatusCode, who}
			resp.Body.Close()
		}()
	}
	send("flood", flood)
	send("flood", flood)
	testutil.WaitFor(t, 10*time.Second, "the flood's queue full", func() bool { return ta.api.lim.queued() == 2 })
	send("flood", flood) // the waiting room is full: refused
	if a := <-answers; a != (answer{429, "flood"}) {
		t.Fatalf("the flood's 5th request: %+v", a)
	}

	// The polite key is queued, pushing out the flood's newest waiter.
	send("polite", polite)
	if a := <-answers; a != (answer{429, "flood"}) {
		t.Fatalf("polite key against a full queue: %+v", a)
	}
	// A flood stream ends: the polite request gets the slot, though the
	// flood's waiter came first.
	running[0]()
	if a := <-answers; a != (answer{200, "polite"}) {
		t.Fatalf("the freed slot went to %+v", a)
	}
	if q, n := ta.api.lim.queued(), ta.api.lim.active(); q != 1 || n != 2 {
		t.Fatalf("%d queued, %d running; want the flood's waiter still queued", q, n)
	}
}
