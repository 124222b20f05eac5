package deployapi

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// bytesPerToken is the fewest bytes of text a token stands for on average
// in the prompt estimate: real tokenizers average 3–5 bytes per token on
// prose and code, so bytes/8 undercounts, and a prompt refused on it is
// certainly too long. (The runtime offers no tokenizer to count exactly.)
const bytesPerToken = 8

// estBytesPerToken is the bytes of text a token stands for in the
// estimates that are charged or reserved rather than refused on: the
// tokens a request reserves of its key's tokens per minute while it runs,
// and the prompt of a generation the runtime gave no count for (cancelled,
// timed out, failed). Real tokenizers average 3–5 bytes per token on prose
// and code; this is the middle (OpenAI's rule of thumb).
const estBytesPerToken = 4

// estimateTokens is the tokens n bytes of text are estimated at: at
// least 1 for any text.
func estimateTokens(n int) int { return (n + estBytesPerToken - 1) / estBytesPerToken }

// bodyBytesPerToken sizes the default body limit from the context length:
// room for JSON escaping, tool schemas and message structure around text
// of bytesPerToken per token.
const bodyBytesPerToken = 4 * bytesPerToken

// minDerivedBodyBytes is the smallest default body limit, and the limit
// while the model's context length is not known yet.
const minDerivedBodyBytes = 1 << 20

// limits returns what the served model can take, asking the runtime once
// (and again after a failure).
func (s *served) limits(ctx context.Context) llm.Limits {
	s.limMu.Lock()
	defer s.limMu.Unlock()
	if s.limKnown {
		return s.lim
	}
	lr, ok := s.rt.(llm.Limited)
	if !ok {
		s.limKnown = true
		return s.lim
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := lr.Limits(ctx)
	if err != nil {
		return llm.Limits{}
	}
	s.lim, s.limKnown = l, true
	return l
}

// answersLogprobs tells whether the runtime answers logprobs, asking it the
// first time (and again after a failure, which is returned). It has its own
// lock so that requests without logprobs never wait for the question.
func (s *served) answersLogprobs(ctx context.Context) (bool, error) {
	s.lpMu.Lock()
	defer s.lpMu.Unlock()
	if s.lpKnown {
		return s.lp, nil
	}
	la, ok := s.rt.(llm.LogprobsAnswerer)
	if !ok {
		s.lpKnown = true
		return false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lp, err := la.AnswersLogprobs(ctx)
	if err != nil {
		return false, fmt.Errorf("ask whether the runtime answers logprobs: %w", err)
	}
	s.lp, s.lpKnown = lp, true
	return lp, nil
}

// ModelInfo is what the runtime says of the model served now: its context
// length and capabilities (0 and nil until known).
func (a *API) ModelInfo() (contextLength int, capabilities []string) {
	s := a.gate.cur.Load()
	if s == nil {
		return 0, nil
	}
	l := s.knownLimits()
	return l.ContextLength, l.Capabilities
}

// knownLimits returns the limits if they are known already, without asking.
func (s *served) knownLimits() llm.Limits {
	s.limMu.Lock()
	defer s.limMu.Unlock()
	return s.lim
}

// bodyLimit is the largest request body: --max-body-bytes if set, else
// bodyBytesPerToken per token of the served model's context, at least
// minDerivedBodyBytes.
func (a *API) bodyLimit() int {
	if a.cfg.MaxBodyBytes > 0 {
		return a.cfg.MaxBodyBytes
	}
	n := minDerivedBodyBytes
	if s := a.gate.cur.Load(); s != nil {
		n = max(n, bodyBytesPerToken*s.knownLimits().ContextLength)
	}
	return n
}

// checkThink settles whether a reasoning model thinks: a model whose
// runtime lists the thinking capability thinks unless the request says
// "none" or the deployment turned reasoning off (then it is asked not to);
// asking a model that cannot reason to think, or a deployment with
// reasoning off, is a 400 naming reasoning_effort; "none" to a model that
// cannot reason is dropped, so its runtime sees no flag it may refuse.
func (a *API) checkThink(l llm.Limits, o *llm.Options, params *limitParams) *openai.Error {
	thinks := l.Capabilities != nil && l.Can("thinking")
	switch {
	case o.Think == llm.ThinkNone:
		if !thinks {
			o.Think = ""
		}
	case o.Think != "" && a.cfg.NoReasoning:
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: params.reasoning,
			Message: "Reasoning is turned off on this deployment; omit " + params.reasoning + " or send \"none\"."}
	case o.Think != "" && !l.Can("thinking"):
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: params.reasoning,
			Message: "This deployment's model does not reason (its runtime lists no \"thinking\" capability); omit " + params.reasoning + "."}
	case thinks && a.cfg.NoReasoning:
		o.Think = llm.ThinkNone
	case thinks && o.Think == "":
		o.Think = llm.ThinkMedium // thinking apart from the answer, not inline
	}
	return nil
}

// maxBodyCeiling is fasthttp's own limit: no derived limit goes above it.
const maxBodyCeiling = 64 << 20

// promptBytes is the text of a request the model reads: messages, tool
// calls and tool definitions.
func promptBytes(r *llm.Request) int {
	n := len(r.Format)
	for _, m := range r.Messages {
		n += messageBytes(m)
	}
	for _, t := range r.Tools {
		n += len(t.Name) + len(t.Description) + len(t.Parameters)
	}
	return n
}

// generationDemand is what a request of slots generations of r takes:
// each reads r's prompt (estimated) and writes at most its max_tokens, or
// the model's own limit when it names none (checkLimits set it: run it
// first).
func generationDemand(s *served, r *llm.Request, slots int, schemaParam string) demand {
	return demand{slots: slots, prompt: estimateTokens(promptBytes(r)), output: maxOutput(s.knownLimits(), &r.Options),
		schemaParam: schemaParam}
}

// maxOutput is the most tokens a generation with o writes: max_tokens,
// else the model's num_predict; 0 when neither is known.
func maxOutput(l llm.Limits, o *llm.Options) int {
	switch {
	case o.MaxTokens != nil:
		return max(0, *o.MaxTokens)
	case l.NumPredict > 0:
		return l.NumPredict
	}
	return 0
}

// schemaParam names the parameter whose JSON schema a generation of r
// samples with: a forced tool call's (generate.go), else the output
// format's (formatParam), else none. A runtime's refusal of the schema
// names it.
func schemaParam(r *llm.Request, formatParam string) string {
	switch {
	case r.ForceTool != "":
		return "tool_choice"
	case len(r.Format) > 0 && r.Format[0] == '{':
		return formatParam
	}
	return ""
}

// checkForced refuses a forced tool call whose JSON schema the runtime
// cannot sample with (openai.CheckSchema): a forced tool's parameters (400
// naming them), or, for tool_choice "required", the schema of one
// alternative per tool that the generation samples with (generate.go; 400
// naming tool_choice: its $refs point into the tool's parameters no
// more, and together the tools may be too much).
func checkForced(r *llm.Request, params *limitParams) *openai.Error {
	if r.ForceTool == "" {
		return nil
	}
	for i, t := range r.Tools {
		if r.ForceTool == llm.ToolAny || t.Name == r.ForceTool {
			if e := openai.CheckSchema(toolParams(t), fmt.Sprintf(params.toolParameters, i)); e != nil {
				return e
			}
		}
	}
	fr, _, err := forceTool(r)
	if err != nil {
		return nil // refused when the generation starts
	}
	if e := openai.CheckSchema(fr.Format, "tool_choice"); e != nil {
		e.Message = "The forced tool call samples with one schema that holds each tool's parameters; " + e.Message
		return e
	}
	return nil
}

// limitParams name the request parameters checkLimits refuses, which
// differ between the routes.
type limitParams struct {
	maxTokens, messages, reasoning, logprobs string
	toolParameters                           string // a format of the tool's index
}

var (
	chatLimitParams = limitParams{maxTokens: "max_tokens", messages: "messages", reasoning: "reasoning_effort",
		logprobs: "logprobs", toolParameters: "tools[%d].function.parameters"}
	responsesLimitParams = limitParams{maxTokens: "max_output_tokens", messages: "input", reasoning: "reasoning.effort",
		logprobs: "include", toolParameters: "tools[%d].parameters"}
)

// checkLimits refuses a request the model cannot take, before the runtime
// sees it: logprobs from a runtime that cannot give them (400 naming
// logprobs), a prompt that is certainly longer than the context (400
// context_length_exceeded, as OpenAI answers), or max_tokens above the
// deployment's output cap (400 naming max_tokens). A request that names no
// max_tokens gets the model's own num_predict capped at the output cap, so
// no generation runs past it.
func (a *API) checkLimits(ctx context.Context, s *served, r *llm.Request, params *limitParams) *openai.Error {
	l := s.limits(ctx)
	if r.Options.Logprobs {
		// Found by asking the runtime (llm.LogprobsAnswerer), not from its
		// version; a runtime that could not be asked is not judged.
		lp, err := s.answersLogprobs(ctx)
		if err != nil {
			a.log.Warn("request failed at the runtime", "status", 503, "err", err)
			return openai.Unavailable("The model runtime is unreachable or not ready; please retry shortly.")
		}
		if !lp {
			return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: params.logprobs,
				Message: "logprobs are not supported by this deployment's model runtime; upgrade it or omit " + params.logprobs + "."}
		}
	}
	if e := a.checkThink(l, &r.Options, params); e != nil {
		return e
	}
	if e := checkForced(r, params); e != nil {
		return e
	}
	// A forced call is generated as constrained JSON, not through the
	// runtime's tool support (generate.go).
	if len(r.Tools) > 0 && r.ForceTool == "" && !l.Can("tools") {
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "unsupported_parameter", Param: "tools",
			Message: "This deployment's model does not support tools (its runtime lists no \"tools\" capability); omit tools."}
	}
	if l.ContextLength > 0 {
		if est := promptBytes(r) / bytesPerToken; est > l.ContextLength {
			return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "context_length_exceeded", Param: params.messages,
				Message: fmt.Sprintf("This model's maximum context length is %d tokens. However, your %s resulted in at least %d tokens (estimated). Please reduce the length of the %s.",
					l.ContextLength, params.messages, est, params.messages)}
		}
	}
	limit := a.cfg.MaxOutputTokens
	if limit <= 0 {
		limit = l.ContextLength
	}
	if limit <= 0 {
		return nil
	}
	o := &r.Options
	switch {
	case o.MaxTokens != nil && *o.MaxTokens > limit:
		return &openai.Error{Status: 400, Type: openai.TypeInvalidRequest, Code: "invalid_value", Param: params.maxTokens,
			Message: params.maxTokens + " is too large: " + strconv.Itoa(*o.MaxTokens) + ". This deployment supports at most " + strconv.Itoa(limit) + " completion tokens."}
	case o.MaxTokens == nil && (l.NumPredict <= 0 || l.NumPredict > limit):
		o.MaxTokens = &limit
	}
	return nil
}
