package ollama

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/hearthd/hearth/internal/evloop"
)

// loopTransport is the HTTP/1.1 transport to a runtime on this host: pooled
// keep-alive connections, and each request written and its answer read in
// the caller's goroutine. net/http's Transport runs two goroutines per
// connection (a read loop and a write loop) and hands every answer across
// them; for thousands of long streams to one local runtime that is ~16 KiB
// of stacks and buffers per stream spent on nothing (BENCHMARKS.md).
//
// A connection holds one buffer, its 1 KiB read buffer: a request is
// written from a pooled buffer, and an answer's body is read in place from
// the read buffer (loopBody), chunked framing removed as it goes, so the
// stream reads the runtime's lines without a buffer of its own. The answer's
// status line and headers are read by net/http (ReadResponse); generation
// requests are written by post, which builds their bytes directly, any
// other request by net/http (Request.Write, through RoundTrip).
type loopTransport struct {
	dial    func(ctx context.Context, network, addr string) (net.Conn, error)
	maxIdle int
	// loop, if set, watches the connections of polled posts (post's
	// polled), which are pooled apart from the others (pidle).
	loop *evloop.Loop

	mu    sync.Mutex
	idle  map[string][]*loopConn // by host:port, most recently used last
	pidle map[string][]*loopConn // the loop's
}

func newLoopTransport(maxIdle int) *loopTransport {
	d := &net.Dialer{
		// A loopback connect either succeeds at once or is refused;
		// waiting long only hides a runtime that is down.
		Timeout: 5 * time.Second,
		// The kernel resets loopback connections of a process that dies,
		// so keepalive probes would find nothing; skip their timers.
		KeepAlive: -1,
	}
	return &loopTransport{dial: d.DialContext, maxIdle: maxIdle, idle: map[string][]*loopConn{}, pidle: map[string][]*loopConn{}}
}

// loopReadBufferSize is a connection's read buffer, the one buffer a
// stream holds on the runtime's side. A token line is ~130 bytes with its
// chunk framing: a runtime that is ahead of the relay (hearthd busy, or a
// runtime writing in bursts) has a burst of ~30 tokens read with one read
// and relayed with one write (stream.Buffered); a longer line is assembled
// in loopBody.long. 1 KiB (6 tokens a read) cost streams that fall behind
// 1.6-2x the CPU per token and a third of their throughput, for 3 KiB a
// stream less (BENCHMARKS.md, "Streams written on the connection").
const loopReadBufferSize = 4 << 10

// loopConn is one connection with its read buffer.
type loopConn struct {
	c    net.Conn
	br   *bufio.Reader
	host string
	// pc is c when the loop watches it (a polled connection).
	pc *evloop.Conn
	// buf is the start of br's buffer: a read slides what is left of the
	// last one there first, so a stream's tokens are read from its first
	// lines (readHot of them are the event loop's hot lines).
	buf unsafe.Pointer
}

// readHot is how many bytes at the start of a polled connection's read
// buffer its stream reads at every token: a token's line and its chunk
// framing are ~130 bytes.
const readHot = 256

// Requests are written from pooled buffers, held only while a request is
// written: RoundTrip's bufio.Writer, post's byte slice.
var (
	loopWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 1<<10) }}
	loopBufs    = sync.Pool{New: func() any { b := make([]byte, 0, 2<<10); return &b }}
)

// maxPooledRequest is the largest request buffer kept for reuse; a larger
// request (a long prompt) is written from a buffer of its own.
const maxPooledRequest = 64 << 10

// RoundTrip sends req on a pooled connection (or a new one) and returns
// the answer with its headers read. The body is read from the connection
// as the caller reads it; read to the end, the connection goes back to the
// pool; closed before the end, the connection is closed, which is how a
// generation is stopped on the runtime.
func (t *loopTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		closeReqBody(req)
		return nil, fmt.Errorf("ollama transport: unsupported scheme %q", req.URL.Scheme)
	}
	host := dialHost(req.URL)
	for try := 0; ; try++ {
		pc, reused, err := t.get(req.Context(), host, false)
		if err != nil {
			closeReqBody(req)
			return nil, err
		}
		resp, err := t.send(pc, req.Context(), req.Close, func(w net.Conn) error {
			bw := loopWriters.Get().(*bufio.Writer)
			bw.Reset(w)
			err := req.Write(bw)
			if err == nil {
				err = bw.Flush()
			}
			bw.Reset(nil)
			loopWriters.Put(bw)
			return err
		}, func(br *bufio.Reader) (*http.Response, error) {
			// With the request, net/http knows an answer to HEAD has no
			// body whatever its Content-Length says: without it the body
			// would be waited for, and never come.
			return http.ReadResponse(br, req)
		})
		if err == nil {
			resp.Request = req
			return resp, nil
		}
		// A pooled connection the runtime closed while it was idle fails
		// before any answer: send again once on a new one, when the body
		// can be sent again.
		if !reused || try > 0 || req.Context().Err() != nil || !stale(err) {
			return nil, err
		}
		if req.GetBody != nil {
			body, gerr := req.GetBody()
			if gerr != nil {
				return nil, err
			}
			r2 := *req
			r2.Body = body
			req = &r2
		} else if req.Body != nil && req.Body != http.NoBody {
			return nil, err
		}
	}
}

// dialHost is u's host:port.
func dialHost(u *url.URL) string {
	if u.Port() == "" {
		return net.JoinHostPort(u.Hostname(), "80")
	}
	return u.Host
}

// loopTarget is a URL requests are posted to, its request line and fixed
// headers prepared once.
type loopTarget struct {
	host string // host:port to dial
	head string // request line and headers up to Content-Length's value
}

// The headers post sends after Content-Length, the same net/http's
// Request.Write sends for the request generate built before.
const loopTargetTail = "\r\nAccept: application/x-ndjson\r\nContent-Type: application/json\r\n\r\n"

func newLoopTarget(rawURL string) (*loopTarget, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" || u.Host == "" {
		return nil, fmt.Errorf("ollama transport: unsupported URL %q", rawURL)
	}
	// As Request.Write writes it: the request URI, the Host header
	// without a default port, net/http's default User-Agent.
	return &loopTarget{
		host: dialHost(u),
		head: "POST " + u.RequestURI() + " HTTP/1.1\r\nHost: " + u.Host + "\r\nUser-Agent: Go-http-client/1.1\r\nContent-Length: ",
	}, nil
}

// appendPost appends the request posting body (JSON) to to.
func (to *loopTarget) appendPost(dst, body []byte) []byte {
	dst = append(dst, to.head...)
	dst = strconv.AppendInt(dst, int64(len(body)), 10)
	dst = append(dst, loopTargetTail...)
	return append(dst, body...)
}

// post sends body (JSON) to to on a pooled connection (or a new one), the
// request's bytes built directly, and returns the answer with its headers
// read: RoundTrip for the one request a generation makes, without
// building an http.Request. The answer's Body is a *loopBody.
//
// polled asks for a connection watched by the transport's loop, if it has
// one: the stream then can be relayed from the loop's goroutine
// (llm.Pollable).
func (t *loopTransport) post(ctx context.Context, to *loopTarget, body []byte, polled bool) (*http.Response, error) {
	p, err := t.open(ctx, ctx, to, body, polled, nil, nil)
	if err != nil {
		return nil, err
	}
	return p.answer(readHead, false)
}

// interrupts reports whether open can be interrupted for a polled request:
// its connection is then the loop's (evloop.Conn.Interrupt).
func (t *loopTransport) interrupts(polled bool) bool { return polled && t.loop != nil }

// open writes post's request and waits until the first byte of its answer
// has arrived, in the caller's goroutine. When intr or late (the
// first-byte deadline) closes first (only for a request interrupts accepts), it returns the request
// written and its answer untouched, with evloop.ErrInterrupted: its
// answer can still be read, in another goroutine. Interrupted while it
// writes, it closes the connection and returns an error that wraps
// evloop.ErrInterrupted, and no request. dctx bounds the dial of
// a new connection, ctx the request.
func (t *loopTransport) open(dctx, ctx context.Context, to *loopTarget, body []byte, polled bool, intr, late <-chan struct{}) (*pending, error) {
	bp := loopBufs.Get().(*[]byte)
	req := to.appendPost((*bp)[:0], body)
	defer func() {
		if cap(req) <= maxPooledRequest {
			*bp = req[:0]
			loopBufs.Put(bp)
		}
	}()
	for try := 0; ; try++ {
		pc, reused, err := t.get(dctx, to.host, polled)
		if err != nil {
			return nil, err
		}
		p := t.pending(pc, ctx)
		// A write that waits (a long prompt, a runtime that does not read)
		// gives up too; the request, sent in part, is then closed.
		p.interrupt(intr, late)
		_, err = pc.c.Write(req)
		p.interrupt(nil, nil)
		if err != nil {
			_, err = p.fail(err)
		} else if err = p.wait(intr, late); err == nil || errors.Is(err, evloop.ErrInterrupted) {
			return p, err
		}
		// As RoundTrip: once again on a new connection if a pooled one
		// turns out closed before it answered anything.
		if !reused || try > 0 || ctx.Err() != nil || !stale(err) {
			return nil, err
		}
	}
}

// pending is a request written on its connection, its answer not read yet.
type pending struct {
	t   *loopTransport
	pc  *loopConn
	ctx context.Context
	end closeOnEnd
}

// closeOnEnd is a request's context closing its connection at its end.
type closeOnEnd struct {
	g     *genCtx     // a generation's, which holds the close itself
	hook  uint64      // g's hook of the connection
	after func() bool // otherwise: context.AfterFunc's stop
}

// stop unregisters the close, and reports whether it had not run.
func (e closeOnEnd) stop() bool {
	if e.g != nil {
		return e.g.unhook(e.hook)
	}
	return e.after()
}

// pending registers the request about to be sent on pc: the caller's end
// (ctx) closes the connection, which interrupts whatever it is doing and
// tells the runtime to stop; no goroutine waits for it.
func (t *loopTransport) pending(pc *loopConn, ctx context.Context) *pending {
	p := &pending{t: t, pc: pc, ctx: ctx}
	if g, ok := ctx.(*genCtx); ok {
		p.end = closeOnEnd{g: g, hook: g.hook(pc.c)}
	} else {
		p.end = closeOnEnd{after: context.AfterFunc(ctx, func() { pc.c.Close() })}
	}
	return p
}

// fail closes p's connection, and reports err, or ctx's error if that is
// why.
func (p *pending) fail(err error) (*http.Response, error) {
	p.end.stop()
	p.pc.c.Close()
	if p.ctx.Err() != nil {
		return nil, p.ctx.Err()
	}
	return nil, err
}

// wait waits for the answer's first byte; see open for intr and late. On
// an error other than the interruption the connection is closed.
func (p *pending) wait(intr, late <-chan struct{}) error {
	if lc := p.pc.pc; lc != nil && p.pc.br.Buffered() == 0 {
		// The runtime has not read the request yet: nothing to read.
		lc.Later()
	}
	p.interrupt(intr, late)
	_, err := p.pc.br.Peek(1)
	p.interrupt(nil, nil)
	if err != nil {
		if errors.Is(err, evloop.ErrInterrupted) {
			return err
		}
		_, err = p.fail(err)
		return err
	}
	return nil
}

// interrupt makes p's blocking reads give up when intr or late closes
// (on a connection of the loop), until it is called with nils.
func (p *pending) interrupt(intr, late <-chan struct{}) {
	if lc := p.pc.pc; lc != nil {
		lc.Interrupt(intr, late)
	}
}

// answer reads the answer's head with read; its body is read as the
// caller reads resp.Body. On an error the connection is closed.
func (p *pending) answer(read func(*bufio.Reader) (*http.Response, error), reqClose bool) (*http.Response, error) {
	resp, err := read(p.pc.br)
	if err != nil {
		return p.fail(err)
	}
	resp.Body = p.t.body(p.pc, p.ctx, p.end, resp, reqClose)
	return resp, nil
}

// stale reports an error of a connection that was closed by the peer
// before it answered anything.
func stale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func closeReqBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// get takes an idle connection to host, or dials one; polled, one the
// loop watches (when the transport has a loop).
func (t *loopTransport) get(ctx context.Context, host string, polled bool) (pc *loopConn, reused bool, err error) {
	polled = polled && t.loop != nil
	t.mu.Lock()
	pool := t.idle
	if polled {
		pool = t.pidle
	}
	for l := pool[host]; len(l) > 0 && pc == nil; l = pool[host] {
		pc = l[len(l)-1]
		l[len(l)-1] = nil
		pool[host] = l[:len(l)-1]
		if pc.pc != nil && pc.pc.Failed() {
			// The runtime closed it while idle, and the loop saw it.
			pc.c.Close()
			pc = nil
		}
	}
	t.mu.Unlock()
	if pc != nil {
		return pc, true, nil
	}
	c, err := t.dial(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	var lc *evloop.Conn
	if polled {
		// Once per connection: it stays the loop's while pooled.
		if lc, err = t.loop.Detach(c); err != nil {
			return nil, false, err
		}
		c = lc
	}
	br := bufio.NewReaderSize(c, loopReadBufferSize)
	return &loopConn{c: c, br: br, host: host, pc: lc, buf: bufStart(br)}, false, nil
}

// bufStart is the start of a new Reader's buffer: its Peek(0) is an empty
// slice of it from the start (bufio has no other way to name it).
func bufStart(br *bufio.Reader) unsafe.Pointer {
	head, _ := br.Peek(0)
	return unsafe.Pointer(unsafe.SliceData(head))
}

// put returns a connection whose last answer was read to the end.
func (t *loopTransport) put(pc *loopConn) {
	if pc.pc != nil {
		pc.pc.Poll(nil) // blocking mode again for the next request
	}
	t.mu.Lock()
	pool := t.idle
	if pc.pc != nil {
		pool = t.pidle
	}
	l := pool[pc.host]
	if len(l) < t.maxIdle {
		pool[pc.host] = append(l, pc)
		pc = nil
	}
	t.mu.Unlock()
	if pc != nil {
		pc.c.Close()
	}
}

// CloseIdleConnections closes the pooled connections (http.Client calls
// it).
func (t *loopTransport) CloseIdleConnections() {
	t.mu.Lock()
	idle, pidle := t.idle, t.pidle
	t.idle, t.pidle = map[string][]*loopConn{}, map[string][]*loopConn{}
	t.mu.Unlock()
	for _, pool := range []map[string][]*loopConn{idle, pidle} {
		for _, l := range pool {
			for _, pc := range l {
				pc.c.Close()
			}
		}
	}
}

// send writes a request on pc with write and reads the answer's headers.
// On an error pc is closed.
func (t *loopTransport) send(pc *loopConn, ctx context.Context, reqClose bool, write func(net.Conn) error, read func(*bufio.Reader) (*http.Response, error)) (*http.Response, error) {
	p := t.pending(pc, ctx)
	if err := write(pc.c); err != nil {
		return p.fail(err)
	}
	return p.answer(read, reqClose)
}

// body is resp's body on pc, its framing read here, in place in pc.br;
// resp.Body (net/http's reader of the same bytes) is never read.
func (t *loopTransport) body(pc *loopConn, ctx context.Context, end closeOnEnd, resp *http.Response, reqClose bool) *loopBody {
	b := &loopBody{pc: pc, br: pc.br, t: t, ctx: ctx, hook: end, keep: !resp.Close && !reqClose}
	switch {
	case resp.Body == http.NoBody:
		b.rem = 0
	case len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked":
		b.chunked = true
	case resp.ContentLength >= 0:
		b.rem = resp.ContentLength
	default: // to the end of the connection
		b.rem, b.keep = -1, false
	}
	return b
}

// loopBody is an answer's body on its connection, read in place from the
// connection's read buffer: as bytes (Read) or as lines (readLine). The
// chunked framing is removed as it is read, with net/http's rules
// (FuzzLoopBody checks the two agree).
type loopBody struct {
	pc   *loopConn
	br   *bufio.Reader
	t    *loopTransport
	ctx  context.Context
	hook closeOnEnd // the close at ctx's end
	keep bool       // the connection may carry another request

	chunked bool
	rem     int64  // body bytes left: of the current chunk if chunked; -1 to the connection's end
	crlf    bool   // chunked: the CRLF after the current chunk's data is still to read
	excess  int64  // chunked: framing beyond what the data carries (net/http's check)
	end     bool   // read to the end, the connection handed back
	err     error  // the first error, returned from then on
	long    []byte // assembles a line longer than what the buffer holds, or split across chunks

	once sync.Once
}

// Errors of a malformed chunked body, as net/http words them.
var (
	errChunkLineTooLong = errors.New("header line too long")
	errMalformedChunked = errors.New("malformed chunked encoding")
	errChunkTooLarge    = errors.New("http chunk length too large")
	errInvalidByteChunk = errors.New("invalid byte in chunk length")
	errEmptyHexNumber   = errors.New("empty hex number for chunk length")
	errChunkLineEnd     = errors.New("chunked line does not end with CRLF alone")
	errTooMuchNonData   = errors.New("chunked encoding contains too much non-data")
	errLongTrailer      = errors.New("http: suspiciously long trailer after chunked body")
)

// more makes the next body bytes readable: rem > 0 (or -1) on a nil error,
// io.EOF at the body's end. It reads framing, never body bytes, so a
// caller may hold a slice of the buffer from before only if it called
// more without pending framing (rem > 0 already).
func (b *loopBody) more() error {
	if b.err != nil {
		return b.err
	}
	if b.rem != 0 {
		return nil
	}
	if !b.chunked {
		return b.finish()
	}
	if b.crlf {
		p, err := b.br.Peek(2)
		if err != nil {
			return b.fail(unexpected(err))
		}
		if p[0] != '\r' || p[1] != '\n' {
			return b.fail(errMalformedChunked)
		}
		b.br.Discard(2)
		b.crlf = false
	}
	line, err := b.chunkLine()
	if err != nil {
		return b.fail(err)
	}
	n, err := parseChunkSize(trimOWS(line))
	if err != nil {
		return b.fail(err)
	}
	// net/http's bound on framing against data, against a sender of
	// endless tiny chunks.
	b.excess += int64(len(line)) + 2 - 16 - 2*n
	b.excess = max(b.excess, 0)
	if b.excess > 16<<10 {
		return b.fail(errTooMuchNonData)
	}
	if n == 0 {
		// The last chunk, then the trailer (ignored: a stream has none
		// to act on), read as net/http reads it.
		p, _ := b.br.Peek(2)
		if len(p) == 2 && p[0] == '\r' && p[1] == '\n' {
			b.br.Discard(2)
			return b.finish()
		}
		if len(p) < 2 {
			return b.fail(io.ErrUnexpectedEOF)
		}
		if !seeDoubleCRLF(b.br) {
			return b.fail(errLongTrailer)
		}
		if _, err := textproto.NewReader(b.br).ReadMIMEHeader(); err != nil {
			return b.fail(unexpected(err))
		}
		return b.finish()
	}
	b.rem, b.crlf = n, true
	return nil
}

// seeDoubleCRLF reports whether the trailer's end is within what the
// buffer holds (net/http's seeUpcomingDoubleCRLF).
func seeDoubleCRLF(r *bufio.Reader) bool {
	for n := 4; ; n++ {
		buf, err := r.Peek(n)
		if bytes.HasSuffix(buf, []byte("\r\n\r\n")) {
			return true
		}
		if err != nil {
			return false
		}
	}
}

// chunkLine reads a chunk-size line and returns it without its CRLF, with
// net/http's rules (readChunkLine).
func (b *loopBody) chunkLine() ([]byte, error) {
	p, err := b.br.ReadSlice('\n')
	if err != nil {
		if err == bufio.ErrBufferFull {
			return nil, errChunkLineTooLong
		}
		return nil, unexpected(err)
	}
	if i := bytes.IndexByte(p, '\r'); i < 0 || i != len(p)-2 {
		return nil, errChunkLineEnd
	}
	p = p[:len(p)-2]
	if len(p) >= maxChunkLine {
		return nil, errChunkLineTooLong
	}
	return p, nil
}

func trimOWS(p []byte) []byte {
	for len(p) > 0 && (p[len(p)-1] == ' ' || p[len(p)-1] == '\t') {
		p = p[:len(p)-1]
	}
	return p
}

// maxChunkLine is net/http's bound on a chunk-size line.
const maxChunkLine = 4096

// parseChunkSize parses a chunk-size line with its extension as net/http
// does (removeChunkExtension, parseHexUint).
func parseChunkSize(line []byte) (int64, error) {
	for i, c := range line {
		if c == ';' {
			line = line[:i]
			break
		}
	}
	if len(line) == 0 {
		return 0, errEmptyHexNumber
	}
	var n int64
	for i, c := range line {
		c, ok := unhex(c)
		if !ok {
			return 0, errInvalidByteChunk
		}
		if i == 16 {
			return 0, errChunkTooLarge
		}
		n = n<<4 | int64(c)
	}
	if n < 0 {
		return 0, errChunkTooLarge
	}
	return n, nil
}

// unexpected turns the end of the connection inside a body into
// io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// finish marks the body read to its end and hands the connection back.
func (b *loopBody) finish() error {
	b.end = true
	b.err = io.EOF
	b.release(true)
	return io.EOF
}

// fail records the body's first error and closes the connection; an error
// that comes of the caller's end is reported as that.
func (b *loopBody) fail(err error) error {
	if b.ctx.Err() != nil {
		err = b.ctx.Err()
	}
	b.err = err
	b.release(false)
	return err
}

func (b *loopBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, b.err
	}
	if err := b.more(); err != nil {
		return 0, err
	}
	if b.rem >= 0 && int64(len(p)) > b.rem {
		p = p[:b.rem]
	}
	n, err := b.br.Read(p)
	if b.rem >= 0 {
		b.rem -= int64(n)
	}
	switch {
	case err == io.EOF && b.rem < 0:
		// The body ran to the connection's end, which is its end.
		b.finish()
		if n > 0 {
			return n, nil
		}
		return 0, io.EOF
	case err != nil:
		return n, b.fail(unexpected(err))
	}
	return n, nil
}

// readLine returns the body's next line, '\n' included, valid until the
// next read. At the end it returns io.EOF, with the last line if that had
// no '\n'.
func (b *loopBody) readLine() ([]byte, error) {
	b.long = b.long[:0]
	assembling := false
	for {
		if err := b.more(); err != nil {
			if err == io.EOF && assembling {
				return b.long, io.EOF
			}
			return nil, err
		}
		n := b.br.Buffered()
		if n == 0 {
			if _, err := b.br.Peek(1); err != nil {
				if err == io.EOF && b.rem < 0 {
					b.finish()
					if assembling {
						return b.long, io.EOF
					}
					return nil, io.EOF
				}
				return nil, b.fail(unexpected(err))
			}
			n = b.br.Buffered()
		}
		if b.rem >= 0 && int64(n) > b.rem {
			n = int(b.rem)
		}
		p, _ := b.br.Peek(n) // n <= Buffered: never reads
		if i := indexNL(p); i >= 0 {
			line := p[:i+1]
			b.br.Discard(i + 1)
			if b.rem >= 0 {
				b.rem -= int64(i + 1)
			}
			if assembling {
				b.long = append(b.long, line...)
				return b.keepLong(), nil
			}
			return line, nil
		}
		if int64(n) == b.rem || n == b.br.Size() {
			// The rest of this chunk, or a full buffer, without a line's
			// end: keep it and go on reading.
			b.long = append(b.long, p...)
			assembling = true
			b.br.Discard(n)
			if b.rem >= 0 {
				b.rem -= int64(n)
			}
			continue
		}
		// Part of the line is still to come.
		if _, err := b.br.Peek(n + 1); err != nil && err != bufio.ErrBufferFull {
			if err == io.EOF && b.rem < 0 {
				// Peek moved the buffered bytes: take them again.
				p, _ = b.br.Peek(b.br.Buffered())
				b.long = append(b.long, p...)
				b.br.Discard(len(p))
				b.finish()
				return b.long, io.EOF
			}
			return nil, b.fail(unexpected(err))
		}
	}
}

// keepLong returns the assembled line; a rare huge one does not keep its
// buffer.
func (b *loopBody) keepLong() []byte {
	l := b.long
	if cap(l) > 64<<10 {
		b.long = nil
	}
	return l
}

// indexNL is where p's first line ends. bytes.IndexByte searches a
// vector at a time: a burst of token lines is scanned for a newline once
// per line (bufferedLine, readLine), so a byte loop here was ~12 % of
// hearthd's CPU when the runtime writes in bursts.
func indexNL(p []byte) int { return bytes.IndexByte(p, '\n') }

// wait waits until the next chunk has begun (its size line read) or some
// of the body is in the read buffer, or the body ended. An error is kept
// for the next read (the connection's errors are lasting ones).
func (b *loopBody) wait() {
	switch {
	case b.err != nil || b.bufferedLine():
	case b.chunked && b.rem == 0:
		_ = b.more()
	case b.br.Buffered() == 0:
		_, _ = b.br.Peek(1)
	}
}

// bufferedLine reports whether a whole line is in the read buffer, so
// that readLine returns it without reading from the connection. It reads
// nothing.
func (b *loopBody) bufferedLine() bool {
	if b.err != nil {
		return false
	}
	buf, _ := b.br.Peek(b.br.Buffered())
	if !b.chunked {
		if b.rem >= 0 && int64(len(buf)) > b.rem {
			buf = buf[:b.rem]
		}
		return indexNL(buf) >= 0
	}
	rem, crlf := b.rem, b.crlf
	for {
		if rem == 0 {
			if crlf {
				if len(buf) < 2 || buf[0] != '\r' || buf[1] != '\n' {
					return false
				}
				buf = buf[2:]
			}
			i := indexNL(buf)
			if i < 0 {
				return false
			}
			l := buf[:i+1]
			if j := bytes.IndexByte(l, '\r'); j < 0 || j != len(l)-2 {
				return false
			}
			n, err := parseChunkSize(trimOWS(l[:len(l)-2]))
			if err != nil || n == 0 {
				return false
			}
			buf, rem, crlf = buf[i+1:], n, true
		}
		d := buf
		if int64(len(d)) > rem {
			d = d[:rem]
		}
		if indexNL(d) >= 0 {
			return true
		}
		if int64(len(d)) < rem {
			return false
		}
		buf, rem = buf[len(d):], 0
	}
}

// endBuffered reports whether the rest of the body is in the read buffer,
// or the body has ended: then reading it to the end takes no read from the
// connection. For a chunked body it knows the end only as net/http's
// server writes it (the last chunk, no trailer), which is how Ollama ends
// every answer; any other end reports false.
func (b *loopBody) endBuffered() bool {
	if b.err != nil {
		return true
	}
	buf, _ := b.br.Peek(b.br.Buffered()) // never reads
	if !b.chunked {
		return b.rem >= 0 && int64(len(buf)) >= b.rem
	}
	if b.rem != 0 {
		return false
	}
	if b.crlf {
		if !bytes.HasPrefix(buf, []byte("\r\n")) {
			return false
		}
		buf = buf[2:]
	}
	return bytes.HasPrefix(buf, []byte("0\r\n\r\n"))
}

// Close before the end closes the connection: the runtime sees the request
// cancelled. It may be called while a read is in progress, which it ends.
func (b *loopBody) Close() error {
	b.release(false)
	return nil
}

// release hands the connection back (the body was read to its end) or
// closes it, once.
func (b *loopBody) release(done bool) {
	b.once.Do(func() {
		// stop is false once the caller's end has closed the
		// connection.
		if b.hook.stop() && done && b.keep {
			b.t.put(b.pc)
			return
		}
		b.pc.c.Close()
	})
}

// readHead reads an answer's status line and headers from br: in place
// (parseHead) when the whole head is buffered and of the plain shape a
// runtime sends, otherwise with net/http's ReadResponse. Either way only
// what the transport acts on is kept: status, framing, Connection: close.
func readHead(br *bufio.Reader) (*http.Response, error) {
	if _, err := br.Peek(1); err == nil {
		buf, _ := br.Peek(br.Buffered())
		if resp, n, ok := parseHead(buf); ok {
			br.Discard(n)
			return resp, nil
		}
	}
	return http.ReadResponse(br, nil)
}

// parseHead parses the head at the start of buf if it is whole and plain:
// HTTP/1.1, a final status with a body, its body framed by exactly one of
// Content-Length or Transfer-Encoding: chunked, header lines of one line
// each, Connection only close or keep-alive. Anything else is left to
// net/http (ok false). n is the head's length. FuzzParseHead checks that
// net/http reads every head it accepts the same way.
func parseHead(buf []byte) (resp *http.Response, n int, ok bool) {
	end := bytes.Index(buf, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, 0, false
	}
	head := buf[:end+2] // each line with its CRLF
	line, rest := cutLine(head)
	const proto = "HTTP/1.1 "
	if len(line) < len(proto)+3 || string(line[:len(proto)]) != proto {
		return nil, 0, false
	}
	code := 0
	for _, c := range line[len(proto) : len(proto)+3] {
		if c < '0' || c > '9' {
			return nil, 0, false
		}
		code = code*10 + int(c-'0')
	}
	status := line[len(proto):]
	if code < 200 || code == 204 || code == 304 || (len(status) > 3 && status[3] != ' ') || !plainValue(status) {
		return nil, 0, false
	}
	// No header is kept (nothing reads them), and Ollama's status line
	// costs no copy.
	st := "200 OK"
	if string(status) != st {
		st = string(status)
	}
	resp = &http.Response{
		Status: st, StatusCode: code,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		ContentLength: -1,
	}
	for len(rest) > 0 {
		line, rest = cutLine(rest)
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !tokenName(line[:colon]) {
			return nil, 0, false
		}
		name, value := line[:colon], trimSP(line[colon+1:])
		if !plainValue(value) {
			return nil, 0, false
		}
		switch {
		case asciiEqualFold(name, "Content-Length"):
			if resp.ContentLength >= 0 || len(value) == 0 || len(value) > 18 {
				return nil, 0, false
			}
			var cl int64
			for _, c := range value {
				if c < '0' || c > '9' {
					return nil, 0, false
				}
				cl = cl*10 + int64(c-'0')
			}
			resp.ContentLength = cl
		case asciiEqualFold(name, "Transfer-Encoding"):
			if resp.TransferEncoding != nil || !asciiEqualFold(value, "chunked") {
				return nil, 0, false
			}
			resp.TransferEncoding = []string{"chunked"}
		case asciiEqualFold(name, "Connection"):
			switch {
			case asciiEqualFold(value, "close"):
				resp.Close = true
			case asciiEqualFold(value, "keep-alive"):
			default:
				return nil, 0, false
			}
		case asciiEqualFold(name, "Trailer"):
			return nil, 0, false
		}
	}
	if (resp.ContentLength >= 0) == (resp.TransferEncoding != nil) {
		return nil, 0, false
	}
	return resp, end + 4, true
}

// cutLine cuts the first CRLF-terminated line off b.
func cutLine(b []byte) (line, rest []byte) {
	i := bytes.Index(b, []byte("\r\n"))
	return b[:i], b[i+2:]
}

func trimSP(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// plainValue reports whether v is printable ASCII (and tabs) only.
func plainValue(v []byte) bool {
	for _, c := range v {
		if (c < ' ' && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}

// tokenName reports whether b is a header name of letters, digits and
// '-' only.
func tokenName(b []byte) bool {
	for _, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c, d := b[i], s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if 'A' <= d && d <= 'Z' {
			d += 'a' - 'A'
		}
		if c != d {
			return false
		}
	}
	return true
}
