package e2e

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// Embeddings and legacy completions through hearthd with the official Go
// SDK, on each Ollama of the matrix. Both versions embed with the tiny
// llama model (normalised vectors of its 64 dimensions); only 0.17.4
// shortens them to `dimensions`, and 0.9.6 gets a 400 naming it. A legacy
// completion continues the raw prompt for exactly max_tokens tokens, as one
// answer and streamed; a suffix is a 400 (the model has no "insert").
func TestEmbeddingsAndCompletionsWithTheSDK(t *testing.T) {
	ollamatest.ForEachVersion(t, func(t *testing.T, v ollamatest.Version) {
		inst := shared.ollama.GetVersion(t, v)
		h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL}})
		c := h.client(h.secret)
		ctx := context.Background()

		emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: inst.Model,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"hello world", "bapi boru"}},
		})
		if err != nil {
			t.Fatalf("embeddings: %v", err)
		}
		if len(emb.Data) != 2 || emb.Data[1].Index != 1 || emb.Model != inst.Model || emb.Usage.PromptTokens <= 0 ||
			emb.Usage.TotalTokens != emb.Usage.PromptTokens {
			t.Fatalf("embeddings answer %+v", emb)
		}
		for _, d := range emb.Data {
			var norm float64
			for _, f := range d.Embedding {
				norm += f * f
			}
			if len(d.Embedding) != 64 || math.Abs(norm-1) > 0.01 {
				t.Fatalf("vector %d: %d dimensions, |v|² = %v", d.Index, len(d.Embedding), norm)
			}
		}

		short, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model:      inst.Model,
			Input:      openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello")},
			Dimensions: openai.Int(8),
		})
		var apiErr *openai.Error
		if v.Name == "0.9.6" {
			if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "dimensions" {
				t.Fatalf("dimensions on %s: %v, want a 400 naming dimensions", v.Name, err)
			}
		} else if err != nil || len(short.Data[0].Embedding) != 8 {
			t.Fatalf("dimensions on %s: %v", v.Name, err)
		}

		_, err = c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: inst.Model,
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfTokens: []int64{1, 2, 3}},
		})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "input" {
			t.Fatalf("token input: %v, want a 400 naming input", err)
		}

		params := openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(inst.Model),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(5),
		}
		cmpl, err := c.Completions.New(ctx, params)
		if err != nil {
			t.Fatalf("completion: %v", err)
		}
		if len(cmpl.Choices) != 1 || cmpl.Choices[0].Text == "" || cmpl.Choices[0].FinishReason != "length" ||
			cmpl.Usage.CompletionTokens != 5 || cmpl.Usage.PromptTokens <= 0 || !strings.HasPrefix(cmpl.ID, "cmpl-") ||
			cmpl.Object != "text_completion" {
			t.Fatalf("completion %+v", cmpl)
		}

		params.StreamOptions.IncludeUsage = openai.Bool(true)
		stream := c.Completions.NewStreaming(ctx, params)
		var text strings.Builder
		var finish string
		var usage int64
		pieces := 0
		for stream.Next() {
			ch := stream.Current()
			if len(ch.Choices) == 0 {
				usage = ch.Usage.CompletionTokens
				continue
			}
			if ch.Choices[0].Text != "" {
				pieces++
				text.WriteString(ch.Choices[0].Text)
			}
			if ch.Choices[0].FinishReason != "" {
				finish = string(ch.Choices[0].FinishReason)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream: %v", err)
		}
		if pieces != 5 || text.Len() == 0 || finish != "length" || usage != 5 {
			t.Fatalf("stream: %d pieces %q, finish %q, usage %d", pieces, text.String(), finish, usage)
		}

		params = openai.CompletionNewParams{
			Model:  openai.CompletionNewParamsModel(inst.Model),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("def f(")},
			Suffix: openai.String("return x"),
		}
		if _, err := c.Completions.New(ctx, params); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "suffix" {
			t.Fatalf("suffix: %v, want a 400 naming suffix", err)
		}
	})
}

// A deployment of an embedding model (the tiny model with mean pooling,
// which Ollama refuses to chat with) becomes ready, lists the "embedding"
// capability, embeds, and answers generation requests with a 400.
func TestEmbeddingModelDeployment(t *testing.T) {
	ollamatest.ForEachVersion(t, func(t *testing.T, v ollamatest.Version) {
		inst := shared.ollama.GetVersion(t, v)
		gguf := filepath.Join(t.TempDir(), "tiny-embed.gguf")
		if err := tinymodel.WriteFile(gguf, tinymodel.Options{Pooling: 1}); err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		const model = "hearth-tiny-embed"
		if err := ollamatest.CreateModel(ctx, inst.Client(), model, gguf); err != nil {
			t.Fatal(err)
		}
		h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", model, "--ollama-url", inst.URL}})
		c := h.client(h.secret)

		m, err := c.Models.Get(ctx, model)
		// (The test template renders tools, so Ollama lists "tools" too.)
		if err != nil || !strings.Contains(m.RawJSON(), `"embedding"`) || strings.Contains(m.RawJSON(), `"completion"`) {
			t.Fatalf("model: %v %s", err, m.RawJSON())
		}
		emb, err := c.Embeddings.New(ctx, openai.EmbeddingNewParams{
			Model: model,
			Input: openai.EmbeddingNewParamsInputUnion{OfString: openai.String("hello world")},
		})
		if err != nil || len(emb.Data) != 1 || len(emb.Data[0].Embedding) != 64 {
			t.Fatalf("embeddings: %v", err)
		}
		var apiErr *openai.Error
		_, err = c.Completions.New(ctx, openai.CompletionNewParams{
			Model:  openai.CompletionNewParamsModel(model),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once")},
		})
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "model" {
			t.Fatalf("completion on an embedding model: %v", err)
		}
		if _, err := c.Chat.Completions.New(ctx, userParams(model, "hi", 4)); !errors.As(err, &apiErr) || apiErr.StatusCode != 400 {
			t.Fatalf("chat on an embedding model: %v", err)
		}
	})
}
