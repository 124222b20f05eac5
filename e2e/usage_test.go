package e2e

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hearthd/hearth/internal/testutil"
)

// usageTotals is what the management API's usage says of one key, summed
// over its window.
type usageTotals struct {
	Requests, PromptTokens, CompletionTokens, Errors int64
	TTFTP50                                          *float64
}

func (c *controlPlane) keyUsage(t *testing.T, server, key string) usageTotals {
	t.Helper()
	var u struct {
		Data []struct {
			Results []struct {
				APIKeyID         string   `json:"api_key_id"`
				Requests         int64    `json:"requests"`
				PromptTokens     int64    `json:"prompt_tokens"`
				CompletionTokens int64    `json:"completion_tokens"`
				Errors           int64    `json:"errors"`
				TTFTP50          *float64 `json:"ttft_p50_ms"`
			}
		}
	}
	q := url.Values{"start": {time.Now().UTC().Add(-2 * time.Hour).Format(time.RFC3339)}, "granularity": {"hour"},
		"group_by": {"api_key"}}
	if code := c.api("GET", "/v1/servers/"+server+"/usage?"+q.Encode(), nil, &u); code != http.StatusOK {
		t.Fatalf("GET usage: %d", code)
	}
	var tot usageTotals
	for _, b := range u.Data {
		for _, r := range b.Results {
			if r.APIKeyID != key {
				continue
			}
			tot.Requests += r.Requests
			tot.PromptTokens += r.PromptTokens
			tot.CompletionTokens += r.CompletionTokens
			tot.Errors += r.Errors
			if r.TTFTP50 != nil {
				tot.TTFTP50 = r.TTFTP50
			}
		}
	}
	return tot
}

// TestUsageMatchesWhatClientsReceived drives known requests through a real
// node (hearthd, a real Ollama, the OpenAI Go SDK) with a key issued by
// the management API, half of them while the control plane is down, and
// compares the usage the management API reports with the usage the
// clients received: every request and token counted, none twice, the
// refused request an error, and a time to first token.
func TestUsageMatchesWhatClientsReceived(t *testing.T) {
	ctl := startControl(t, noRateLimit...)
	inst := shared.ollama.Get(t)
	node := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL,
		"--control-url", ctl.url, "--enrollment-token", ctl.enrollmentToken(1),
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40"}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })
	srv := ctl.mustCreate("/v1/servers", map[string]any{"name": "metered", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "deployment", "model": inst.Model, "billing": "monthly"})
	testutil.WaitFor(t, 60*time.Second, "server running", func() bool { return ctl.server(srv).Status == "running" })
	var key issuedKey
	if code := ctl.api("POST", "/v1/servers/"+srv+"/api-keys", map[string]any{"name": "metered"}, &key); code != http.StatusCreated {
		t.Fatalf("create key: %d", code)
	}
	until(t, node.url, key.Key, http.StatusOK, 10*time.Second)
	c := openai.NewClient(option.WithBaseURL(node.url), option.WithAPIKey(key.Key), option.WithMaxRetries(0))
	ctx := context.Background()

	var got usageTotals // what the clients received
	send := func(i int) {
		t.Helper()
		p := userParams(inst.Model, "Count to "+strings.Repeat("ten ", 1+i%3), int64(4+i%5))
		if i%2 == 0 {
			resp, err := c.Chat.Completions.New(ctx, p)
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			got.PromptTokens += resp.Usage.PromptTokens
			got.CompletionTokens += resp.Usage.CompletionTokens
		} else {
			p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
			stream := c.Chat.Completions.NewStreaming(ctx, p)
			var acc openai.ChatCompletionAccumulator
			for stream.Next() {
				acc.AddChunk(stream.Current())
			}
			if err := stream.Err(); err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
			got.PromptTokens += acc.Usage.PromptTokens
			got.CompletionTokens += acc.Usage.CompletionTokens
		}
		got.Requests++
	}
	const n = 12
	for i := range n / 2 {
		send(i)
	}
	// A request the deployment refuses: an error of the key, no request.
	_, err := c.Chat.Completions.New(ctx, userParams("not-"+inst.Model, "hi", 4))
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusNotFound {
		t.Fatalf("a request for another model: %v", err)
	}
	got.Errors++

	// The control plane away for the second half: the node keeps what it
	// counts and sends it once the control plane is back.
	ctl.stop()
	for i := n / 2; i < n; i++ {
		send(i)
	}
	ctl = ctl.restart()

	var rep usageTotals
	testutil.WaitFor(t, 3*time.Minute, "the usage reported", func() bool {
		rep = ctl.keyUsage(t, srv, key.ID)
		return rep.Requests >= got.Requests && rep.Errors >= got.Errors
	})
	// A little longer: anything counted twice would show now.
	time.Sleep(12 * time.Second)
	rep = ctl.keyUsage(t, srv, key.ID)
	if rep.Requests != got.Requests || rep.PromptTokens != got.PromptTokens || rep.CompletionTokens != got.CompletionTokens ||
		rep.Errors != got.Errors || rep.TTFTP50 == nil || *rep.TTFTP50 <= 0 {
		t.Fatalf("the management API reports %+v, the clients received %+v", rep, got)
	}
	// The key's cumulative counters agree.
	var k struct {
		Requests         int64 `json:"requests"`
		PromptTokens     int64 `json:"prompt_tokens"`
		CompletionTokens int64 `json:"completion_tokens"`
	}
	ctl.api("GET", "/v1/servers/"+srv+"/api-keys/"+key.ID, nil, &k)
	if k.Requests != got.Requests || k.PromptTokens != got.PromptTokens || k.CompletionTokens != got.CompletionTokens {
		t.Fatalf("the key's counters %+v, the clients received %+v", k, got)
	}
	t.Logf("%d requests, %d prompt and %d completion tokens, %d error; TTFT p50 %.1f ms", rep.Requests, rep.PromptTokens,
		rep.CompletionTokens, rep.Errors, *rep.TTFTP50)
}
