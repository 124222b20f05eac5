package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
)

func TestSDKNonStreamAndStream(t *testing.T) {
	shared.ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		h := attachedTo(t, inst)
		c := h.client(h.secret)
		ctx := context.Background()

		resp, err := c.Chat.Completions.New(ctx, userParams(inst.Model, "Hello there", 16))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(resp.ID, "chatcmpl-") || len(resp.ID) < 9+24 {
			t.Errorf("id %q", resp.ID)
		}
		if resp.Model != inst.Model || len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("response %+v", resp)
		}
		if resp.Choices[0].FinishReason != "length" || resp.Usage.CompletionTokens != 16 ||
			resp.Usage.PromptTokens == 0 || resp.Usage.TotalTokens != resp.Usage.PromptTokens+16 {
			t.Fatalf("finish %q usage %+v", resp.Choices[0].FinishReason, resp.Usage)
		}

		p := userParams(inst.Model, "Hello there", 16)
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		stream := c.Chat.Completions.NewStreaming(ctx, p)
		var acc openai.ChatCompletionAccumulator
		chunks, contentChunks := 0, 0
		var created int64
		for stream.Next() {
			ch := stream.Current()
			if chunks == 0 {
				created = ch.Created
				if len(ch.Choices) != 1 || ch.Choices[0].Delta.Role != "assistant" {
					t.Fatalf("first chunk %+v", ch)
				}
			}
			if ch.Created != created || ch.ID != acc.ID && acc.ID != "" {
				t.Fatalf("chunk %d changes id/created", chunks)
			}
			if len(ch.Choices) == 1 && ch.Choices[0].Delta.Content != "" {
				contentChunks++
			}
			acc.AddChunk(ch)
			chunks++
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if contentChunks < 2 || acc.Choices[0].Message.Content == "" {
			t.Fatalf("stream gave %d content chunks, content %q", contentChunks, acc.Choices[0].Message.Content)
		}
		if acc.Usage.CompletionTokens != 16 || acc.Choices[0].FinishReason != "length" {
			t.Fatalf("stream usage %+v finish %q", acc.Usage, acc.Choices[0].FinishReason)
		}

		models, err := c.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(models.Data) != 1 || models.Data[0].ID != inst.Model {
			t.Fatalf("models %+v", models.Data)
		}
		m, err := c.Models.Get(ctx, inst.Model)
		if err != nil || m.ID != inst.Model {
			t.Fatalf("model %+v %v", m, err)
		}
	})
}

// At temperature 0 with a seed, the streamed content equals the non-stream
// content: both paths relay the same generation unchanged.
func TestSDKStreamEqualsNonStream(t *testing.T) {
	shared.ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		h := attachedTo(t, inst)
		c := h.client(h.secret)
		ctx := context.Background()
		p := userParams(inst.Model, "Tell me a story", 48)
		p.Temperature = openai.Float(0)
		p.Seed = openai.Int(42)

		resp, err := c.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		stream := c.Chat.Completions.NewStreaming(ctx, p)
		var sb strings.Builder
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				sb.WriteString(ch.Delta.Content)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if sb.String() != resp.Choices[0].Message.Content || sb.Len() == 0 {
			t.Fatalf("stream %q\n!= non-stream %q", sb.String(), resp.Choices[0].Message.Content)
		}
	})
}

func TestSDKErrors(t *testing.T) {
	shared.ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		h := attachedTo(t, inst)
		ctx := context.Background()
		var apiErr *openai.Error

		bad, foreign, good := h.client("hearth_live_"+strings.Repeat("x", 32)), h.client("sk-proj-"+strings.Repeat("x", 40)), h.client(h.secret)
		_, err := bad.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 || apiErr.Code != "invalid_api_key" {
			t.Fatalf("bad key: %v", err)
		}
		_, err = foreign.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
			t.Fatalf("foreign key: %v", err)
		}
		_, err = good.Chat.Completions.New(ctx, userParams("gpt-4o", "hi", 4))
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 404 || apiErr.Code != "model_not_found" {
			t.Fatalf("other model: %v", err)
		}
		p := userParams(inst.Model, "hi", 4)
		p.N = openai.Int(9) // above the cap of 8
		_, err = good.Chat.Completions.New(ctx, p)
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "n" {
			t.Fatalf("n=9: %v", err)
		}
		// Still serving.
		if _, err := good.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4)); err != nil {
			t.Fatal(err)
		}
	})
}

// Keys made while the daemon runs go through its admin socket; a revoked key
// fails on the very next request, without a restart.
func TestKeysCLIWhileRunning(t *testing.T) {
	h, inst := attached(t)
	key := h.createKey("second")
	c := h.client(key)
	ctx := context.Background()
	if _, err := c.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4)); err != nil {
		t.Fatal(err)
	}
	list := h.keysCLI("list")
	var id string
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, "second") {
			id = strings.Fields(line)[0]
		}
	}
	if !strings.HasPrefix(id, "key_") {
		t.Fatalf("key not listed:\n%s", list)
	}
	if strings.Contains(list, key) {
		t.Fatal("list shows a secret")
	}
	h.keysCLI("revoke", id)
	var apiErr *openai.Error
	if _, err := c.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4)); !errors.As(err, &apiErr) || apiErr.StatusCode != 401 {
		t.Fatalf("revoked key still works: %v", err)
	}
	first := h.client(h.secret)
	if _, err := first.Chat.Completions.New(ctx, userParams(inst.Model, "hi", 4)); err != nil {
		t.Fatalf("other key affected: %v", err)
	}
	if strings.Contains(h.logs(), key) || strings.Contains(h.logs(), h.secret) {
		t.Fatal("a secret appears in hearthd's log")
	}
}

// A client that disconnects mid-stream stops the generation on the real
// runtime: within 100 ms of the disconnect the model runner stops burning
// CPU.
func TestDisconnectStopsRuntime(t *testing.T) {
	shared.ollama.ForEach(t, testDisconnectStopsRuntime)
}

func testDisconnectStopsRuntime(t *testing.T, inst *ollamatest.Instance) {
	// A generation longer than the context: the cap is lifted.
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL, "--max-output-tokens", "100000"}})
	conn := dialRaw(t, h.root)
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":20000,"messages":[{"role":"user","content":"go on"}]}`, inst.Model)
	rawPost(conn, "/api/v1/chat/completions", h.secret, len(body), body)
	br := bufio.NewReader(conn)
	for n := 0; n < 5; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":"`) {
			n++
		}
	}
	// Keep reading so the runner is never held back by a full connection.
	go io.Copy(io.Discard, br) //nolint:errcheck // ends when the test closes conn
	ollamatest.ExpectRunnerStops(t, inst.PID(), func() { conn.Close() })
}

// Runtime gone → chat 503 with a clear message, /readyz false, /healthz true.
func TestRuntimeUnreachable(t *testing.T) {
	inst := ollamatest.Start(t) // a private one: this test kills it
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL}})
	c := h.client(h.secret)
	if _, err := c.Chat.Completions.New(context.Background(), userParams(inst.Model, "hi", 4)); err != nil {
		t.Fatal(err)
	}
	inst.Close()
	var apiErr *openai.Error
	_, err := c.Chat.Completions.New(context.Background(), userParams(inst.Model, "hi", 4))
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 503 || !strings.Contains(apiErr.Message, "runtime") {
		t.Fatalf("chat with the runtime down: %v", err)
	}
	for path, want := range map[string]int{"/readyz": 503, "/healthz": 200} {
		resp, err := http.Get(h.root + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s: %d want %d", path, resp.StatusCode, want)
		}
	}
}

// hearthd starts and supervises its own Ollama, creates the model from a
// local GGUF, and is ready only once the model is loaded: the first request
// pays no load.
func TestSupervisedRuntimeFromGGUF(t *testing.T) {
	ollamatest.ForEachVersion(t, func(t *testing.T, v ollamatest.Version) { testSupervisedRuntimeFromGGUF(t, v.Bin) })
}

func testSupervisedRuntimeFromGGUF(t *testing.T, bin string) {
	gguf, tmpl := tinyModelFiles(t)
	port := testutil.FreePort(t)
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", "e2e-tiny", "--model-gguf", gguf, "--model-template", tmpl,
		"--model-param", "num_predict=12", "--model-param", "num_thread=1", "--ollama-start", "--ollama-bin", bin,
		"--ollama-url", fmt.Sprintf("http://127.0.0.1:%d", port), "--ollama-models-dir", filepath.Join(t.TempDir(), "models")}})
	c := h.client(h.secret)
	resp, err := c.Chat.Completions.New(context.Background(), userParams("e2e-tiny", "hi", 8))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.CompletionTokens != 8 {
		t.Fatalf("usage %+v", resp.Usage)
	}
	// Without max_tokens the model's own parameters apply (num_predict).
	resp, err = c.Chat.Completions.New(context.Background(), openai.ChatCompletionNewParams{
		Model: "e2e-tiny", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hi")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Usage.CompletionTokens != 12 || resp.Choices[0].FinishReason != "length" {
		t.Fatalf("without max_tokens: usage %+v finish %q", resp.Usage, resp.Choices[0].FinishReason)
	}
	if !strings.Contains(h.logs(), "model loaded") {
		t.Fatal("no model load logged before ready")
	}
}
