package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// The official Go SDK's Responses client, unmodified but for the base URL
// and key, against hearthd and a real Ollama: an answer and a stream, a
// tool round trip in the input, forced calls, and a refused store.
func TestSDKResponses(t *testing.T) {
	shared.ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		h := attachedTo(t, inst)
		c := h.client(h.secret)
		ctx := context.Background()
		params := responses.ResponseNewParams{
			Model:           inst.Model,
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Hello there")},
			Instructions:    openai.String("Be brief."),
			MaxOutputTokens: openai.Int(16),
			Metadata:        map[string]string{"run": "e2e"},
		}

		// The tiny model never stops by itself: 16 tokens, then incomplete.
		resp, err := c.Responses.New(ctx, params)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(resp.ID, "resp_") || resp.Object != "response" || resp.Model != inst.Model ||
			resp.Status != "incomplete" || resp.IncompleteDetails.Reason != "max_output_tokens" ||
			resp.Instructions.OfString != "Be brief." || resp.MaxOutputTokens != 16 || resp.Metadata["run"] != "e2e" {
			t.Fatalf("response %s", resp.RawJSON())
		}
		if resp.OutputText() == "" || len(resp.Output) != 1 || resp.Output[0].Type != "message" {
			t.Fatalf("output %s", resp.RawJSON())
		}
		if u := resp.Usage; u.OutputTokens != 16 || u.InputTokens == 0 || u.TotalTokens != u.InputTokens+16 {
			t.Fatalf("usage %+v", u)
		}

		stream := c.Responses.NewStreaming(ctx, params)
		var deltas strings.Builder
		var types []string
		var final responses.Response
		seq := int64(0)
		for stream.Next() {
			ev := stream.Current()
			if ev.SequenceNumber != seq {
				t.Fatalf("event %d has sequence_number %d", seq, ev.SequenceNumber)
			}
			seq++
			types = append(types, ev.Type)
			switch ev.Type {
			case "response.output_text.delta":
				deltas.WriteString(ev.Delta)
			case "response.incomplete":
				final = ev.AsResponseIncomplete().Response
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(types) < 4 || types[0] != "response.created" || types[1] != "response.in_progress" ||
			types[len(types)-1] != "response.incomplete" {
			t.Fatalf("events %v", types)
		}
		if final.OutputText() != deltas.String() || deltas.Len() == 0 || final.Usage.OutputTokens != 16 {
			t.Fatalf("deltas %q, final %s", deltas.String(), final.RawJSON())
		}

		// A tool round trip sent back as input items reaches the model.
		p := params
		p.Input = responses.ResponseNewParamsInputUnion{OfInputItemList: responses.ResponseInputParam{
			responses.ResponseInputItemParamOfMessage("What is the weather in Oslo?", responses.EasyInputMessageRoleUser),
			responses.ResponseInputItemParamOfFunctionCall(`{"city":"Oslo"}`, "call_1", "get_weather"),
			{OfFunctionCallOutput: &responses.ResponseInputItemFunctionCallOutputParam{
				CallID: openai.String("call_1"),
				Output: responses.ResponseInputItemFunctionCallOutputOutputUnionParam{OfString: openai.String("cold")},
			}},
		}}
		p.MaxOutputTokens = openai.Int(4)
		if resp, err = c.Responses.New(ctx, p); err != nil {
			t.Fatal(err)
		}
		if resp.Usage.OutputTokens != 4 || resp.OutputText() == "" {
			t.Fatalf("round trip %s", resp.RawJSON())
		}

		// A forced call through the Responses API is constrained as chat's
		// is: every answer is a function_call whose arguments the tool's
		// schema accepts, streamed and not.
		weather := compileSchema(t, weatherParams)
		fp := responses.ResponseNewParams{
			Model:           inst.Model,
			Input:           responses.ResponseNewParamsInputUnion{OfString: openai.String("Weather for the next days?")},
			MaxOutputTokens: openai.Int(forcedMaxTokens),
			Tools: []responses.ToolUnionParam{{OfFunction: &responses.FunctionToolParam{
				Name: "get_weather", Parameters: weatherParams, Strict: openai.Bool(true)}}},
			ToolChoice: responses.ResponseNewParamsToolChoiceUnion{
				OfFunctionTool: &responses.ToolChoiceFunctionParam{Name: "get_weather"}},
		}
		for i := range 3 {
			resp, err := c.Responses.New(ctx, fp)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != "completed" || len(resp.Output) != 1 || resp.Output[0].Type != "function_call" {
				t.Fatalf("forced call %d: %s", i, resp.RawJSON())
			}
			fc := resp.Output[0].AsFunctionCall()
			if fc.Name != "get_weather" || !strings.HasPrefix(fc.CallID, "call_") {
				t.Fatalf("forced call %d: %s", i, resp.RawJSON())
			}
			validCall(t, "responses forced call", fc.Arguments, weather)
		}
		fs := c.Responses.NewStreaming(ctx, fp)
		var args string
		for fs.Next() {
			if ev := fs.Current(); ev.Type == "response.function_call_arguments.done" {
				args = ev.Arguments
			}
		}
		if err := fs.Err(); err != nil {
			t.Fatal(err)
		}
		validCall(t, "streamed responses forced call", args, weather)

		// Nothing is stored: store true is refused, naming it.
		p = params
		p.Store = openai.Bool(true)
		_, err = c.Responses.New(ctx, p)
		var apiErr *openai.Error
		if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param != "store" {
			t.Fatalf("store true: %v", err)
		}
	})
}
