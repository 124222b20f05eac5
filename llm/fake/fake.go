// Package fake is a deterministic llm.Runtime for unit tests. It streams
// configured tokens with configured delays and failures, and records every
// request and what happened to its stream (finished, cancelled, closed), so
// tests can assert option mapping and that cancellation reached the runtime.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hearthd/hearth/llm"
)

// Config is how the fake behaves. The zero Config streams "Hello", " world"
// and finishes with stop.
type Config struct {
	// Tokens are the content pieces streamed in order (default
	// ["Hello", " world"]).
	Tokens []string
	// TokenCount, if positive, streams that many tokens by cycling
	// through Tokens; otherwise each token is streamed once.
	TokenCount int
	// FirstTokenDelay is waited before the first event, TokenDelay before
	// each later one. Both end early when the stream is cancelled.
	FirstTokenDelay time.Duration
	TokenDelay      time.Duration
	// ChatDelay is waited inside Chat before it answers (the runtime's
	// time to accept); ctx ends it early with ctx's error.
	ChatDelay time.Duration
	// Hold, if set, stops every stream after its first token until Hold
	// is closed (or the stream is cancelled): a generation that lasts
	// exactly as long as a test wants.
	Hold <-chan struct{}
	// HoldIf, if set, holds only the streams whose request it returns
	// true for (one choice of several, told apart by its seed).
	HoldIf func(*llm.Request) bool

	// Reasoning, if set, are pieces of thinking streamed before the tokens
	// when the request asks the model to think (Options.Think other than
	// "" and "none"); each counts as a completion token.
	Reasoning []string
	// ToolCalls, if set, are sent in one event after the tokens and the
	// stream finishes with tool_calls.
	ToolCalls []llm.ToolCall
	// FinishReason overrides the finish reason of a stream that ran to
	// its end (default stop, or tool_calls with ToolCalls).
	FinishReason string
	// PromptTokens is reported on the final event (default: the number of
	// whitespace-separated words in the messages).
	PromptTokens int
	// Limits is what Limits reports.
	Limits llm.Limits
	// Logprobs is what AnswersLogprobs reports; LogprobsErr, if set, is its
	// error instead.
	Logprobs    bool
	LogprobsErr error

	// ChatErr, if set, is returned by Chat (for example an error wrapping
	// runtime.ErrUnavailable or runtime.ErrTimeout, or a
	// *runtime.InvalidRequestError).
	ChatErr error
	// StreamErr, if set, is returned by Recv after FailAfter tokens, as a
	// mid-stream failure.
	StreamErr error
	FailAfter int
	// ChatPanic, if set, is what Chat and Embed panic with; StreamPanic is what
	// Recv panics with after FailAfter tokens: a bug on the relay's path,
	// for the API's recovery tests.
	ChatPanic   any
	StreamPanic any
	// BufferedPanic, if set, is what a stream's Buffered panics with (the
	// relay asks it before writing a stream's head).
	BufferedPanic any
	// ReadyErr is returned by Ready.
	ReadyErr error

	// EmbedDims is the length of the vectors Embed returns (default 4);
	// EmbedErr, if set, is returned by Embed. Embed waits for Hold too,
	// when it is set, or for its context to end.
	EmbedDims int
	EmbedErr  error
	// EmbedStep, if set, makes every Embed call wait to receive one value
	// from it (or for its context to end): a test lets a batch's calls
	// through one by one.
	EmbedStep <-chan struct{}
	// EmbedFail, if set, is asked before each Embed call answers, with
	// its number (0 for the first call); the error it returns, if any, is
	// the call's.
	EmbedFail func(call int) error
}

// Runtime is the fake. It is safe for concurrent use.
type Runtime struct {
	mu      sync.Mutex
	cfg     Config
	streams []*StreamInfo
	last    *llm.Request
	calls   int

	lastEmbed      *llm.EmbedRequest
	embedsStarted  int
	embedsStopped  int // ended by their context while held
	lastCompletion *llm.CompletionRequest
	completions    []llm.CompletionRequest // every request Complete received
	logprobsAsked  int
}

// New returns a fake runtime behaving as cfg says.
func New(cfg Config) *Runtime { return &Runtime{cfg: cfg} }

// SetConfig changes the behaviour for later calls.
func (r *Runtime) SetConfig(cfg Config) {
	r.mu.Lock()
	r.cfg = cfg
	r.mu.Unlock()
}

// LastRequest returns a deep copy of the last request Chat received, or nil.
func (r *Runtime) LastRequest() *llm.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		return nil
	}
	return cloneRequest(r.last)
}

// Calls returns how many times Chat, Complete or Embed was called.
func (r *Runtime) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// Streams returns the streams Chat opened, oldest first.
func (r *Runtime) Streams() []*StreamInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*StreamInfo(nil), r.streams...)
}

// LastStream returns the newest stream, or nil.
func (r *Runtime) LastStream() *StreamInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.streams) == 0 {
		return nil
	}
	return r.streams[len(r.streams)-1]
}

// Ready implements llm.Runtime.
func (r *Runtime) Ready(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.ReadyErr
}

// Limits implements llm.Limited.
func (r *Runtime) Limits(context.Context) (llm.Limits, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg.Limits, nil
}

// AnswersLogprobs implements llm.LogprobsAnswerer.
func (r *Runtime) AnswersLogprobs(context.Context) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.logprobsAsked++
	return r.cfg.Logprobs, r.cfg.LogprobsErr
}

// LogprobsAsked is how many times AnswersLogprobs was called.
func (r *Runtime) LogprobsAsked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logprobsAsked
}

// Chat implements llm.Runtime.
func (r *Runtime) Chat(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	r.mu.Lock()
	cfg := r.cfg
	r.calls++
	r.last = cloneRequest(req)
	r.mu.Unlock()

	if cfg.ChatPanic != nil {
		panic(cfg.ChatPanic)
	}
	if cfg.ChatDelay > 0 {
		t := time.NewTimer(cfg.ChatDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("fake runtime: %w", ctx.Err())
		}
	}
	if cfg.ChatErr != nil {
		return nil, cfg.ChatErr
	}
	if cfg.HoldIf != nil && !cfg.HoldIf(req) {
		cfg.Hold = nil
	}

	toks := cfg.Tokens
	if len(toks) == 0 {
		toks = []string{"Hello", " world"}
	}
	n := len(toks)
	if cfg.TokenCount > 0 {
		n = cfg.TokenCount
	}
	finish := llm.FinishStop
	if len(cfg.ToolCalls) > 0 {
		finish = llm.FinishToolCalls
	}
	if cfg.FinishReason != "" {
		finish = cfg.FinishReason
	}
	if m := req.Options.MaxTokens; m != nil && *m < n {
		n = *m
		finish = llm.FinishLength
	}
	prompt := cfg.PromptTokens
	if prompt == 0 {
		for _, m := range req.Messages {
			prompt += len(strings.Fields(m.Content))
		}
	}

	info := &StreamInfo{Started: time.Now(), done: make(chan struct{})}
	r.mu.Lock()
	r.streams = append(r.streams, info)
	r.mu.Unlock()

	// Like a real runtime, notice a cancelled request even when nobody
	// is reading the stream.
	go func() {
		select {
		case <-ctx.Done():
			info.markCancelled()
		case <-info.done:
		}
	}()

	return &stream{
		ctx:    ctx,
		cfg:    cfg,
		toks:   toks,
		n:      n,
		finish: finish,
		stop:   req.Options.Stop,

		logprobs: req.Options.Logprobs,
		think:    req.Options.Think != "" && req.Options.Think != llm.ThinkNone,
		prompt:   prompt,
		info:     info,
		closed:   make(chan struct{}),
	}, nil
}

// StreamInfo records what happened to one stream.
type StreamInfo struct {
	Started time.Time

	mu          sync.Mutex
	sent        int
	finished    bool
	cancelled   bool
	cancelledAt time.Time
	closed      bool
	done        chan struct{} // closed once the stream has ended
	endOnce     sync.Once
}

// Done is closed when the stream has ended: finished, failed, cancelled or
// closed.
func (s *StreamInfo) Done() <-chan struct{} { return s.done }

// Sent returns how many content tokens were streamed.
func (s *StreamInfo) Sent() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// Finished reports whether the final event was sent.
func (s *StreamInfo) Finished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finished
}

// Cancelled reports whether the stream was stopped (context cancelled or
// Close called) before its final event, and when.
func (s *StreamInfo) Cancelled() (bool, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancelled, s.cancelledAt
}

// Closed reports whether Close was called.
func (s *StreamInfo) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *StreamInfo) end() { s.endOnce.Do(func() { close(s.done) }) }

func (s *StreamInfo) markCancelled() {
	s.mu.Lock()
	if !s.finished && !s.cancelled {
		s.cancelled = true
		s.cancelledAt = time.Now()
	}
	s.mu.Unlock()
	s.end()
}

type stream struct {
	ctx    context.Context
	cfg    Config
	toks   []string
	n      int
	finish string
	stop   []string
	prompt int
	info   *StreamInfo
	// logprobs: the request asked for them; each token gets -1.
	logprobs bool
	// think: the request asked the model to think; r pieces sent so far.
	think bool
	r     int

	i         int  // tokens sent
	held      bool // waited for cfg.Hold
	toolsSent bool // tool call event sent
	ended     bool // final event or error returned
	err       error

	closeOnce sync.Once
	closed    chan struct{}
}

func (s *stream) wait(d time.Duration) error {
	if d <= 0 {
		select {
		case <-s.closed:
			return errClosed
		case <-s.ctx.Done():
			return s.ctx.Err()
		default:
			return nil
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-s.closed:
		return errClosed
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

// hold waits for cfg.Hold to close.
func (s *stream) hold() error {
	select {
	case <-s.cfg.Hold:
		return nil
	case <-s.closed:
		return errClosed
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

var errClosed = errors.New("fake runtime: stream closed")

func (s *stream) Recv() (llm.Event, error) {
	if s.ended {
		if s.err != nil {
			return llm.Event{}, s.err
		}
		return llm.Event{}, io.EOF
	}
	d := s.cfg.TokenDelay
	if s.i == 0 && !s.toolsSent {
		d = s.cfg.FirstTokenDelay
	}
	err := s.wait(d)
	if err == nil && s.i == 1 && s.cfg.Hold != nil && !s.held {
		s.held = true
		err = s.hold()
	}
	if err != nil {
		s.info.markCancelled()
		return s.fail(fmt.Errorf("fake runtime: generation stopped: %w", err))
	}
	if s.cfg.StreamPanic != nil && s.i >= s.cfg.FailAfter {
		panic(s.cfg.StreamPanic)
	}
	if s.cfg.StreamErr != nil && s.i >= s.cfg.FailAfter {
		s.info.end()
		return s.fail(fmt.Errorf("fake runtime: stream failed: %w", s.cfg.StreamErr))
	}
	if s.think && s.r < len(s.cfg.Reasoning) {
		s.r++
		return llm.Event{Reasoning: s.cfg.Reasoning[s.r-1]}, nil
	}
	if s.i < s.n {
		tok := s.toks[s.i%len(s.toks)]
		if !contains(s.stop, tok) {
			s.i++
			s.info.mu.Lock()
			s.info.sent = s.i
			s.info.mu.Unlock()
			ev := llm.Event{Content: tok}
			if s.logprobs {
				ev.Logprobs = []llm.TokenLogprob{{Token: tok, Logprob: -1, Bytes: []byte(tok)}}
			}
			return ev, nil
		}
		// A stop sequence ends the generation without being sent.
		s.n, s.finish, s.cfg.ToolCalls = s.i, llm.FinishStop, nil
	}
	if len(s.cfg.ToolCalls) > 0 && !s.toolsSent {
		s.toolsSent = true
		return llm.Event{ToolCalls: cloneCalls(s.cfg.ToolCalls)}, nil
	}
	s.ended = true
	s.info.mu.Lock()
	s.info.finished = true
	s.info.mu.Unlock()
	s.info.end()
	return llm.Event{
		Done:             true,
		FinishReason:     s.finish,
		PromptTokens:     s.prompt,
		CompletionTokens: s.i + s.r,
	}, nil
}

func (s *stream) fail(err error) (llm.Event, error) {
	s.ended, s.err = true, err
	return llm.Event{}, err
}

// Buffered implements llm.Buffered: the next Recv waits for its delay,
// so never (unless BufferedPanic is set).
func (s *stream) Buffered() bool {
	if s.cfg.BufferedPanic != nil {
		panic(s.cfg.BufferedPanic)
	}
	return false
}

func (s *stream) Close() error {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.info.mu.Lock()
		s.info.closed = true
		s.info.mu.Unlock()
		s.info.markCancelled()
	})
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func cloneCalls(calls []llm.ToolCall) []llm.ToolCall {
	if calls == nil {
		return nil
	}
	out := make([]llm.ToolCall, len(calls))
	for i, c := range calls {
		out[i] = c
		out[i].Arguments = append(json.RawMessage(nil), c.Arguments...)
	}
	return out
}

func cloneRequest(r *llm.Request) *llm.Request {
	if r == nil {
		return nil
	}
	c := *r
	c.Messages = make([]llm.Message, len(r.Messages))
	for i, m := range r.Messages {
		c.Messages[i] = m
		c.Messages[i].ToolCalls = cloneCalls(m.ToolCalls)
	}
	if r.Tools != nil {
		c.Tools = make([]llm.Tool, len(r.Tools))
		for i, t := range r.Tools {
			c.Tools[i] = t
			c.Tools[i].Parameters = append(json.RawMessage(nil), t.Parameters...)
		}
	}
	c.Format = append(json.RawMessage(nil), r.Format...)
	if r.Format == nil {
		c.Format = nil
	}
	o := r.Options
	c.Options = llm.Options{
		Temperature:       clonePtr(o.Temperature),
		TopP:              clonePtr(o.TopP),
		MaxTokens:         clonePtr(o.MaxTokens),
		Stop:              append([]string(nil), o.Stop...),
		Seed:              clonePtr(o.Seed),
		PresencePenalty:   clonePtr(o.PresencePenalty),
		FrequencyPenalty:  clonePtr(o.FrequencyPenalty),
		TopK:              clonePtr(o.TopK),
		MinP:              clonePtr(o.MinP),
		RepetitionPenalty: clonePtr(o.RepetitionPenalty),
		Logprobs:          o.Logprobs,
		TopLogprobs:       o.TopLogprobs,
		Think:             o.Think,
	}
	if o.Stop == nil {
		c.Options.Stop = nil
	}
	return &c
}

func clonePtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

var (
	_ llm.Runtime   = (*Runtime)(nil)
	_ llm.Embedder  = (*Runtime)(nil)
	_ llm.Completer = (*Runtime)(nil)
)

// Complete implements llm.Completer: it streams as Chat does for a request
// whose one user message is the prompt and the suffix (so PromptTokens
// counts their words), and records req for LastCompletion.
func (r *Runtime) Complete(ctx context.Context, req *llm.CompletionRequest) (llm.Stream, error) {
	r.mu.Lock()
	c := *req
	c.Options = cloneRequest(&llm.Request{Options: req.Options}).Options
	r.lastCompletion = &c
	r.completions = append(r.completions, c)
	r.mu.Unlock()
	return r.Chat(ctx, &llm.Request{Messages: []llm.Message{{Role: "user", Content: req.Prompt + " " + req.Suffix}}, Options: req.Options})
}

// Completions returns the requests Complete received, in order.
func (r *Runtime) Completions() []llm.CompletionRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.completions)
}

// LastCompletion returns a copy of the last request Complete received, or
// nil.
func (r *Runtime) LastCompletion() *llm.CompletionRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastCompletion == nil {
		return nil
	}
	c := *r.lastCompletion
	return &c
}

// Embed implements llm.Embedder. Vector i of input s is s's length, then
// i, then 0.5, 0.25, … up to the dimensions (cfg.EmbedDims, or
// req.Dimensions when that is fewer; more is refused as a runtime that
// cannot give them would). PromptTokens counts the inputs' words, at least
// one per input.
func (r *Runtime) Embed(ctx context.Context, req *llm.EmbedRequest) (*llm.Embeddings, error) {
	r.mu.Lock()
	cfg := r.cfg
	r.calls++
	r.lastEmbed = &llm.EmbedRequest{Input: append([]string(nil), req.Input...), Dimensions: req.Dimensions}
	call := r.embedsStarted
	r.embedsStarted++
	r.mu.Unlock()
	if cfg.ChatPanic != nil {
		panic(cfg.ChatPanic)
	}
	if cfg.EmbedStep != nil {
		select {
		case <-cfg.EmbedStep:
		case <-ctx.Done():
		}
	}
	if cfg.Hold != nil {
		select {
		case <-cfg.Hold:
		case <-ctx.Done():
			r.mu.Lock()
			r.embedsStopped++
			r.mu.Unlock()
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("fake runtime: %w", err)
	}
	if cfg.EmbedErr != nil {
		return nil, cfg.EmbedErr
	}
	if cfg.EmbedFail != nil {
		if err := cfg.EmbedFail(call); err != nil {
			return nil, err
		}
	}
	dims := cfg.EmbedDims
	if dims <= 0 {
		dims = 4
	}
	if d := req.Dimensions; d > dims {
		return nil, &llm.InvalidRequestError{Param: "dimensions", Msg: fmt.Sprintf("fake runtime: at most %d dimensions", dims)}
	} else if d > 0 {
		dims = d
	}
	out := &llm.Embeddings{Vectors: make([][]float32, len(req.Input))}
	for i, s := range req.Input {
		v := make([]float32, dims)
		for j := range v {
			switch j {
			case 0:
				v[j] = float32(len(s))
			case 1:
				v[j] = float32(i)
			default:
				v[j] = 1 / float32(int(1)<<(j-1))
			}
		}
		out.Vectors[i] = v
		out.PromptTokens += max(1, len(strings.Fields(s)))
	}
	return out, nil
}

// Embeds returns how many Embed calls started, and how many of them held
// (Config.Hold) were ended by their context.
func (r *Runtime) Embeds() (started, stopped int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.embedsStarted, r.embedsStopped
}

// LastEmbed returns a copy of the last request Embed received, or nil.
func (r *Runtime) LastEmbed() *llm.EmbedRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastEmbed == nil {
		return nil
	}
	return &llm.EmbedRequest{Input: append([]string(nil), r.lastEmbed.Input...), Dimensions: r.lastEmbed.Dimensions}
}
