package deployapi

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// sseBody is a streamed chat completion as the response body fasthttp pulls
// from. fasthttp writes a body of unknown length with writeBodyChunked: it
// reads into a buffer and writes and flushes one chunk per Read. So the
// connection's own goroutine receives each event from the runtime, encodes
// it and writes it: no body-stream pipe, no extra goroutine and no wake-up
// between reading a token and writing it (SetBodyStreamWriter runs the
// writer in a goroutine of its own and copies through a pipe).
//
// Each Read returns what is ready: it waits for one event, then takes every
// event the runtime already has (llm.Buffered) before returning, so a burst
// of tokens costs one write and a lone token is written at once.
type sseBody struct {
	c            *completion
	conn         interface{ SetWriteDeadline(time.Time) error }
	enc          *openai.ChunkEncoder
	includeUsage bool
	buffered     llm.Buffered // nil if the stream cannot tell

	bp       *[]byte // pooled; buf is its contents
	buf      []byte
	off      int  // buf[off:] is not read yet
	started  bool // the role chunk went out
	finished bool // the last event is in buf
	tools    int  // tool calls relayed, for their indexes

	deadline time.Time
	once     sync.Once
	done     func() // the completion's end: metrics, slot, gate
}

func newSSEBody(c *completion, conn interface{ SetWriteDeadline(time.Time) error }, enc *openai.ChunkEncoder, includeUsage bool, done func()) *sseBody {
	b := &sseBody{c: c, conn: conn, enc: enc, includeUsage: includeUsage, done: done}
	b.buffered, _ = c.stream.(llm.Buffered)
	b.bp = c.api.bufs.Get().(*[]byte)
	b.buf = (*b.bp)[:0]
	return b
}

// Read hands fasthttp the next part of the stream.
func (b *sseBody) Read(p []byte) (int, error) {
	if b.off == len(b.buf) {
		if b.finished || b.bp == nil {
			return 0, io.EOF
		}
		b.buf, b.off = b.buf[:0], 0
		now := b.fill()
		// A client that stops reading must not pin a generation slot
		// forever: bound each write. Moving the deadline costs a timer
		// update, so it moves only when a quarter of the window has passed.
		if stall := b.c.api.cfg.WriteStallTimeout; b.deadline.Sub(now) < stall*3/4 {
			b.deadline = now.Add(stall)
			_ = b.conn.SetWriteDeadline(b.deadline)
		}
	}
	n := copy(p, b.buf[b.off:])
	b.off += n
	return n, nil
}

// fill appends the next burst of events to buf and returns the time the
// last one arrived.
func (b *sseBody) fill() time.Time {
	c := b.c
	if !b.started {
		b.started = true
		b.buf = b.enc.AppendRole(b.buf)
		return time.Now()
	}
	for {
		ev, err := c.stream.Recv()
		now := time.Now() // one clock read per event, for metrics and the write deadline
		if errors.Is(err, io.EOF) {
			b.finished = true
			return now
		}
		if err != nil {
			// The response has started: report the failure in the stream's
			// own format, then end it cleanly.
			if c.gctx.Err() == nil {
				c.api.log.Warn("generation failed mid-stream", "err", err)
			}
			b.buf = b.enc.AppendError(b.buf, openai.RuntimeError(err))
			b.buf = b.enc.AppendDone(b.buf)
			b.finished = true
			return now
		}
		if ev.Reasoning != "" {
			b.buf = b.enc.AppendReasoning(b.buf, ev.Reasoning)
			c.reasoning++
			c.token(now)
		}
		switch {
		case c.logprobs && (ev.Content != "" || len(ev.Logprobs) > 0):
			b.buf = b.enc.AppendContentLogprobs(b.buf, ev.Content, ev.Logprobs)
		case ev.Content != "":
			b.buf = b.enc.AppendContent(b.buf, ev.Content)
		}
		if ev.Content != "" {
			c.token(now)
		}
		if len(ev.ToolCalls) > 0 {
			b.buf = b.enc.AppendToolCalls(b.buf, ev.ToolCalls, b.tools)
			b.tools += len(ev.ToolCalls)
		}
		if ev.Done {
			c.end(ev, b.tools > 0)
			b.buf = b.enc.AppendFinish(b.buf, c.finish)
			if b.includeUsage {
				b.buf = b.enc.AppendUsage(b.buf, c.usage(ev))
			}
			b.buf = b.enc.AppendDone(b.buf)
			b.finished = true
			return now
		}
		if len(b.buf) > 0 && (b.buffered == nil || !b.buffered.Buffered() || len(b.buf) >= 32<<10) {
			return now
		}
	}
}

// Close ends the completion: fasthttp calls it once the body is written,
// when writing it failed (the client is gone: closing the stream stops the
// generation), and when it resets a response it never wrote.
func (b *sseBody) Close() error {
	b.once.Do(func() {
		b.c.stream.Close()
		_ = b.conn.SetWriteDeadline(time.Time{})
		*b.bp = b.buf[:0]
		b.c.api.bufs.Put(b.bp)
		b.bp, b.buf, b.off = nil, nil, 0
		b.done()
	})
	return nil
}
