package ollama

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/llm"
)

func TestLimitsFromShow(t *testing.T) {
	for name, c := range map[string]struct {
		resp api.ShowResponse
		want int
	}{
		"trained":      {api.ShowResponse{ModelInfo: map[string]any{"general.architecture": "llama", "llama.context_length": float64(8192)}}, 8192},
		"num_ctx wins": {api.ShowResponse{Parameters: "stop \"</s>\"\nnum_ctx 4096\n", ModelInfo: map[string]any{"general.architecture": "llama", "llama.context_length": float64(8192)}}, 4096},
		"unknown":      {api.ShowResponse{}, 0},
		"bad num_ctx":  {api.ShowResponse{Parameters: "num_ctx lots", ModelInfo: map[string]any{"general.architecture": "qwen2", "qwen2.context_length": float64(32768)}}, 32768},
	} {
		if got := limitsOf(&c.resp).ContextLength; got != c.want {
			t.Errorf("%s: %d, want %d", name, got, c.want)
		}
	}
	l := limitsOf(&api.ShowResponse{Parameters: "num_predict 40960\nnum_ctx 8192"})
	if !reflect.DeepEqual(l, llm.Limits{ContextLength: 8192, NumPredict: 40960}) {
		t.Errorf("limits %+v", l)
	}
	l = limitsOf(&api.ShowResponse{Capabilities: []model.Capability{"completion", "tools"}})
	if !slices.Equal(l.Capabilities, []string{"completion", "tools"}) || !l.Can("tools") || l.Can("vision") {
		t.Errorf("capabilities %+v", l)
	}
	if !(llm.Limits{}).Can("vision") {
		t.Error("a runtime that lists no capabilities was second-guessed")
	}
}

// Each Ollama version says what the tiny model can do: complete text, and
// (its template renders them) take tools; not see images.
func TestRealCapabilities(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		l, err := realBackend(t, inst).Limits(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if !l.Can("completion") || !l.Can("tools") || l.Can("vision") || l.Capabilities == nil {
			t.Fatalf("Ollama %s: capabilities %q", inst.Version, l.Capabilities)
		}
	})
}

// The tiny model is trained for 2048 tokens: each Ollama version reports it.
func TestRealContextLength(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		l, err := realBackend(t, inst).Limits(context.Background())
		if err != nil || l.ContextLength != 2048 {
			t.Fatalf("limits %+v, %v; want a context of 2048", l, err)
		}
	})
}

// Whether the runtime gives logprobs is found by asking it: 0.17.4 does,
// 0.9.6 does not; where it does, every token comes with its log
// probability and the alternatives asked for.
func TestRealLogprobs(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		b := realBackend(t, inst)
		lp, err := b.AnswersLogprobs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		want := inst.Version != "0.9.6"
		if lp != want {
			t.Fatalf("Ollama %s: logprobs %v, want %v", inst.Version, lp, want)
		}
		if !want {
			return
		}
		s, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("hi"), Options: llm.Options{MaxTokens: ptr(5), Logprobs: true, TopLogprobs: 2}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		var text, fromLogprobs strings.Builder
		for {
			ev, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if ev.Done {
				break
			}
			text.WriteString(ev.Content)
			for _, lp := range ev.Logprobs {
				fromLogprobs.WriteString(lp.Token)
				if lp.Logprob > 0 || len(lp.TopLogprobs) != 2 || string(lp.Bytes) != lp.Token {
					t.Fatalf("token logprob %+v", lp)
				}
			}
		}
		if text.String() == "" || text.String() != fromLogprobs.String() {
			t.Fatalf("text %q, tokens of the logprobs %q", text.String(), fromLogprobs.String())
		}
	})
}

// The think flag reaches the runtime: the tiny model cannot think, so
// each version refuses think true (as a bad request, naming thinking) and
// takes think false and no flag alike.
func TestRealThinkFlagPassesThrough(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		b := realBackend(t, inst)
		for _, effort := range []string{"", llm.ThinkNone, llm.ThinkHigh} {
			s, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("hi"), Options: llm.Options{MaxTokens: ptr(2), Think: effort}})
			if effort == llm.ThinkHigh {
				var bad *llm.InvalidRequestError
				if !errors.As(err, &bad) || !strings.Contains(bad.Msg, "think") {
					t.Fatalf("think %q: %v, want the runtime's refusal naming thinking", effort, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("think %q: %v", effort, err)
			}
			for {
				ev, err := s.Recv()
				if err != nil {
					t.Fatalf("think %q: %v", effort, err)
				}
				if ev.Reasoning != "" {
					t.Fatalf("think %q: reasoning %q from a model that cannot think", effort, ev.Reasoning)
				}
				if ev.Done {
					break
				}
			}
			s.Close()
		}
	})
}
