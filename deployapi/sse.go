package deployapi

import (
	"errors"
	"io"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/openai"
)

// streamSink encodes a streamed generation's events in one route's wire
// format; sseBody decides when they are written.
type streamSink interface {
	// begin appends what opens the stream.
	begin(dst []byte) []byte
	// event appends what an event of choice i carries: content, reasoning,
	// tool calls (also on the final event). c has seen it already.
	event(dst []byte, c *completion, i int, ev *llm.Event) []byte
	// choiceEnd appends what closes choice i, after c.end recorded how its
	// generation ended.
	choiceEnd(dst []byte, c *completion, i int) []byte
	// finish appends what closes the stream, after the last choice ended.
	finish(dst []byte, c *completion) []byte
	// fail appends the report of a failure after the stream started.
	fail(dst []byte, e *openai.Error) []byte
}

// chunkEncoder is what choiceSink needs of a route's chunk encoder
// (openai.ChunkEncoder, openai.TextChunkEncoder).
type chunkEncoder[E any] interface {
	AppendFinish(dst []byte, reason string) []byte
	AppendUsage(dst []byte, u openai.Usage) []byte
	AppendDone(dst []byte) []byte
	AppendError(dst []byte, e *openai.Error) []byte
	ForChoice(i int) E
}

// choiceSink is the part of a chunk-per-token sink (chat, legacy
// completions) that is the same for both: an encoder per choice, each
// choice's finish chunk, then the usage chunk when asked for and [DONE].
type choiceSink[E chunkEncoder[E]] struct {
	enc          E
	encs         []E // per choice; encs[0] is enc when there is one
	one          [1]E
	includeUsage bool
}

func (k *choiceSink[E]) init(enc E, n int, includeUsage bool) {
	k.enc, k.includeUsage = enc, includeUsage
	k.one[0] = enc
	k.encs = k.one[:]
	if n > 1 {
		k.encs = make([]E, n)
		for i := range k.encs {
			k.encs[i] = enc.ForChoice(i)
		}
	}
}

func (k *choiceSink[E]) choiceEnd(dst []byte, c *completion, i int) []byte {
	return k.encs[i].AppendFinish(dst, c.choices[i].finish)
}

func (k *choiceSink[E]) finish(dst []byte, c *completion) []byte {
	if k.includeUsage {
		dst = k.enc.AppendUsage(dst, c.usage())
	}
	return k.enc.AppendDone(dst)
}

func (k *choiceSink[E]) fail(dst []byte, e *openai.Error) []byte {
	return k.enc.AppendDone(k.enc.AppendError(dst, e))
}

func setSSEHeaders(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/event-stream; charset=utf-8")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
}

// streamSSE answers with the completion as server-sent events encoded by
// sink; c.done is called once the stream has ended.
func (c *completion) streamSSE(ctx *fasthttp.RequestCtx, sink streamSink) {
	setSSEHeaders(ctx)
	if c.api.hijackable(ctx) {
		c.api.hijackStream(ctx, newSSEBody(c, ctx.Conn(), sink, chunkRoom))
		return
	}
	b := newSSEBody(c, ctx.Conn(), sink, 0)
	// The headers go out at once, with the opening if the format has one:
	// the client knows it was admitted before the first token.
	ctx.Response.ImmediateHeaderFlush = len(b.buf) == 0
	ctx.SetBodyStream(b, -1)
}

func isEOF(err error) bool { return errors.Is(err, io.EOF) }

// sseBody is a streamed completion: written on the hijacked connection
// (relay, hijack.go), or, where that cannot be, the response body fasthttp
// pulls from. fasthttp writes a body of unknown length with writeBodyChunked: it
// reads into a buffer, then writes and flushes one chunk per Read. So the
// connection's own goroutine receives each event from the runtime, encodes
// it and writes it: no body-stream pipe, no extra goroutine and no wake-up
// between reading a token and writing it (SetBodyStreamWriter runs its
// writer in a goroutine of its own and copies through a pipe).
//
// Each Read returns what is ready: it waits for one event, then takes every
// event the runtime already has (Buffered) before returning, so a burst of
// tokens costs one write and a lone token is written at once.
type sseBody struct {
	c    *completion
	conn interface{ SetWriteDeadline(time.Time) error }
	sink streamSink

	bp       *[]byte // pooled, held while buf has bytes to hand over
	buf      []byte  // *bp's contents; starts with the opening
	room     int     // buf[:room] is kept for the chunk-size line (relay)
	off      int     // buf[off:] is not read yet (Read)
	finished bool    // the end is in buf
	closed   bool
	live     int       // choices not ended yet
	ev       llm.Event // the event fillFrom handles

	deadline time.Time
	once     sync.Once
}

func newSSEBody(c *completion, conn interface{ SetWriteDeadline(time.Time) error }, sink streamSink, room int) *sseBody {
	b := &sseBody{c: c, conn: conn, sink: sink, live: len(c.choices), room: room}
	b.get()
	b.buf = sink.begin(b.buf)
	if len(b.buf) == room {
		b.put()
	}
	if room == 0 { // relay sets its own once it has the connection
		b.deadline = time.Now().Add(c.api.cfg.WriteStallTimeout)
		_ = conn.SetWriteDeadline(b.deadline)
	}
	return b
}

// Read hands fasthttp the next part of the stream. The pooled buffer is
// held only while it has bytes to hand over: between tokens a stream holds
// none (thousands of streams wait on their runtime most of the time).
func (b *sseBody) Read(p []byte) (int, error) {
	if b.off == len(b.buf) {
		if b.finished || b.closed {
			return 0, io.EOF
		}
		b.put()
		// Wait for the runtime here, in a short call: this is where a
		// stream spends its time between tokens (llm.Waiter).
		if w, ok := b.c.stream.(llm.Waiter); ok {
			w.Wait()
		}
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
	if b.off == len(b.buf) {
		b.put()
	}
	return n, nil
}

// get takes a pooled buffer for the next part, put returns it.
func (b *sseBody) get() {
	if b.bp == nil {
		b.bp = b.c.api.bufs.Get().(*[]byte)
		b.buf, b.off = (*b.bp)[:b.room], b.room
	}
}

func (b *sseBody) put() {
	if b.bp != nil {
		*b.bp = b.buf[:0]
		b.c.api.bufs.Put(b.bp)
		b.bp, b.buf, b.off = nil, nil, 0
	}
}

// fill appends the next burst of events to buf and returns the time the
// last one arrived.
func (b *sseBody) fill() time.Time { return b.fillFrom(false) }

// fillPolled is fill for a stream relayed from the event loop: it never
// waits on the runtime (Recv only while the stream has an event buffered),
// and is called once Ready reported one.
func (b *sseBody) fillPolled() time.Time { return b.fillFrom(true) }

func (b *sseBody) fillFrom(polled bool) time.Time {
	c := b.c
	for {
		// Into b.ev: a local would move to the heap (the sinks take its
		// address through an interface), one allocation per token.
		var i int
		var err error
		i, b.ev, err = c.stream.Recv()
		ev := &b.ev
		now := time.Now() // one clock read per event, for metrics and the write deadline
		b.get()
		if isEOF(err) {
			b.finished = true
			return now
		}
		if err != nil {
			// The response has started: report the failure in the stream's
			// own format, then end it cleanly.
			if !c.api.logPanic(err) && c.gctx.Err() == nil {
				c.api.log.Warn("generation failed mid-stream", "err", err)
			}
			b.buf = b.sink.fail(b.buf, openai.RuntimeError(err))
			b.finished = true
			return now
		}
		c.seen(i, ev, now)
		b.buf = b.sink.event(b.buf, c, i, ev)
		if ev.Done {
			c.end(i, *ev)
			b.buf = b.sink.choiceEnd(b.buf, c, i)
			if b.live--; b.live == 0 {
				b.buf = b.sink.finish(b.buf, c)
				b.finished = true
				return now
			}
		}
		if polled && !c.stream.Buffered() {
			return now
		}
		if len(b.buf) > b.room && (!c.stream.Buffered() || len(b.buf) >= 32<<10) {
			return now
		}
	}
}

// Close ends the completion: fasthttp calls it once the body is written,
// when writing it failed (the client is gone: closing the stream stops the
// generation), and when it resets a response it never wrote; hijackStream
// once the relay ended.
func (b *sseBody) Close() error {
	b.end()
	_ = b.conn.SetWriteDeadline(time.Time{})
	b.put()
	return nil
}

// end ends the completion once: the generation stops if it runs yet, and
// it is counted (metrics, the key's usage) and its slot freed.
func (b *sseBody) end() {
	b.once.Do(func() {
		b.closed = true
		b.c.stream.Close()
		b.c.done()
	})
}
