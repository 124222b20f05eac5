package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// logprobs through hearthd with the official SDK, on each Ollama of the
// matrix: where the runtime gives them, every completion token comes with
// its log probability and the alternatives asked for, streamed and not;
// where it cannot, a 400 names logprobs.
func TestLogprobsWithTheSDK(t *testing.T) {
	ollamatest.ForEachVersion(t, func(t *testing.T, v ollamatest.Version) {
		inst := shared.ollama.GetVersion(t, v)
		h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL}})
		c := h.client(h.secret)
		p := userParams(inst.Model, "hi", 6)
		p.Logprobs, p.TopLogprobs = openai.Bool(true), openai.Int(3)
		resp, err := c.Chat.Completions.New(context.Background(), p)
		if v.Name == "0.9.6" {
			var apiErr *openai.Error
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "logprobs" {
				t.Fatalf("Ollama %s: %v, want 400 naming logprobs", v.Name, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		lp := resp.Choices[0].Logprobs.Content
		var joined strings.Builder
		for _, tok := range lp {
			joined.WriteString(tok.Token)
			if len(tok.TopLogprobs) != 3 || tok.Logprob > 0 {
				t.Fatalf("token %+v", tok)
			}
		}
		if int64(len(lp)) != resp.Usage.CompletionTokens || joined.String() != resp.Choices[0].Message.Content {
			t.Fatalf("%d logprobs for %d tokens; %q vs content %q", len(lp), resp.Usage.CompletionTokens, joined.String(), resp.Choices[0].Message.Content)
		}

		stream := c.Chat.Completions.NewStreaming(context.Background(), p)
		var text, fromLogprobs strings.Builder
		for stream.Next() {
			ch := stream.Current()
			if len(ch.Choices) == 0 {
				continue
			}
			text.WriteString(ch.Choices[0].Delta.Content)
			for _, tok := range ch.Choices[0].Logprobs.Content {
				fromLogprobs.WriteString(tok.Token)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if text.Len() == 0 || text.String() != fromLogprobs.String() {
			t.Fatalf("streamed %q, tokens of its logprobs %q", text.String(), fromLogprobs.String())
		}
	})
}
