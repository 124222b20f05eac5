package deployapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// startGeneration starts one generation of req on s's runtime. Every
// generation of every route goes through it, so what the runtime cannot do
// on its own is done here the same way for all:
//
//   - A forced tool call (req.ForceTool) is generated as JSON constrained to
//     a schema (the runtime's grammar-constrained sampling) and relayed as
//     one tool call; see forceTool.
//   - parallel_tool_calls false and max_tool_calls (req.MaxToolCalls) let at
//     most that many tool calls through.
//
// req is not modified, so the n generations of one request may share it.
func (a *API) startGeneration(ctx context.Context, s *served, req *llm.Request) (llm.Stream, error) {
	if req.ForceTool != "" {
		fr, f, err := forceTool(req)
		if err != nil {
			return nil, err
		}
		st, err := s.rt.Chat(ctx, fr)
		if err != nil {
			return nil, err
		}
		return &forcedStream{Stream: st, f: f}, nil
	}
	st, err := s.rt.Chat(ctx, req)
	if err != nil || req.MaxToolCalls == 0 || len(req.Tools) == 0 {
		return st, err
	}
	return &fewToolCalls{Stream: st, left: req.MaxToolCalls}, nil
}

// forced is what a forced generation may call.
type forced struct {
	// named is the tool that must be called (tool_choice names it): the
	// output is its arguments. Empty for tool_choice "required": the output
	// is {"name": …, "arguments": …} for one of tools.
	named string
	tools []llm.Tool
}

// forceTool returns the runtime request for a forced call of req:
//
//   - Format is a JSON schema: the named tool's parameters, or for
//     "required" one alternative {"name": <the tool's name, an enum of
//     one>, "arguments": <its parameters>} per tool;
//   - the tools are not offered to the runtime as tools (its own tool-call
//     parsing would fight the schema);
//   - a system message tells the model which function to call and the
//     schema of its answer, so it writes sensible arguments rather than
//     merely valid ones.
//
// A tool whose parameters are not an object schema cannot be forced (400).
func forceTool(req *llm.Request) (*llm.Request, *forced, error) {
	f := &forced{tools: req.Tools}
	if req.ForceTool != llm.ToolAny {
		f.named = req.ForceTool
		f.tools = nil
		for _, t := range req.Tools {
			if t.Name == req.ForceTool {
				f.tools = []llm.Tool{t}
			}
		}
		if f.tools == nil {
			// openai refuses this; a caller that did not decode through it
			// gets the same answer.
			return nil, nil, &llm.InvalidRequestError{Msg: "tool_choice names function '" + req.ForceTool + "', which is not among tools"}
		}
	}
	var schema json.RawMessage
	var instr strings.Builder
	if f.named != "" {
		t := f.tools[0]
		schema = toolParams(t)
		fmt.Fprintf(&instr, "You must call the function %q now.", t.Name)
		if t.Description != "" {
			fmt.Fprintf(&instr, " It is described as: %s", t.Description)
		}
		fmt.Fprintf(&instr, "\nReply with only the JSON object of its arguments, which matches this JSON schema:\n%s", schema)
	} else {
		alts := make([]json.RawMessage, len(f.tools))
		instr.WriteString("You must call exactly one of these functions now:\n")
		for i, t := range f.tools {
			name, _ := json.Marshal(t.Name)
			alts[i] = json.RawMessage(`{"type":"object","properties":{"name":{"type":"string","enum":[` + string(name) +
				`]},"arguments":` + string(toolParams(t)) + `},"required":["name","arguments"],"additionalProperties":false}`)
			fmt.Fprintf(&instr, "- %s", t.Name)
			if t.Description != "" {
				fmt.Fprintf(&instr, ": %s", t.Description)
			}
			fmt.Fprintf(&instr, "\n  arguments JSON schema: %s\n", toolParams(t))
		}
		instr.WriteString(`Reply with only a JSON object {"name": <the function's name>, "arguments": <its arguments>}.`)
		if len(alts) == 1 {
			schema = alts[0]
		} else {
			b, _ := json.Marshal(map[string]any{"anyOf": alts})
			schema = b
		}
	}
	fr := *req
	fr.Format, fr.Tools, fr.ForceTool, fr.MaxToolCalls = schema, nil, "", 0
	fr.Messages = withInstruction(req.Messages, instr.String())
	return &fr, f, nil
}

// toolParams is t's parameters schema, an empty object schema when it has none.
func toolParams(t llm.Tool) json.RawMessage {
	if len(bytes.TrimSpace(t.Parameters)) == 0 {
		return json.RawMessage(`{"type":"object","properties":{}}`)
	}
	return t.Parameters
}

// withInstruction returns msgs with instr added to the leading system
// message, or as a new one before the rest; msgs is not modified.
func withInstruction(msgs []llm.Message, instr string) []llm.Message {
	if len(msgs) > 0 && msgs[0].Role == "system" {
		out := append([]llm.Message(nil), msgs...)
		out[0].Content += "\n\n" + instr
		return out
	}
	return append([]llm.Message{{Role: "system", Content: instr}}, msgs...)
}

// call turns the generated text into the tool call it stands for, or
// reports that it is none (not JSON of the expected shape).
func (f *forced) call(text []byte) (llm.ToolCall, bool) {
	text = bytes.TrimSpace(text)
	if f.named != "" {
		args, ok := compactObject(text)
		return llm.ToolCall{ID: openai.NewToolCallID(), Name: f.named, Arguments: args}, ok
	}
	var v struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if json.Unmarshal(text, &v) != nil {
		return llm.ToolCall{}, false
	}
	args, ok := compactObject(v.Arguments)
	if !ok {
		return llm.ToolCall{}, false
	}
	for _, t := range f.tools {
		if t.Name == v.Name {
			return llm.ToolCall{ID: openai.NewToolCallID(), Name: v.Name, Arguments: args}, true
		}
	}
	return llm.ToolCall{}, false
}

// compactObject returns b, a JSON object, without insignificant
// whitespace (constrained sampling lets a model pad JSON with it).
func compactObject(b []byte) (json.RawMessage, bool) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil, false
	}
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return nil, false
	}
	return out.Bytes(), true
}

// forcedStream relays a forced generation: the JSON the model writes is
// held back, and when the generation ends it comes out as ONE tool call
// (a fresh call_… id) with finish reason tool_calls. Thinking is relayed
// as it comes.
//
// A generation that did not end on its own never becomes a tool call: cut
// by max_tokens it ends with finish reason length, and the partial JSON it
// wrote is sent as the message content, so a client sees what was made
// and that it is incomplete. The same holds, with finish reason stop, for
// text that is not a call (a stop sequence cut it, or a runtime did not
// keep to the schema).
type forcedStream struct {
	llm.Stream
	f    *forced
	text []byte
	lp   []llm.TokenLogprob
	rest []llm.Event // events to return before io.EOF
	done bool
	// pieces counts the runtime's events with text, held back or not:
	// the tokens a cancelled generation is charged (generator).
	pieces atomic.Int64
}

func (s *forcedStream) generated() int { return int(s.pieces.Load()) }

func (s *forcedStream) Recv() (llm.Event, error) {
	if len(s.rest) > 0 {
		ev := s.rest[0]
		s.rest = s.rest[1:]
		return ev, nil
	}
	if s.done {
		return llm.Event{}, io.EOF
	}
	for {
		ev, err := s.Stream.Recv()
		if errors.Is(err, io.EOF) {
			ev, err = llm.Event{Done: true}, nil // ended without a final event
		}
		if err != nil {
			return ev, err
		}
		if ev.Content != "" || ev.Reasoning != "" {
			s.pieces.Add(1)
		}
		s.text = append(s.text, ev.Content...)
		s.lp = append(s.lp, ev.Logprobs...)
		if !ev.Done {
			if ev.Reasoning != "" {
				return llm.Event{Reasoning: ev.Reasoning}, nil
			}
			continue
		}
		s.done = true
		final := llm.Event{Done: true, FinishReason: ev.FinishReason,
			PromptTokens: ev.PromptTokens, CompletionTokens: ev.CompletionTokens}
		if ev.FinishReason != llm.FinishLength {
			if call, ok := s.f.call(s.text); ok {
				final.FinishReason = llm.FinishToolCalls
				s.rest = []llm.Event{final}
				return llm.Event{ToolCalls: []llm.ToolCall{call}}, nil
			}
			if final.FinishReason == llm.FinishToolCalls || final.FinishReason == "" {
				final.FinishReason = llm.FinishStop
			}
		}
		if len(s.text) == 0 && len(s.lp) == 0 {
			return final, nil
		}
		s.rest = []llm.Event{final}
		return llm.Event{Content: string(s.text), Logprobs: s.lp}, nil
	}
}

// fewToolCalls lets the first tool calls of a generation through, as many
// as it may return, and drops any later one (parallel_tool_calls false,
// max_tool_calls).
type fewToolCalls struct {
	llm.Stream
	left int
}

func (s *fewToolCalls) Recv() (llm.Event, error) {
	ev, err := s.Stream.Recv()
	if len(ev.ToolCalls) > s.left {
		ev.ToolCalls = ev.ToolCalls[:s.left]
	}
	s.left -= len(ev.ToolCalls)
	if len(ev.ToolCalls) == 0 {
		ev.ToolCalls = nil
	}
	return ev, err
}

// Buffered passes the runtime stream's through, so the relay still
// batches ready tokens.
func (s *fewToolCalls) Buffered() bool {
	b, ok := s.Stream.(llm.Buffered)
	return ok && b.Buffered()
}
