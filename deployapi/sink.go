package deployapi

import (
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
