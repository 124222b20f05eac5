// Package llm defines what hearthd needs from a local model runtime: make
// sure the deployment's model is present and warm, and stream a chat
// completion from it (and, where the runtime can, embed texts and continue
// a raw prompt: Embedder, Completer). The Ollama backend lives in
// llm/ollama; a fake for unit tests lives in llm/fake.
package llm

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
)

// Runtime is the one interface the daemon streams from.
type Runtime interface {
	// Chat starts a generation. It returns once the runtime has accepted the
	// request (or failed to), so the caller can still answer with an HTTP
	// error before it commits to a stream. Cancelling ctx, or calling
	// Stream.Close, stops the generation on the runtime.
	Chat(ctx context.Context, req *Request) (Stream, error)
	// Ready reports whether the runtime is reachable and the model loaded.
	Ready(ctx context.Context) error
}

// Embedder is implemented by runtimes that can embed text.
type Embedder interface {
	// Embed returns one vector per input, in order. A model that cannot
	// embed, or a request the runtime refuses, is an *InvalidRequestError
	// (Param "model" for the model).
	Embed(ctx context.Context, req *EmbedRequest) (*Embeddings, error)
}

// EmbedRequest is one batch of texts to embed.
type EmbedRequest struct {
	Input []string
	// Dimensions asks for vectors of that length (the model's own when
	// 0); a runtime that cannot give them refuses the request with an
	// *InvalidRequestError whose Param is "dimensions".
	Dimensions int
}

// Embeddings are the vectors of one EmbedRequest and the tokens the
// runtime read for them.
type Embeddings struct {
	Vectors      [][]float32
	PromptTokens int
}

// Completer is implemented by runtimes that continue a text as it is,
// without a chat template (OpenAI's legacy completions).
type Completer interface {
	// Complete starts a generation that continues req.Prompt; it behaves
	// as Runtime.Chat does (returns once the runtime accepted, cancelling
	// ctx or closing the stream stops it).
	Complete(ctx context.Context, req *CompletionRequest) (Stream, error)
}

// CompletionRequest is one text to continue.
type CompletionRequest struct {
	Prompt string
	// Suffix, if set, is the text after the insertion point: the model
	// fills in the middle, through its template (Ollama's "insert"
	// capability), instead of continuing Prompt raw.
	Suffix  string
	Options Options
}

// Limited is implemented by runtimes that know how much their model can
// take.
type Limited interface {
	Limits(ctx context.Context) (Limits, error)
}

// LogprobsAnswerer is implemented by runtimes that can tell whether they
// answer Options.Logprobs. Telling may cost a generation (the runtime is
// asked, not judged by its version), so it is asked only once a request
// wants logprobs: asked at start it would replace the prompt the runtime
// keeps cached with its own, and the first request would pay for that.
type LogprobsAnswerer interface {
	AnswersLogprobs(ctx context.Context) (bool, error)
}

// Limits are what a model can take, 0 where unknown or unset.
type Limits struct {
	// ContextLength is the tokens of one context: prompt and output
	// together.
	ContextLength int
	// NumPredict is the output cap the model's own configuration sets for
	// a request that names none.
	NumPredict int
	// Capabilities are what the runtime says the model can do, in its
	// words (Ollama: "completion", "tools", "insert", "vision",
	// "embedding", "thinking"); nil when it does not say.
	Capabilities []string
}

// Can reports whether the model has capability c, or is not known not to
// (a runtime that lists no capabilities is not second-guessed).
func (l Limits) Can(c string) bool {
	return l.Capabilities == nil || slices.Contains(l.Capabilities, c)
}

// Stream yields the events of one generation in order.
type Stream interface {
	// Recv returns the next event. The last event has Done set; after it,
	// Recv returns io.EOF. Any other error ends the stream.
	Recv() (Event, error)
	// Close stops the generation if it is still running and releases the
	// stream. It is safe to call more than once.
	Close() error
}

// Buffered is implemented by streams that can tell whether the next Recv
// will return at once, without waiting on the runtime. The API then writes
// such events back to back and flushes once: a client still gets every
// event as soon as it exists, but a burst costs one write, not one per token.
type Buffered interface {
	Buffered() bool
}

// Message is one chat message in runtime terms.
type Message struct {
	Role    string // system, user, assistant or tool
	Content string
	// Thinking is what a reasoning model thought before an assistant
	// message, given back to it (the Responses API's reasoning items).
	Thinking  string
	ToolCalls []ToolCall
	// ToolName names the tool whose result this message carries (role tool).
	ToolName string
}

// ToolCall is a function call the model asked for.
type ToolCall struct {
	ID        string
	Name      string
	Arguments json.RawMessage // a JSON object
}

// Tool is a function the model may call; Parameters is a JSON schema.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// Options are the sampling options. A nil field was not set by the client
// and must not be sent to the runtime, so the runtime's (or the model's)
// own defaults apply.
type Options struct {
	Temperature      *float64
	TopP             *float64
	MaxTokens        *int
	Stop             []string
	Seed             *int64
	PresencePenalty  *float64
	FrequencyPenalty *float64
	// Sampling options vLLM-compatible clients send beside OpenAI's.
	TopK              *int64
	MinP              *float64
	RepetitionPenalty *float64
	// Logprobs asks for each output token's log probability, with the
	// TopLogprobs most likely alternatives (0–20) at each position.
	Logprobs    bool
	TopLogprobs int
	// Think asks a reasoning model to think before it answers, apart from
	// the answer: "" leaves it to the runtime, "none" asks it not to,
	// "low", "medium" and "high" to think with that effort.
	Think string
}

// Reasoning efforts Options.Think takes besides "".
const (
	ThinkNone   = "none"
	ThinkLow    = "low"
	ThinkMedium = "medium"
	ThinkHigh   = "high"
)

// Request is one chat generation.
type Request struct {
	Messages []Message
	Options  Options
	// Format constrains the output: nil for free text, the JSON string
	// "json" for any JSON object, or a JSON schema object.
	Format json.RawMessage
	Tools  []Tool
	// ForceTool makes the model call a tool rather than leaving it the
	// choice: "" leaves it free, ToolAny requires a call to one of Tools,
	// anything else names the one tool it must call.
	ForceTool string
	// MaxToolCalls is the most tool calls a generation may return; later
	// ones are dropped (parallel_tool_calls false is 1). 0: no limit.
	MaxToolCalls int
}

// ToolAny is Request.ForceTool for "call one of the tools, any of them".
const ToolAny = "*"

// Finish reasons, as the OpenAI convention names them.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishToolCalls = "tool_calls"
)

// Event is one step of a generation: a piece of content, tool calls, or the
// final event with the finish reason and token counts.
type Event struct {
	Content string
	// Reasoning is a piece of the model's thinking, kept apart from the
	// answer (a reasoning model asked to think).
	Reasoning string
	ToolCalls []ToolCall
	// Logprobs are the tokens of Content with their log probabilities,
	// when the request asked for them.
	Logprobs []TokenLogprob
	Done     bool
	// Set on the final event only.
	FinishReason     string
	PromptTokens     int
	CompletionTokens int
}

// TokenLogprob is one output token, its log probability, its bytes (a
// token may be part of a character), and the most likely alternatives at
// its position.
type TokenLogprob struct {
	Token       string
	Logprob     float64
	Bytes       []byte
	TopLogprobs []TopLogprob
}

// TopLogprob is one alternative at a token's position.
type TopLogprob struct {
	Token   string
	Logprob float64
	Bytes   []byte
}

// ErrUnavailable marks errors where the runtime could not be reached or is
// not ready; the API answers them with 503.
var ErrUnavailable = errors.New("model runtime unavailable")

// Abandoned is implemented by an error from Chat when the caller gave up
// (its context ended, or the runtime's first answer took too long) while
// the runtime goes on working on the request: a runtime can rarely stop in
// the middle of reading a prompt. RuntimeDone is closed once it has
// stopped, so the caller can hold the request's slot until then and the
// runtime never works on more than the slots allow.
type Abandoned interface {
	RuntimeDone() <-chan struct{}
}

// ErrTimeout marks a runtime that did not start answering in time; the API
// answers it with 504.
var ErrTimeout = errors.New("model runtime timed out")

// InvalidRequestError is a request the runtime refused as invalid (for
// example a malformed JSON schema); the API answers it with 400 naming
// Param, the request parameter at fault ("" when none is).
type InvalidRequestError struct {
	Msg   string
	Param string
	// Schema: the runtime could not take the JSON schema it was to sample
	// with (Request.Format); the API names the parameter that carried it
	// when Param is "".
	Schema bool
}

func (e *InvalidRequestError) Error() string { return e.Msg }
