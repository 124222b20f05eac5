package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// The tiny model's words never close a free-text JSON string, so the
// forced tools here take integers, booleans and enums only: every answer
// must then be a complete call that validates against its schema.
var (
	weatherParams = map[string]any{
		"type": "object",
		"properties": map[string]any{
			"days":   map[string]any{"type": "integer"},
			"metric": map[string]any{"type": "boolean"},
			"unit":   map[string]any{"type": "string", "enum": []string{"c", "f"}},
		},
		"required":             []string{"days", "metric", "unit"},
		"additionalProperties": false,
	}
	alarmParams = map[string]any{
		"type": "object",
		"properties": map[string]any{
			"on":    map[string]any{"type": "boolean"},
			"level": map[string]any{"type": "string", "enum": []string{"low", "high"}},
		},
		"required":             []string{"on", "level"},
		"additionalProperties": false,
	}
	noteParams = map[string]any{
		"type":       "object",
		"properties": map[string]any{"text": map[string]any{"type": "string"}},
		"required":   []string{"text"},
	}
)

// forcedMaxTokens bounds a forced answer so that no valid call can be
// cut. The grammar Ollama derives from a schema ends the generation when
// the JSON closes (the tiny model never stops on its own), and bounds its
// length: each of the ~20 whitespace positions of these objects (after
// every brace, key, colon, value and comma) takes at most a newline and 20
// tabs or spaces, an integer at most 16 digits, and the tiny model writes
// about one character per token. Measured on both versions: 47–76 tokens
// for a weather call, the whitespace varying the most.
const forcedMaxTokens = 512

func tool(name string, params map[string]any) openai.ChatCompletionToolUnionParam {
	return openai.ChatCompletionFunctionTool(openai.FunctionDefinitionParam{
		Name: name, Description: openai.String("Test function " + name + "."), Parameters: params})
}

func compileSchema(t *testing.T, params map[string]any) *jsonschema.Schema {
	t.Helper()
	raw, _ := json.Marshal(params)
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(raw)))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("params.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("params.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// validCall fails unless args is a JSON object that s accepts.
func validCall(t *testing.T, what, args string, s *jsonschema.Schema) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	if err != nil {
		t.Errorf("%s: arguments %q are not JSON: %v", what, args, err)
		return
	}
	if err := s.Validate(v); err != nil {
		t.Errorf("%s: arguments %s do not match the schema: %v", what, args, err)
	}
}

// streamed is one choice of a streamed completion, put together.
type streamed struct {
	roles         int
	content, name string
	args          string
	id            string
	calls         int
	finish        []string
}

// collect reads a streamed completion into its choices by index.
func collect(t *testing.T, c openai.Client, p openai.ChatCompletionNewParams) map[int64]*streamed {
	t.Helper()
	out := map[int64]*streamed{}
	stream := c.Chat.Completions.NewStreaming(context.Background(), p)
	for stream.Next() {
		for _, ch := range stream.Current().Choices {
			s := out[ch.Index]
			if s == nil {
				s = &streamed{}
				out[ch.Index] = s
			}
			if len(s.finish) > 0 {
				t.Errorf("choice %d: a chunk after its finish: %+v", ch.Index, ch)
			}
			if ch.Delta.Role == "assistant" {
				s.roles++
			}
			s.content += ch.Delta.Content
			for _, tc := range ch.Delta.ToolCalls {
				if tc.ID != "" {
					s.calls++
					s.id = tc.ID
				}
				s.name += tc.Function.Name
				s.args += tc.Function.Arguments
			}
			if ch.FinishReason != "" {
				s.finish = append(s.finish, ch.FinishReason)
			}
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// Forced tool calls and n choices through the official SDK on a real
// Ollama of each supported version: tool_choice naming a function and
// "required" always come back as one valid call, a call cut by max_tokens
// never does, and n=2 gives two choices streamed and not.
func TestSDKForcedToolsAndChoices(t *testing.T) {
	shared.ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		// Five choices run at once: five generation slots.
		h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL, "--max-concurrent", "5"}})
		c := h.client(h.secret)
		ctx := context.Background()
		weather, alarm := compileSchema(t, weatherParams), compileSchema(t, alarmParams)
		tools := []openai.ChatCompletionToolUnionParam{tool("weather", weatherParams), tool("alarm", alarmParams)}

		// A named function, 5 choices: every one a valid call to it.
		p := userParams(inst.Model, "What is the weather tomorrow?", forcedMaxTokens)
		p.Tools = tools
		p.ToolChoice = openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "weather"})
		p.N = openai.Int(5)
		p.Seed = openai.Int(1)
		resp, err := c.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 5 {
			t.Fatalf("%d choices", len(resp.Choices))
		}
		ids := map[string]bool{}
		for i, ch := range resp.Choices {
			what := fmt.Sprintf("named, choice %d", i)
			if ch.Index != int64(i) || ch.FinishReason != "tool_calls" || len(ch.Message.ToolCalls) != 1 {
				t.Errorf("%s: index %d finish %q content %q calls %d", what, ch.Index, ch.FinishReason, ch.Message.Content, len(ch.Message.ToolCalls))
				continue
			}
			tc := ch.Message.ToolCalls[0]
			ids[tc.ID] = true
			if tc.Function.Name != "weather" || !strings.HasPrefix(tc.ID, "call_") {
				t.Errorf("%s: call %+v", what, tc)
			}
			validCall(t, what, tc.Function.Arguments, weather)
			t.Logf("%s: %s", what, tc.Function.Arguments)
		}
		if len(ids) != 5 {
			t.Errorf("%d distinct call ids among 5 calls", len(ids))
		}
		if resp.Usage.PromptTokens == 0 || resp.Usage.CompletionTokens < 5 {
			t.Errorf("usage %+v", resp.Usage)
		}
		t.Logf("named: %d completion tokens for 5 calls", resp.Usage.CompletionTokens)

		// "required", streamed, 5 choices: every one a valid call to one
		// of the tools, announced once, finished once.
		p = userParams(inst.Model, "Do something.", forcedMaxTokens)
		p.Tools = tools
		p.ToolChoice = openai.ChatCompletionToolChoiceOptionUnionParam{OfAuto: openai.String("required")}
		p.N = openai.Int(5)
		p.Seed = openai.Int(2)
		got := collect(t, c, p)
		if len(got) != 5 {
			t.Fatalf("streamed %d choices", len(got))
		}
		for i := range int64(5) {
			s := got[i]
			what := fmt.Sprintf("required, choice %d", i)
			if s == nil || s.roles != 1 || s.calls != 1 || len(s.finish) != 1 || s.finish[0] != "tool_calls" || s.content != "" {
				t.Errorf("%s: %+v", what, s)
				continue
			}
			switch s.name {
			case "weather":
				validCall(t, what, s.args, weather)
			case "alarm":
				validCall(t, what, s.args, alarm)
			default:
				t.Errorf("%s: called %q", what, s.name)
			}
			t.Logf("%s: %s %s", what, s.name, s.args)
		}

		// A free-text argument never closes with this model: max_tokens
		// cuts it, and the answer says length, never a finished call.
		for _, stream := range []bool{false, true} {
			p = userParams(inst.Model, "Take a note.", 12)
			p.Tools = []openai.ChatCompletionToolUnionParam{tool("note", noteParams)}
			p.ToolChoice = openai.ToolChoiceOptionFunctionToolChoice(openai.ChatCompletionNamedToolChoiceFunctionParam{Name: "note"})
			if stream {
				s := collect(t, c, p)[0]
				if s == nil || s.calls != 0 || len(s.finish) != 1 || s.finish[0] != "length" || !strings.HasPrefix(strings.TrimSpace(s.content), "{") {
					t.Errorf("cut call, streamed: %+v", s)
				}
				continue
			}
			resp, err := c.Chat.Completions.New(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			ch := resp.Choices[0]
			if ch.FinishReason != "length" || len(ch.Message.ToolCalls) != 0 || !strings.HasPrefix(strings.TrimSpace(ch.Message.Content), "{") {
				t.Errorf("cut call: finish %q calls %d content %q", ch.FinishReason, len(ch.Message.ToolCalls), ch.Message.Content)
			}
			if resp.Usage.CompletionTokens != 12 {
				t.Errorf("cut call: usage %+v", resp.Usage)
			}
		}

		// n=2 of plain text, not streamed and streamed.
		p = userParams(inst.Model, "Hello there", 8)
		p.N = openai.Int(2)
		resp, err = c.Chat.Completions.New(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 2 || resp.Usage.CompletionTokens != 16 {
			t.Fatalf("n=2: %d choices, usage %+v", len(resp.Choices), resp.Usage)
		}
		for i, ch := range resp.Choices {
			if ch.Index != int64(i) || ch.FinishReason != "length" || ch.Message.Content == "" {
				t.Errorf("n=2 choice %d: %+v", i, ch)
			}
		}
		p.StreamOptions = openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)}
		got = collect(t, c, p)
		if len(got) != 2 {
			t.Fatalf("n=2 streamed %d choices", len(got))
		}
		for i, s := range got {
			if s.roles != 1 || s.content == "" || len(s.finish) != 1 || s.finish[0] != "length" {
				t.Errorf("n=2 streamed choice %d: %+v", i, s)
			}
		}
	})
}
