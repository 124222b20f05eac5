package deployapi

import (
	"time"

	"github.com/valyala/fasthttp"
)

// readBufferSize is fasthttp's read buffer, which bounds a request's
// headers. With ReduceMemoryUsage a connection holds it only while it reads
// a request, so the allowance for long headers costs streams nothing.
const readBufferSize = 8192

// writeBufferSize is fasthttp's write buffer, held by a connection for as
// long as its response is written: minutes for a stream. An SSE chunk
// (~250 bytes a token) and a burst of a few tokens fit; fasthttp hands a
// streamed body over at most 4 KiB at a time, and a larger one is written
// in two writes.
const writeBufferSize = 2048

// Bounds on reading and discarding a refused body.
const (
	drainMaxBytes = 64 << 20
	drainMaxTime  = 10 * time.Second
	// A client on a slow or busy link pauses mid-body; a shorter wait
	// closed such uploads with a reset instead of the answer.
	drainIdle = time.Second
)

// drainRefusedBody reads and discards the body of a request refused before
// its body was read (too large, or a bad key), before the error answer is
// written and the connection closed. Closing a socket with unread data
// makes the kernel send a reset, which reaches the client before (and
// instead of) the answer: curl, Node's fetch and Go's client then report
// "connection reset" rather than the 413 or 401. Memory stays one small
// buffer; time and bytes are bounded, and the drain stops as soon as the
// client pauses, so one that announced a body and sends none is answered
// at once.
func drainRefusedBody(ctx *fasthttp.RequestCtx) {
	conn := ctx.Conn()
	end := time.Now().Add(drainMaxTime)
	buf := make([]byte, 32<<10)
	var got int64
	for got < drainMaxBytes {
		deadline := time.Now().Add(drainIdle)
		if deadline.After(end) {
			deadline = end
		}
		if conn.SetReadDeadline(deadline) != nil {
			return
		}
		n, err := conn.Read(buf)
		got += int64(n)
		if err != nil {
			return
		}
	}
}
