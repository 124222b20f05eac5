package deployapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

// usageSettled waits until key's usage counts want requests.
func (ta *testAPI) usageSettled(t *testing.T, keyID string, requests int64) apikeys.Usage {
	t.Helper()
	var u apikeys.Usage
	testutil.WaitFor(t, 10*time.Second, "the request settled", func() bool {
		u = ta.keys.Usage(keyID)
		return u.Requests >= requests
	})
	if u.Requests != requests {
		t.Fatalf("usage %+v, want %d requests", u, requests)
	}
	return u
}

// remainingTokens sends a request of 1 estimated token ("hi") with secret
// and returns x-ratelimit-remaining-tokens: what the key has left, less 1.
func (ta *testAPI) remainingTokens(t *testing.T, secret string) int {
	t.Helper()
	resp := ta.postAs(t, secret, hiBody)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	n, err := strconv.Atoi(resp.Header.Get("x-ratelimit-remaining-tokens"))
	if err != nil {
		t.Fatalf("%d: remaining tokens %q", resp.StatusCode, resp.Header.Get("x-ratelimit-remaining-tokens"))
	}
	return n
}

// A stream the client leaves is charged its prompt (estimated: the runtime
// reports it only at the end) and the tokens generated up to its end, to
// the key's usage and its tokens per minute, and counts as a request.
func TestCancelledStreamIsCharged(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1_000_000, TokenDelay: 2 * time.Millisecond}, nil)
	clk := testutil.NewClock()
	ta.keys.Now = clk.Now
	secret, key := ta.keys.AddLimited("tokens", 0, 100_000)
	prompt := strings.Repeat("a", 400) // 100 tokens estimated

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ta.url+"/chat/completions", strings.NewReader(chatBody(prompt, `,"stream":true`)))
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for seen := 0; seen < 11; { // the role chunk, then 10 tokens
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(line, "data: ") {
			seen++
		}
	}
	cancel()
	resp.Body.Close()

	u := ta.usageSettled(t, key.ID, 1)
	sent := ta.rt.LastStream().Sent()
	if u.PromptTokens != 100 || u.CompletionTokens < 10 || u.CompletionTokens > int64(sent) {
		t.Fatalf("usage %+v; the runtime sent %d tokens, the client read 10", u, sent)
	}
	ta.rt.SetConfig(fake.Config{})
	if got, want := ta.remainingTokens(t, secret), 100_000-100-int(u.CompletionTokens)-1; got != want {
		t.Fatalf("tokens left %d, want %d: the cancelled stream is not charged to the limit", got, want)
	}
}

// An answer that is not streamed, left by its client mid-generation, is
// charged the same way.
func TestCancelledAnswerIsCharged(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1_000_000, TokenDelay: 2 * time.Millisecond}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ta.url+"/chat/completions", strings.NewReader(chatBody(strings.Repeat("b", 40), "")))
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	go func() {
		testutil.WaitFor(t, 10*time.Second, "tokens generated", func() bool { s := ta.rt.LastStream(); return s != nil && s.Sent() >= 5 })
		cancel()
	}()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered %d though the client left", resp.StatusCode)
	}
	u := ta.usageSettled(t, ta.keyID, 1)
	if u.PromptTokens != 10 || u.CompletionTokens < 5 || u.CompletionTokens > int64(ta.rt.LastStream().Sent()) {
		t.Fatalf("usage %+v", u)
	}
}

// A generation that times out (504) is charged its prompt; one that fails
// mid-stream its prompt and what it generated; one the runtime refuses
// only the request. Each counts as a request.
func TestFailedGenerationsAreCharged(t *testing.T) {
	ta := startAPI(t, fake.Config{ChatErr: fmt.Errorf("slow: %w", llm.ErrTimeout)}, nil)
	resp := ta.post(t, chatBody(strings.Repeat("c", 80), ""), nil) // 20 tokens estimated
	resp.Body.Close()
	if resp.StatusCode != 504 {
		t.Fatalf("timeout: %d", resp.StatusCode)
	}
	if u := ta.usageSettled(t, ta.keyID, 1); u != (apikeys.Usage{Requests: 1, PromptTokens: 20}) {
		t.Fatalf("after a timeout: %+v", u)
	}

	ta.rt.SetConfig(fake.Config{Tokens: []string{"y"}, TokenCount: 10, StreamErr: io.ErrUnexpectedEOF, FailAfter: 3})
	resp = ta.post(t, chatBody(strings.Repeat("c", 80), `,"stream":true`), nil)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"error"`) {
		t.Fatalf("failed stream: %d %s", resp.StatusCode, body)
	}
	if u := ta.usageSettled(t, ta.keyID, 2); u != (apikeys.Usage{Requests: 2, PromptTokens: 40, CompletionTokens: 3}) {
		t.Fatalf("after a failed stream: %+v", u)
	}

	ta.rt.SetConfig(fake.Config{ChatErr: &llm.InvalidRequestError{Msg: "no"}})
	resp = ta.post(t, chatBody("hi", ""), nil)
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Fatalf("refused: %d", resp.StatusCode)
	}
	if u := ta.usageSettled(t, ta.keyID, 3); u != (apikeys.Usage{Requests: 3, PromptTokens: 40, CompletionTokens: 3}) {
		t.Fatalf("after a refusal: %+v", u)
	}
}

// A forced tool call holds back the JSON the model writes until it is
// complete; cancelled before that, it is still charged what the runtime
// generated.
func TestCancelledForcedCallIsCharged(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	ta := startAPI(t, fake.Config{Tokens: []string{`{"a":`, `1}`}, Hold: hold}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := chatBody("call it", `,"stream":true,"tool_choice":"required","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"integer"}}}}}]`)
	req, _ := http.NewRequestWithContext(ctx, "POST", ta.url+"/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the first token generated", func() bool { s := ta.rt.LastStream(); return s != nil && s.Sent() >= 1 })
	cancel()
	resp.Body.Close()
	if u := ta.usageSettled(t, ta.keyID, 1); u.CompletionTokens != 1 || u.PromptTokens == 0 {
		t.Fatalf("usage %+v, want the held-back token and the prompt", u)
	}
}

// Requests sent together each reserve their estimate (prompt + max_tokens)
// at admission, so a burst cannot all start on the same tokens: with 100
// tokens a minute and 41 reserved each, three start (the third on the last
// 18) and the rest get 429 until tokens are back.
func TestBurstStopsAtTheReservations(t *testing.T) {
	hold := make(chan struct{})
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, Hold: hold}, nil)
	clk := testutil.NewClock()
	ta.keys.Now = clk.Now
	secret, key := ta.keys.AddLimited("burst", 0, 100)

	codes := make(chan int, 10)
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := ta.postAs(t, secret, chatBody("hi", `,"max_tokens":40,"stream":true`))
			codes <- resp.StatusCode
			io.Copy(io.Discard, resp.Body) // a stream held until released
			resp.Body.Close()
		}()
	}
	// The admitted ones answer at once (streams); were more admitted than
	// slots free, some would wait for the held ones: release them then.
	got := map[int]int{}
	for range 10 {
		select {
		case c := <-codes:
			got[c]++
			continue
		case <-time.After(5 * time.Second):
		}
		break
	}
	close(hold)
	wg.Wait()
	for len(codes) > 0 {
		got[<-codes]++
	}
	if got[200] != 3 || got[429] != 7 {
		t.Fatalf("statuses %v, want 3 admitted and 7 refused", got)
	}
	ta.usageSettled(t, key.ID, 3)
}

// x-ratelimit-remaining-tokens is what is left after the request's
// reservation (n × (prompt + max_tokens)); when the request ends the
// reservation is settled against what it used.
func TestRemainingTokensAfterTheReservation(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	clk := testutil.NewClock()
	ta.keys.Now = clk.Now
	secret, key := ta.keys.AddLimited("tokens", 0, 1000)

	resp := ta.postAs(t, secret, chatBody("hi", `,"max_tokens":50`))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rateHeaders(resp, "tokens")[1] != "949" {
		t.Fatalf("%d: remaining %v, want 1000 - (1 + 50)", resp.StatusCode, rateHeaders(resp, "tokens"))
	}
	// It used 1 prompt and 2 completion tokens ("Hello", " world").
	if u := ta.usageSettled(t, key.ID, 1); u.PromptTokens != 1 || u.CompletionTokens != 2 {
		t.Fatalf("usage %+v", u)
	}
	resp = ta.postAs(t, secret, chatBody("hi", `,"max_tokens":10,"n":8`))
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rateHeaders(resp, "tokens")[1] != "909" {
		t.Fatalf("n=8: %d: remaining %v, want 997 - 8 × (1 + 10)", resp.StatusCode, rateHeaders(resp, "tokens"))
	}
}

// An embeddings batch reserves its estimated tokens, and one over the
// per-request cap is refused before the runtime sees it.
func TestEmbeddingsTokenEstimate(t *testing.T) {
	ta := startAPI(t, fake.Config{}, func(c *APIConfig) { c.MaxBodyBytes = 2 << 20 })
	clk := testutil.NewClock()
	ta.keys.Now = clk.Now
	secret, _ := ta.keys.AddLimited("tokens", 0, 1000)
	resp := ta.postToAs(t, "/embeddings", secret, `{"model":"hearth-tiny","input":["`+strings.Repeat("e", 200)+`","`+strings.Repeat("e", 200)+`"]}`)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || rateHeaders(resp, "tokens")[1] != "900" {
		t.Fatalf("%d: remaining %v, want 1000 - 100", resp.StatusCode, rateHeaders(resp, "tokens"))
	}

	calls := ta.rt.Calls()
	big := strings.Repeat("word ", 60_001) // 300 005 bytes: 75 002 tokens estimated
	resp = ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":["`+big+`","`+big+`","`+big+`","`+big+`"]}`)
	if e := errorOf(t, resp); resp.StatusCode != 400 || e["param"] != "input" || e["code"] != "max_tokens_per_request" {
		t.Fatalf("over the cap: %d %v", resp.StatusCode, e)
	}
	if ta.rt.Calls() != calls {
		t.Fatal("the runtime was called for a batch over the cap")
	}
}

// A long batch runs in runtime calls of bounded size, each holding the
// generation slot in turn: another key's request waiting for the slot runs
// between two calls, not after the whole batch.
func TestEmbeddingsBatchLetsOthersIn(t *testing.T) {
	step := make(chan struct{})
	ta := startAPI(t, fake.Config{EmbedStep: step}, func(c *APIConfig) { c.MaxConcurrent, c.MaxBodyBytes = 1, 1<<20 })
	other, _ := ta.keys.Add("other")

	// Three inputs of about 2 000 tokens each: a call each.
	inputs := make([]string, 3)
	words := 0
	for i := range inputs {
		inputs[i] = strings.TrimSpace(strings.Repeat("w ", 4000+i))
		words += 4000 + i
	}
	batch := `{"model":"hearth-tiny","input":["` + strings.Join(inputs, `","`) + `"]}`
	type answer struct {
		code int
		body map[string]any
	}
	batchDone := make(chan answer, 1)
	go func() {
		resp := ta.postBody(t, "/embeddings", batch)
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		batchDone <- answer{resp.StatusCode, m}
	}()
	testutil.WaitFor(t, 10*time.Second, "the batch's first call", func() bool { s, _ := ta.rt.Embeds(); return s == 1 })

	chatDone := make(chan int, 1)
	go func() {
		resp := ta.postAs(t, other, hiBody)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		chatDone <- resp.StatusCode
	}()
	testutil.WaitFor(t, 10*time.Second, "the chat queued behind the batch", func() bool { return ta.api.lim.queued() == 1 })
	step <- struct{}{} // the first call answers
	select {
	case code := <-chatDone:
		if code != 200 {
			t.Fatalf("chat: %d", code)
		}
	case a := <-batchDone:
		t.Fatalf("the batch ended (%d) before the chat waiting behind it ran", a.code)
	case <-time.After(30 * time.Second):
		t.Fatal("the chat did not run between the batch's calls")
	}
	step <- struct{}{}
	step <- struct{}{}
	a := <-batchDone
	if a.code != 200 {
		t.Fatalf("batch: %d %v", a.code, a.body)
	}
	data := a.body["data"].([]any)
	for i, d := range data {
		v := d.(map[string]any)["embedding"].([]any)
		if d.(map[string]any)["index"] != float64(i) || v[0] != float64(len(inputs[i])) {
			t.Fatalf("vector %d: %v", i, d)
		}
	}
	if len(data) != 3 || a.body["usage"].(map[string]any)["prompt_tokens"] != float64(words) {
		t.Fatalf("%d vectors, usage %v", len(data), a.body["usage"])
	}
	if s, _ := ta.rt.Embeds(); s != 3 {
		t.Fatalf("%d runtime calls, want 3", s)
	}
	if u := ta.usageSettled(t, ta.keyID, 1); u.PromptTokens != int64(words) {
		t.Fatalf("usage %+v", u)
	}
}

// A batch whose runtime call times out is a 504, charged what the runtime
// processed: the calls before, and the estimate of the one it was on.
func TestEmbeddingsTimeoutChargesProcessedTokens(t *testing.T) {
	ta := startAPI(t, fake.Config{EmbedFail: func(call int) error {
		if call == 1 {
			return fmt.Errorf("slow: %w", llm.ErrTimeout)
		}
		return nil
	}}, func(c *APIConfig) { c.MaxBodyBytes = 1 << 20 })
	in := strings.TrimSpace(strings.Repeat("w ", 4000)) // 7 999 bytes: 2 000 tokens estimated, 4 000 words
	resp := ta.postBody(t, "/embeddings", `{"model":"hearth-tiny","input":["`+in+`","`+in+`","`+in+`"]}`)
	resp.Body.Close()
	if resp.StatusCode != 504 {
		t.Fatalf("%d, want 504", resp.StatusCode)
	}
	if u := ta.usageSettled(t, ta.keyID, 1); u != (apikeys.Usage{Requests: 1, PromptTokens: 4000 + 2000}) {
		t.Fatalf("usage %+v", u)
	}
}
