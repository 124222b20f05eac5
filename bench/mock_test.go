package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/internal/testutil"
)

// The native stream must be what encoding/json makes of api.ChatResponse,
// which is what Ollama writes.
func TestNDJSONMatchesOllamaEncoding(t *testing.T) {
	enc := ndjsonEncoder{model: jsonString("bench")}
	now := time.Date(2025, 7, 1, 12, 0, 0, 123456789, time.UTC)
	g := generation{n: 3, reason: "length", start: now.Add(-time.Second), evalStart: now.Add(-time.Second / 2),
		promptTokens: 9, cfg: MockConfig{TTFT: time.Millisecond}}
	got := enc.final(nil, &g, now)
	want, err := json.Marshal(api.ChatResponse{
		Model: "bench", CreatedAt: now, Message: api.Message{Role: "assistant"},
		DoneReason: "length", Done: true,
		Metrics: api.Metrics{TotalDuration: time.Second, LoadDuration: time.Millisecond,
			PromptEvalCount: 9, PromptEvalDuration: time.Millisecond, EvalCount: 3, EvalDuration: time.Second / 2},
	})
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want)+"\n" {
		t.Fatalf("final line\n got %s\nwant %s", got, want)
	}

	line := enc.token(nil, " fox")
	var r api.ChatResponse
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("token line %s: %v", line, err)
	}
	want, _ = json.Marshal(api.ChatResponse{Model: "bench", CreatedAt: r.CreatedAt,
		Message: api.Message{Role: "assistant", Content: " fox"}})
	if string(line) != string(want)+"\n" {
		t.Fatalf("token line\n got %s\nwant %s", line, want)
	}
}

func startTestMock(t *testing.T, cfg MockConfig) *MockServer {
	t.Helper()
	m, err := StartMock("127.0.0.1:0", "bench", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// The mock serves what hearthd's Ollama client needs at start-up and in a
// stream, through the real ollama/api client.
func TestMockWithOllamaClient(t *testing.T) {
	m := startTestMock(t, MockConfig{Tokens: 5, TTFT: time.Millisecond})
	ctx := context.Background()
	u, _ := url.Parse(m.URL)
	c := api.NewClient(u, http.DefaultClient)
	if err := c.Heartbeat(ctx); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	if v, err := c.Version(ctx); err != nil || v != mockVersion {
		t.Fatalf("version = %q, %v", v, err)
	}
	if _, err := c.Show(ctx, &api.ShowRequest{Model: "bench"}); err != nil {
		t.Fatalf("show: %v", err)
	}
	if _, err := c.Show(ctx, &api.ShowRequest{Model: "other"}); err == nil {
		t.Fatal("show of an unknown model succeeded")
	}
	ps, err := c.ListRunning(ctx)
	if err != nil || len(ps.Models) != 0 {
		t.Fatalf("ps before load = %+v, %v", ps, err)
	}
	var load []api.ChatResponse
	f := false
	err = c.Chat(ctx, &api.ChatRequest{Model: "bench", Stream: &f, KeepAlive: &api.Duration{Duration: -1}},
		func(r api.ChatResponse) error { load = append(load, r); return nil })
	if err != nil || len(load) != 1 || !load[0].Done || load[0].DoneReason != "load" {
		t.Fatalf("load = %+v, %v", load, err)
	}
	ps, err = c.ListRunning(ctx)
	if err != nil || len(ps.Models) != 1 || ps.Models[0].Model != "bench:latest" {
		t.Fatalf("ps after load = %+v, %v", ps, err)
	}

	var content strings.Builder
	var final api.ChatResponse
	n := 0
	err = c.Chat(ctx, &api.ChatRequest{Model: "bench", Messages: []api.Message{{Role: "user", Content: "hi"}},
		Options: map[string]any{"num_predict": 3}},
		func(r api.ChatResponse) error {
			n++
			content.WriteString(r.Message.Content)
			if r.Done {
				final = r
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if n != 4 || content.String() != " the quick brown" || final.DoneReason != "length" || final.EvalCount != 3 ||
		final.PromptEvalCount == 0 || final.EvalDuration <= 0 || final.TotalDuration <= 0 {
		t.Fatalf("stream: %d lines, content %q, final %+v", n, content.String(), final)
	}
	if got := m.Stats(); got.Requests != 1 || got.Tokens != 3 || got.Active != 0 {
		t.Fatalf("stats = %+v", got)
	}
}

// A generation counts as active until its client goes away.
func TestMockActiveEndsWithTheClient(t *testing.T) {
	m := startTestMock(t, MockConfig{Tokens: 1 << 30})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", m.URL+"/api/chat",
		strings.NewReader(`{"model":"bench","messages":[{"role":"user","content":"hi"}]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if got := m.Stats().Active; got != 1 {
		t.Fatalf("active while streaming = %d, want 1", got)
	}
	cancel()
	// The handler notices the closed connection on its own time.
	testutil.WaitFor(t, 10*time.Second, "the generation to end with its client", func() bool { return m.Stats().Active == 0 })
}

func TestMockOpenAIStream(t *testing.T) {
	m := startTestMock(t, MockConfig{Tokens: 4})
	body := `{"model":"bench","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`
	resp, err := http.Post(m.URL+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	sse := NewSSEReader(resp.Body)
	var chunks []Chunk
	for {
		d, err := sse.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		c, err := VerifyChunk(d)
		if err != nil {
			t.Fatal(err)
		}
		if c != ClassifyChunk(d) {
			t.Fatalf("ClassifyChunk(%s) = %+v, VerifyChunk = %+v", d, ClassifyChunk(d), c)
		}
		chunks = append(chunks, c)
	}
	// 4 tokens, the finish chunk, the usage chunk, [DONE].
	if len(chunks) != 7 || !chunks[4].Finished || !chunks[6].Done || chunks[0].ContentLen != len(" the") {
		t.Fatalf("chunks = %+v", chunks)
	}

	resp2, err := http.Post(m.URL+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"bench","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	var whole struct {
		Object  string `json:"object"`
		Choices []struct {
			Message      struct{ Content string } `json:"message"`
			FinishReason string                   `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(bufio.NewReader(resp2.Body)).Decode(&whole); err != nil {
		t.Fatal(err)
	}
	if whole.Object != "chat.completion" || whole.Choices[0].Message.Content != " the quick" ||
		whole.Choices[0].FinishReason != "length" || whole.Usage.CompletionTokens != 2 {
		t.Fatalf("non-stream = %+v", whole)
	}
}

func TestMockPace(t *testing.T) {
	m := startTestMock(t, MockConfig{Tokens: 5, TPS: 100, TTFT: 30 * time.Millisecond})
	res, err := RunLoad(context.Background(), LoadConfig{Target: m.URL + "/v1", Model: "bench", Requests: 2, Verify: true, ExpectTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if res.Errors != 0 || res.Completed != 2 || res.Tokens != 10 {
		t.Fatalf("result %+v", res)
	}
	// The mock schedules token i at start+TTFT+i/TPS and never sends early,
	// so only lower bounds are safe: a late read (a busy machine) can shorten
	// any single gap the client sees, but never the time to the first or
	// last token. Without pacing both would be far below these bounds.
	if len(res.TTFT) != 2 || len(res.Total) != 2 {
		t.Fatalf("samples ttft %v total %v", res.TTFT, res.Total)
	}
	for i := range 2 {
		if res.TTFT[i] < 30*time.Millisecond || res.Total[i] < 70*time.Millisecond {
			t.Fatalf("pace too fast: ttft %v total %v", res.TTFT, res.Total)
		}
	}
}

func TestMockConfigEndpoint(t *testing.T) {
	m := startTestMock(t, MockConfig{})
	req, _ := http.NewRequest(http.MethodPut, m.URL+"/mock/config", bytes.NewReader([]byte(`{"tokens":7,"tps":0,"ttft":0}`)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if c := m.cfg.Load(); c.Tokens != 7 || c.FlushEvery != 1 {
		t.Fatalf("config = %+v", c)
	}
}
