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
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/hearthd/hearth/internal/cacheline"
	"github.com/hearthd/hearth/internal/evloop"
	"github.com/hearthd/hearth/llm"
)

// stream reads Ollama's NDJSON answer in the caller's goroutine, no
// goroutine or channel in between. Lines are read in place: from the
// transport's read buffer (loopBody), or through a buffer of the stream's
// own for another transport (bufLines). The common token line is decoded by
// fastTokenLine, which allocates only the token's text, and every other
// line by encoding/json.
type stream struct {
	b     *Backend
	ctx   *genCtx    // the request's; its cause says why it ended
	lines lineSource // the answer's body
	line  chatLine   // the last line read, reused for every line

	// Events decoded from one line, waiting to be returned. A line yields
	// at most two: its content or tool calls, and the final event.
	pending [2]llm.Event
	head, n int

	stopAfter func() bool // unregisters the caller's cancellation hook

	watch *stallWatch // told when the request closes
	track *genTrack

	toolCalls bool // tool calls seen; the finish reason is tool_calls
	done      bool // final event decoded
	err       error

	// pc is the connection while the stream is polled (llm.Pollable);
	// drainedAt is its Edge when a read last emptied it, or ^0.
	pc        *evloop.Conn
	drainedAt uint64
	// lingering is set while a polled stream, past its final event, waits
	// for the end of the runtime's answer to hand the connection back: its
	// Close leaves the connection to that wait (linger).
	lingering atomic.Bool

	closeOnce sync.Once
}

// lineSource is an answer's body read as lines.
type lineSource interface {
	// readLine returns the next line, '\n' included, valid until the next
	// read. At the end it returns io.EOF, with the last line if that had
	// no '\n'.
	readLine() ([]byte, error)
	// bufferedLine reports whether a whole line is buffered: readLine
	// returns it without waiting on the runtime.
	bufferedLine() bool
	// wait waits until some of the body is buffered, or the body ended.
	wait()
	// Read reads the rest of the body; Close ends it.
	io.ReadCloser
}

// linesOf reads body as lines: in place if the loop transport answered,
// otherwise through a buffer.
func linesOf(body io.ReadCloser) lineSource {
	if lb, ok := body.(*loopBody); ok {
		return lb
	}
	return &bufLines{ReadCloser: body, br: bufio.NewReaderSize(body, lineBufSize)}
}

// lineBufSize is bufLines' read buffer. A token line is ~130 bytes, so a
// burst of a dozen tokens fits and is relayed with one write (see
// Buffered); a longer line (tool calls) is assembled in bufLines.long.
const lineBufSize = 2 << 10

// bufLines reads the lines of a body of another transport than the loop
// transport (a custom HTTP client, https) through a buffer.
type bufLines struct {
	io.ReadCloser
	br   *bufio.Reader
	long []byte // assembles a line longer than br's buffer
}

func (l *bufLines) Read(p []byte) (int, error) { return l.br.Read(p) }

func (l *bufLines) readLine() ([]byte, error) {
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

func (l *bufLines) wait() {
	if l.br.Buffered() == 0 {
		_, _ = l.br.Peek(1) // an error is the next read's too
	}
}

func (l *bufLines) bufferedLine() bool {
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

var (
	_ llm.Buffered = (*stream)(nil)
	_ llm.Waiter   = (*stream)(nil)
)

// Wait implements llm.Waiter.
func (s *stream) Wait() {
	if s.n == 0 && s.err == nil && !s.done {
		s.lines.wait()
	}
}

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
	if cause := s.ctx.causeOf(); cause != nil {
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
	if s.pc != nil {
		// Polled: reading may not wait. Ollama writes the answer's end
		// (the last chunk) after its final line, often in a write of its
		// own; if it has not come yet, the loop waits for it.
		lb := s.lines.(*loopBody)
		if !lb.endBuffered() {
			s.ingest(lb)
		}
		if !lb.endBuffered() && !s.pc.Failed() {
			s.lingering.Store(true)
			pc := s.pc
			// Closed on the loop's goroutine, so never once handed back.
			t := time.AfterFunc(lingerTimeout, func() {
				pc.Loop().Post(func() {
					if s.lingering.Load() {
						pc.Close()
					}
				})
			})
			pc.Poll(func() {
				s.ingest(lb)
				if lb.endBuffered() || pc.Failed() {
					t.Stop()
					s.endLinger()
				}
			})
			return
		}
		s.Unpoll()
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(s.lines, 4<<10))
	s.Close()
}

// lingerTimeout bounds the wait for the end of an answer whose final line
// has come: Ollama writes it at once.
const lingerTimeout = 2 * time.Second

// endLinger ends a linger: the end of the answer is in, or the connection
// failed. On the loop's goroutine.
func (s *stream) endLinger() {
	s.pc.Poll(nil)
	s.pc = nil
	_, _ = io.Copy(io.Discard, io.LimitReader(s.lines, 4<<10)) // no wait: ended, or failed
	s.lingering.Store(false)
	s.end()
	s.Close()
}

// Close implements llm.Stream. Cancelling the request closes the
// connection, and Ollama stops generating when its client goes away.
func (s *stream) Close() error {
	s.closeOnce.Do(func() {
		if s.stopAfter != nil {
			s.stopAfter()
		}
		if s.watch != nil {
			s.watch.closed(s.track)
		}
		if !s.lingering.Load() {
			s.end()
		}
	})
	return nil
}

// end ends the request: the connection is closed if its answer was not
// read to the end, and Ollama stops generating when its client goes away.
func (s *stream) end() {
	s.ctx.cancel(context.Canceled)
	if s.lines != nil {
		s.lines.Close()
	}
}

var _ llm.Pollable = (*stream)(nil)

// Poll implements llm.Pollable: a stream whose connection the transport's
// loop watches (a polled post) can be.
func (s *stream) Poll(ready func(), hot ...unsafe.Pointer) bool {
	lb, ok := s.lines.(*loopBody)
	if !ok || lb.pc.pc == nil || s.pc != nil {
		return false
	}
	s.pc = lb.pc.pc
	// The first line was read in blocking mode, which may have emptied the
	// socket.
	s.drainedAt = s.pc.Drained()
	// What Ready and Recv read at every token.
	hot = cacheline.Of(hot, s)
	hot = cacheline.Of(hot, lb)
	hot = cacheline.Of(hot, lb.pc)
	hot = cacheline.Of(hot, lb.br)
	hot = cacheline.Span(hot, lb.pc.buf, readHot)
	s.pc.Poll(ready, hot...)
	return true
}

// Unpoll implements llm.Pollable.
func (s *stream) Unpoll() {
	if s.pc != nil {
		s.pc.Poll(nil)
		s.pc = nil
	}
}

// Ready implements llm.Pollable. It reads at most until a read takes less
// than the buffer had room for: the socket is empty then, and the loop
// (edge-triggered) is told when more comes; so no read finds it empty for
// nothing, the read a Go stream makes before it may wait. Once the runtime
// hung up, it reads on to the close (evloop.Conn.HungUp).
func (s *stream) Ready() llm.PollState {
	lb := s.lines.(*loopBody)
	for {
		if s.Buffered() || s.err != nil || s.done || lb.err != nil {
			return llm.PollReady
		}
		if s.pc.Failed() {
			return llm.PollReady // Recv reads and returns the error at once
		}
		if s.drainedAt == s.pc.Edge() {
			return llm.PollWait
		}
		room := lb.br.Size() - lb.br.Buffered()
		if room == 0 {
			// A line longer than the buffer: readLine assembles it, which
			// takes reads that may wait.
			return llm.PollBlock
		}
		got := s.ingest(lb)
		if got < room && !s.pc.HungUp() {
			// Emptied, and the loop calls again when more comes. Not so
			// once the runtime closed: its close may have come with these
			// bytes, in the same event, and is read next.
			s.drainedAt = s.pc.Edge()
		}
		if got == 0 && !s.pc.Failed() {
			return llm.PollWait
		}
	}
}

// ingest reads once what the connection has into the read buffer, without
// waiting, and returns how many bytes came.
func (s *stream) ingest(lb *loopBody) int {
	n := lb.br.Buffered()
	if n == lb.br.Size() {
		return 0
	}
	_, _ = lb.br.Peek(n + 1) // one read: bufio fills once, then has n+1
	return lb.br.Buffered() - n
}

func newCallID() string {
	return "call_" + strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64()>>32, 36)
}
