package ollama

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/hearthd/hearth/llm"
)

// stream reads Ollama's NDJSON answer in the caller's goroutine, no
// goroutine or channel in between. Lines are read in place from the
// stream's buffer; the common token line is decoded by fastTokenLine,
// which allocates only the token's text, and every other line by
// encoding/json.
type stream struct {
	b      *Backend
	ctx    context.Context // the request's; its cause says why it ended
	cancel context.CancelCauseFunc
	lines  *lines   // the answer's body
	line   chatLine // the last line read, reused for every line

	// Events decoded from one line, waiting to be returned. A line yields
	// at most two: its content or tool calls, and the final event.
	pending [2]llm.Event
	head, n int

	stopAfter func() bool // unregisters the caller's cancellation hook

	watch *watch // told when the request closes
	track *genTrack

	toolCalls bool // tool calls seen; the finish reason is tool_calls
	done      bool // final event decoded
	err       error

	closeOnce sync.Once
}

// generate posts body to url (/api/chat or /api/generate, whose NDJSON
// answers the stream reads alike) and returns the stream once its first
// line has arrived: Chat's contract. The request is sent from a goroutine
// of its own so that the caller can give up on it (ctx's end, the
// first-byte deadline) while the runtime still reads the prompt.
func (b *Backend) generate(ctx context.Context, url string, body []byte) (llm.Stream, error) {
	// The request lives until the stream ends, past ctx while the prompt
	// is read; cancelling it closes its connection, and Ollama stops.
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("ollama: build request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/x-ndjson")
	// A generation the runtime never answered changed nothing, so net/http
	// may send it again on a fresh connection when a kept one turns out
	// closed by the runtime (a restart, an idle close). A key without a
	// value marks it so and is not sent.
	req.Header["Idempotency-Key"] = nil

	g := b.watch.sent(time.Now(), b)
	s := &stream{ctx: rctx, cancel: cancel, b: b, watch: b.watch, track: g}
	first := make(chan error, 1)
	go func() {
		resp, err := b.hc.Do(req)
		first <- b.first(s, resp, err)
	}()
	select {
	case err := <-first:
		if err != nil {
			s.Close()
			return nil, err
		}
	case <-ctx.Done():
		return nil, b.abandon(s, first, fmt.Errorf("ollama: generate: %w", ctx.Err()))
	case <-g.late: // nil, and never ready, without a first-byte bound
		return nil, b.abandon(s, first, b.timedOut())
	}
	if err := s.decode(&s.line); err != nil {
		s.Close()
		return nil, fmt.Errorf("%w: %w", llm.ErrUnavailable, err)
	}
	// From the first token on, the caller's end is the generation's end.
	s.stopAfter = context.AfterFunc(ctx, func() { cancel(context.Cause(ctx)) })
	return s, nil
}

// first reads the first line of the answer to s's request into s, resp
// and err being what sending it returned: nil once the line is s.line.
func (b *Backend) first(s *stream, resp *http.Response, err error) error {
	if err != nil {
		return b.unreachable(err)
	}
	s.lines = newLines(b.watch.body(resp.Body))
	if resp.StatusCode != http.StatusOK {
		b.watch.answered(s.track)
		return b.statusError(resp)
	}
	// A runtime that fails before producing anything is reported as
	// unavailable, not as a broken stream.
	if err := s.next(); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return fmt.Errorf("%w: model runtime at %s sent a malformed answer: %w", llm.ErrUnavailable, b.base, err)
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return b.unreachable(err)
	}
	b.watch.answered(s.track)
	return nil
}

// lines reads an answer's body as lines through a buffer of its own.
type lines struct {
	io.ReadCloser
	br   *bufio.Reader
	long []byte // assembles a line longer than br's buffer
}

func newLines(body io.ReadCloser) *lines {
	return &lines{ReadCloser: body, br: bufio.NewReaderSize(body, lineBufSize)}
}

// lineBufSize is the read buffer of an answer. A token line is ~130 bytes,
// so a burst of a dozen tokens fits and is relayed with one write (see
// Buffered); a longer line (tool calls) is assembled in lines.long.
const lineBufSize = 2 << 10

func (l *lines) Read(p []byte) (int, error) { return l.br.Read(p) }

// readLine returns the next line, '\n' included, valid until the next
// read. At the end it returns io.EOF, with the last line if that had no
// '\n'.
func (l *lines) readLine() ([]byte, error) {
	line, err := l.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		l.long = append(l.long[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = l.br.ReadSlice('\n')
			l.long = append(l.long, line...)
		}
		line = l.long
		if cap(l.long) > 64<<10 {
			l.long = nil // a rare huge line: do not keep its buffer
		}
	}
	return line, err
}

// bufferedLine reports whether a whole line is buffered: readLine returns
// it without waiting on the runtime.
func (l *lines) bufferedLine() bool {
	buf, _ := l.br.Peek(l.br.Buffered()) // never reads: n <= Buffered
	return bytes.IndexByte(buf, '\n') >= 0
}

// chatLine is the part of api.ChatResponse (and api.GenerateResponse) the
// stream needs. Decoding into
// it skips the timestamps and the lower-casing api.Message does per token,
// and keeps tool call arguments as the model wrote them.
type chatLine struct {
	Message struct {
		Content string `json:"content"`
		// Thinking is a reasoning model's thinking, apart from content,
		// when the request asked it to think.
		Thinking  string `json:"thinking"`
		ToolCalls []struct {
			Function struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	} `json:"message"`
	// Response is the text of an /api/generate line, where /api/chat
	// sends message.content.
	Response        string        `json:"response"`
	Logprobs        []lineLogprob `json:"logprobs"`
	Done            bool          `json:"done"`
	DoneReason      string        `json:"done_reason"`
	PromptEvalCount int           `json:"prompt_eval_count"`
	EvalCount       int           `json:"eval_count"`
	Error           string        `json:"error"`
}

// lineLogprob is one token's log probability as Ollama sends it: bytes
// as an array of numbers.
type lineLogprob struct {
	Token       string  `json:"token"`
	Logprob     float64 `json:"logprob"`
	Bytes       []int   `json:"bytes"`
	TopLogprobs []struct {
		Token   string  `json:"token"`
		Logprob float64 `json:"logprob"`
		Bytes   []int   `json:"bytes"`
	} `json:"top_logprobs"`
}

func byteSlice(b []int) []byte {
	if b == nil {
		return nil
	}
	out := make([]byte, len(b))
	for i, v := range b {
		out[i] = byte(v)
	}
	return out
}

func logprobsOf(l []lineLogprob) []llm.TokenLogprob {
	if len(l) == 0 {
		return nil
	}
	out := make([]llm.TokenLogprob, len(l))
	for i, t := range l {
		out[i] = llm.TokenLogprob{Token: t.Token, Logprob: t.Logprob, Bytes: byteSlice(t.Bytes)}
		for _, a := range t.TopLogprobs {
			out[i].TopLogprobs = append(out[i].TopLogprobs, llm.TopLogprob{Token: a.Token, Logprob: a.Logprob, Bytes: byteSlice(a.Bytes)})
		}
	}
	return out
}

// streamError is an error Ollama reported inside the stream.
type streamError struct{ msg string }

func (e *streamError) Error() string { return "model runtime error: " + e.msg }

// next reads the next non-blank line into s.line.
func (s *stream) next() error {
	for {
		line, err := s.readLine()
		if err != nil {
			return err
		}
		if err := s.parse(line); err != errBlank {
			return err
		}
	}
}

// errBlank marks a line holding only whitespace, which NDJSON allows.
var errBlank = errors.New("blank line")

// parse decodes one line into s.line.
func (s *stream) parse(line []byte) error {
	s.line = chatLine{}
	if content, ok := fastTokenLine(line); ok {
		s.line.Message.Content = content
		return nil
	}
	if fastFinalLine(line, &s.line) {
		return nil
	}
	if isBlank(line) {
		return errBlank
	}
	return json.Unmarshal(line, &s.line)
}

func isBlank(b []byte) bool {
	for _, c := range b {
		if c != ' ' && c != '\t' && c != '\r' && c != '\n' {
			return false
		}
	}
	return true
}

// readLine returns the next line, '\n' included, valid until the next read.
func (s *stream) readLine() ([]byte, error) {
	line, err := s.lines.readLine()
	switch {
	case err == nil:
		return line, nil
	case err == io.EOF && len(line) > 0 && !isBlank(line):
		// The answer ended without a newline: the line stands if it
		// is whole, otherwise the stream was cut in the middle of it.
		if json.Valid(line) {
			return line, nil
		}
		return nil, io.ErrUnexpectedEOF
	}
	return nil, err
}

var _ llm.Buffered = (*stream)(nil)

// Buffered implements runtime.Buffered: it reports whether Recv will
// return an event without waiting on the runtime. Lines already complete
// in the read buffer are decoded ahead until one yields an event, so a
// line without one (empty content) cannot make the caller hold back what
// it has while Recv then waits on the network.
func (s *stream) Buffered() bool {
	for s.n == 0 && s.err == nil && !s.done {
		if !s.lines.bufferedLine() {
			return false
		}
		line, err := s.readLine() // a whole line is buffered: no read
		if err == nil {
			err = s.parse(line)
		}
		switch {
		case err == errBlank:
		case err != nil:
			s.fail(s.readError(err))
		default:
			if err := s.decode(&s.line); err != nil {
				s.fail(err)
			}
		}
	}
	return s.n > 0
}

// decode queues the events of one line.
func (s *stream) decode(l *chatLine) error {
	if l.Error != "" {
		return &streamError{msg: l.Error}
	}
	content := l.Message.Content
	if l.Response != "" {
		content = l.Response
	}
	if content != "" || l.Message.Thinking != "" || len(l.Message.ToolCalls) > 0 || len(l.Logprobs) > 0 {
		ev := llm.Event{Content: content, Reasoning: l.Message.Thinking, Logprobs: logprobsOf(l.Logprobs)}
		if len(l.Message.ToolCalls) > 0 {
			s.toolCalls = true
			ev.ToolCalls = make([]llm.ToolCall, len(l.Message.ToolCalls))
			for i, tc := range l.Message.ToolCalls {
				args := tc.Function.Arguments
				if len(args) == 0 || string(args) == "null" {
					args = json.RawMessage("{}")
				}
				ev.ToolCalls[i] = llm.ToolCall{ID: newCallID(), Name: tc.Function.Name, Arguments: args}
			}
		}
		s.push(ev)
	}
	if l.Done {
		finish := llm.FinishStop
		switch {
		case l.DoneReason == "length":
			finish = llm.FinishLength
		case s.toolCalls:
			finish = llm.FinishToolCalls
		}
		s.done = true
		s.push(llm.Event{
			Done:             true,
			FinishReason:     finish,
			PromptTokens:     l.PromptEvalCount,
			CompletionTokens: l.EvalCount,
		})
	}
	return nil
}

func (s *stream) push(ev llm.Event) {
	s.pending[(s.head+s.n)%len(s.pending)] = ev
	s.n++
}

// Recv implements llm.Stream.
func (s *stream) Recv() (llm.Event, error) {
	for {
		if s.n > 0 {
			ev := s.pending[s.head]
			s.pending[s.head] = llm.Event{}
			s.head = (s.head + 1) % len(s.pending)
			s.n--
			if ev.Done {
				s.finish()
			}
			return ev, nil
		}
		if s.err != nil {
			return llm.Event{}, s.err
		}
		if s.done {
			return llm.Event{}, io.EOF
		}
		if err := s.next(); err != nil {
			return llm.Event{}, s.fail(s.readError(err))
		}
		if err := s.decode(&s.line); err != nil {
			return llm.Event{}, s.fail(err)
		}
	}
}

func (s *stream) readError(err error) error {
	if cause := context.Cause(s.ctx); cause != nil {
		return fmt.Errorf("ollama: generation stopped: %w", cause)
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return fmt.Errorf("%w: model runtime at %s: stream broken: %w", llm.ErrUnavailable, s.b.base, err)
}

func (s *stream) fail(err error) error {
	s.err = err
	s.Close()
	return err
}

// finish releases the connection after the final event. Draining the
// (already ended) body lets the transport reuse the connection.
func (s *stream) finish() {
	_, _ = io.Copy(io.Discard, io.LimitReader(s.lines, 4<<10))
	s.Close()
}

// Close implements llm.Stream. Cancelling the request closes the
// connection if its answer was not read to the end, and Ollama stops
// generating when its client goes away.
func (s *stream) Close() error {
	s.closeOnce.Do(func() {
		if s.stopAfter != nil {
			s.stopAfter()
		}
		if s.watch != nil {
			s.watch.closed(s.track)
		}
		s.cancel(context.Canceled)
		if s.lines != nil {
			s.lines.Close()
		}
	})
	return nil
}

func newCallID() string {
	return "call_" + strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64()>>32, 36)
}
