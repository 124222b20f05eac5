package ollama

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"
	"unsafe"
)

// nopConn is a connection whose Close does nothing, for bodies read from
// memory.
type nopConn struct{ net.Conn }

func (nopConn) Close() error { return nil }

// countingReader counts the reads made of r.
type countingReader struct {
	r     io.Reader
	reads int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// memBody reads raw (an answer: status line, headers, body) as the loop
// transport does, through src wrapping the bytes, and returns its body.
func memBody(t testing.TB, raw []byte, src func(io.Reader) io.Reader) (*http.Response, *loopBody, *countingReader) {
	cr := &countingReader{r: src(bytes.NewReader(raw))}
	pc := &loopConn{c: nopConn{}, br: bufio.NewReaderSize(cr, loopReadBufferSize)}
	resp, err := http.ReadResponse(pc.br, nil)
	if err != nil {
		return nil, nil, nil
	}
	tr := newLoopTransport(1)
	return resp, tr.body(pc, context.Background(), closeOnEnd{after: func() bool { return true }}, resp, false), cr
}

// stdBody is what net/http reads of raw's body, through a buffer of the
// same size.
func stdBody(raw []byte) ([]byte, error, bool) {
	resp, err := http.ReadResponse(bufio.NewReaderSize(bytes.NewReader(raw), loopReadBufferSize), nil)
	if err != nil {
		return nil, nil, false
	}
	b, err := io.ReadAll(resp.Body)
	return b, err, true
}

// readLines reads b to its end with readLine, checking that a line
// bufferedLine promised is returned without a read (or a malformed body
// reported without one). It returns the lines joined.
func readLines(t testing.TB, b *loopBody, cr *countingReader) ([]byte, error) {
	var out []byte
	for range 1 << 16 {
		promised := b.bufferedLine()
		before := cr.reads
		line, err := b.readLine()
		if promised && cr.reads != before {
			t.Fatalf("bufferedLine was true, then readLine read %d times, err %v", cr.reads-before, err)
		}
		if err == nil && (len(line) == 0 || line[len(line)-1] != '\n') {
			t.Fatalf("readLine returned %q without its end", line)
		}
		out = append(out, line...)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
	t.Fatal("readLine never ended")
	return nil, nil
}

// checkLoopBody reads raw's body as net/http does and as loopBody does,
// with Read and with readLine, whole and a byte or half a buffer at a time,
// and fails unless all agree: the same bytes, or an error for all.
func checkLoopBody(t *testing.T, raw []byte) {
	want, wantErr, ok := stdBody(raw)
	if !ok {
		return // not an answer net/http reads; the transport fails alike
	}
	for _, src := range []struct {
		name string
		f    func(io.Reader) io.Reader
	}{
		{"whole", func(r io.Reader) io.Reader { return r }},
		{"bytes", iotest.OneByteReader},
		{"halves", iotest.HalfReader},
	} {
		for _, mode := range []string{"Read", "readLine"} {
			_, b, cr := memBody(t, raw, src.f)
			var got []byte
			var err error
			if mode == "Read" {
				got, err = io.ReadAll(b)
			} else {
				got, err = readLines(t, b, cr)
			}
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("%s, %s: err %v, net/http's %v\nanswer %q", src.name, mode, err, wantErr, raw)
			}
			if err == nil && !bytes.Equal(got, want) {
				t.Fatalf("%s, %s: body %q, net/http's %q\nanswer %q", src.name, mode, got, want, raw)
			}
			if err == nil && b.err != io.EOF {
				t.Fatalf("%s, %s: read to the end but not ended (%v)", src.name, mode, b.err)
			}
		}
	}
}

const chunkedHead = "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nTransfer-Encoding: chunked\r\n\r\n"

// loopBodySeeds are answers as Ollama writes them and framings around
// them, good and bad.
func loopBodySeeds() []string {
	tok := string(tokenLine("a"))
	long := string(tokenLine(strings.Repeat("x", 3*loopReadBufferSize)))
	chunk := func(s string) string { return strings.ToLower(strconvHex(len(s))) + "\r\n" + s + "\r\n" }
	return []string{
		chunkedHead + chunk(tok) + chunk(tok) + chunk(finalLine) + "0\r\n\r\n",
		chunkedHead + chunk(tok+tok+finalLine) + "0\r\n\r\n",
		chunkedHead + chunk(tok[:20]) + chunk(tok[20:]+finalLine) + "0\r\n\r\n",
		chunkedHead + chunk(long) + chunk(finalLine) + "0\r\n\r\n",
		chunkedHead + chunk(tok) + chunk(strings.TrimSuffix(finalLine, "\n")) + "0\r\n\r\n",
		chunkedHead + chunk(tok) + "0\r\nX-Trailer: 1\r\n\r\n",
		chunkedHead + "5;ext=1\r\nab\ncd\r\n0\r\n\r\n",
		chunkedHead + "5 \t\r\nab\ncd\r\n0\r\n\r\n",
		chunkedHead + "5\nab\ncd\r\n0\r\n\r\n",        // bare LF
		chunkedHead + "5\r\nab\ncdXX0\r\n\r\n",        // no CRLF after the data
		chunkedHead + "zz\r\nab\ncd\r\n0\r\n\r\n",     // not hex
		chunkedHead + "\r\nab\ncd\r\n0\r\n\r\n",       // empty size
		chunkedHead + "10000000000000000\r\n",         // too large
		chunkedHead + chunk(tok),                      // cut before the last chunk
		chunkedHead + chunk(tok) + "0\r\n",            // cut in the trailer
		chunkedHead + chunk(tok) + "0\r\nX: 1\r\n",    // cut in a trailer
		chunkedHead + chunk(tok) + "0\r\nbad\r\n\r\n", // malformed trailer
		chunkedHead + "3\r\nab",                       // cut in a chunk
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab\ncd",
		"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nab\ncd",
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: 17\r\n\r\n{\"error\":\"boom\"}\n",
		"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + tok + tok + "last",
		"HTTP/1.0 200 OK\r\n\r\n" + long + tok,
	}
}

func strconvHex(n int) string {
	const digits = "0123456789abcdef"
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n >>= 4 {
		b = append([]byte{digits[n&15]}, b...)
	}
	return string(b)
}

func TestLoopBodyAgreesWithNetHTTP(t *testing.T) {
	for _, raw := range loopBodySeeds() {
		checkLoopBody(t, []byte(raw))
	}
}

func FuzzLoopBody(f *testing.F) {
	for _, raw := range loopBodySeeds() {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkLoopBody(t, raw)
	})
}

// A line is handed out without a copy while it fits the buffer, and the
// connection goes back to the pool only at the body's end.
func TestLoopBodyReadsLinesInPlace(t *testing.T) {
	tok := tokenLine("a")
	raw := chunkedHead + strconvHex(len(tok)) + "\r\n" + string(tok) + "\r\n0\r\n\r\n"
	_, b, _ := memBody(t, []byte(raw), func(r io.Reader) io.Reader { return r })
	line, err := b.readLine()
	if err != nil || !bytes.Equal(line, tok) {
		t.Fatalf("readLine = %q, %v", line, err)
	}
	if b.long != nil {
		t.Fatal("a line that fits the buffer was copied")
	}
	if n := len(b.t.idle[""]); n != 0 {
		t.Fatal("the connection went back before the body's end")
	}
	if _, err := b.readLine(); err != io.EOF {
		t.Fatalf("readLine at the end = %v", err)
	}
	if n := len(b.t.idle[""]); n != 1 {
		t.Fatalf("%d idle connections after the end, want 1", n)
	}
}

// post writes the bytes net/http's Request.Write writes for the request
// generate built before it.
func TestLoopTargetWritesWhatNetHTTPWrites(t *testing.T) {
	for _, u := range []string{
		"http://127.0.0.1:11434/api/chat",
		"http://localhost/api/generate",
		"http://[::1]:8080/prefix/api/chat",
		"http://127.0.0.1:11434/api/chat?x=1",
	} {
		for _, body := range []string{"", `{"model":"m","messages":[]}`, strings.Repeat("b", 70<<10)} {
			to, err := newLoopTarget(u)
			if err != nil {
				t.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPost, u, bytes.NewReader([]byte(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/x-ndjson")
			var want bytes.Buffer
			if err := req.Write(&want); err != nil {
				t.Fatal(err)
			}
			got := to.appendPost(nil, []byte(body))
			if !bytes.Equal(got, want.Bytes()) {
				t.Fatalf("%s: post writes\n%q\nnet/http\n%q", u, trunc(got), trunc(want.Bytes()))
			}
			if _, port, _ := net.SplitHostPort(to.host); port == "" {
				t.Fatalf("%s: dial address %q has no port", u, to.host)
			}
		}
	}
}

func trunc(b []byte) []byte {
	if len(b) > 300 {
		return b[:300]
	}
	return b
}

// wait returns once the runtime has sent the next chunk's size line (or
// any body bytes), not before, and leaves the line to readLine.
func TestLoopBodyWait(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	tok := string(tokenLine("a"))
	chunk := strconvHex(len(tok)) + "\r\n" + tok + "\r\n"
	go io.WriteString(server, chunkedHead+chunk)
	pc := &loopConn{c: client, br: bufio.NewReaderSize(client, loopReadBufferSize)}
	resp, err := http.ReadResponse(pc.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b := newLoopTransport(1).body(pc, context.Background(), closeOnEnd{after: func() bool { return true }}, resp, false)
	b.wait() // the first line is on its way: returns once it is here
	if line, err := b.readLine(); err != nil || string(line) != tok {
		t.Fatalf("readLine = %q, %v", line, err)
	}
	waited := make(chan struct{})
	go func() { b.wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("wait returned before the runtime sent anything more")
	case <-time.After(50 * time.Millisecond):
	}
	go io.WriteString(server, chunk)
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return when the next chunk came")
	}
	if line, err := b.readLine(); err != nil || string(line) != tok {
		t.Fatalf("readLine after wait = %q, %v", line, err)
	}
	go io.WriteString(server, "0\r\n\r\n")
	b.wait()
	if _, err := b.readLine(); err != io.EOF {
		t.Fatalf("readLine at the end = %v", err)
	}
}

// checkParseHead fails if parseHead accepts a head that net/http reads
// otherwise: another status, framing, length, Connection: close, or
// length of the head.
func checkParseHead(t *testing.T, raw []byte) {
	resp, n, ok := parseHead(raw)
	if !ok {
		return
	}
	br := bufio.NewReaderSize(bytes.NewReader(raw), len(raw)+16)
	want, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("parseHead accepted a head net/http refuses (%v):\n%q", err, raw)
	}
	if consumed := len(raw) - br.Buffered(); consumed != n {
		t.Fatalf("head of %d bytes, net/http's %d:\n%q", n, consumed, raw)
	}
	chunked := len(want.TransferEncoding) > 0 && want.TransferEncoding[0] == "chunked"
	if resp.StatusCode != want.StatusCode || resp.Status != want.Status || resp.Close != want.Close ||
		(resp.TransferEncoding != nil) != chunked || (!chunked && resp.ContentLength != want.ContentLength) {
		t.Fatalf("parseHead: %d %q close=%v te=%v cl=%d; net/http: %d %q close=%v te=%v cl=%d\n%q",
			resp.StatusCode, resp.Status, resp.Close, resp.TransferEncoding, resp.ContentLength,
			want.StatusCode, want.Status, want.Close, want.TransferEncoding, want.ContentLength, raw)
	}
}

func headSeeds() []string {
	return []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nDate: Mon, 23 Nov 2026 15:00:00 GMT\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nab\ncd",
		"HTTP/1.1 404 Not Found\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: 17\r\n\r\n{\"error\":\"boom\"}\n",
		"HTTP/1.1 500\r\ncontent-length: 0\r\nconnection: Keep-Alive\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length:  +5 \r\n\r\n",
		"HTTP/1.1 200 OK\r\n Folded: x\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: a\x7fb\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close, upgrade\r\n\r\n",
	}
}

func TestParseHeadAgreesWithNetHTTP(t *testing.T) {
	accepted := 0
	for _, raw := range headSeeds() {
		if _, _, ok := parseHead([]byte(raw)); ok {
			accepted++
		}
		checkParseHead(t, []byte(raw))
	}
	if accepted < 4 {
		t.Fatalf("parseHead accepted %d of the plain heads", accepted)
	}
}

func FuzzParseHead(f *testing.F) {
	for _, raw := range headSeeds() {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkParseHead(t, raw)
	})
}

// A head that is not whole in the buffer, or not plain, is read by
// net/http: the answer reads the same either way.
func TestReadHeadFallsBack(t *testing.T) {
	for _, raw := range append(headSeeds(), loopBodySeeds()...) {
		for _, src := range []func(io.Reader) io.Reader{func(r io.Reader) io.Reader { return r }, iotest.OneByteReader} {
			want, wantErr := http.ReadResponse(bufio.NewReaderSize(bytes.NewReader([]byte(raw)), loopReadBufferSize), nil)
			got, err := readHead(bufio.NewReaderSize(src(bytes.NewReader([]byte(raw))), loopReadBufferSize))
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("readHead err %v, net/http's %v:\n%q", err, wantErr, raw)
			}
			if err == nil && (got.StatusCode != want.StatusCode || got.Close != want.Close || got.ContentLength != want.ContentLength) {
				t.Fatalf("readHead %d close=%v cl=%d; net/http %d close=%v cl=%d:\n%q", got.StatusCode, got.Close, got.ContentLength, want.StatusCode, want.Close, want.ContentLength, raw)
			}
		}
	}
}

// bufStart names where a Reader reads to: after the bytes are consumed and
// more come, they are at that address again (the slide a polled stream's
// hot lines count on).
func TestBufStart(t *testing.T) {
	pr, pw := io.Pipe()
	br := bufio.NewReaderSize(pr, loopReadBufferSize)
	start := bufStart(br)
	if start == nil {
		t.Fatal("no start")
	}
	go func() {
		pw.Write([]byte("first line\n"))
		pw.Write([]byte("second\n"))
		pw.Close()
	}()
	for _, want := range []string{"first line\n", "second\n"} {
		b, err := br.Peek(len(want))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != want || unsafe.Pointer(unsafe.SliceData(b)) != start {
			t.Fatalf("%q read to %p, want %q at the buffer's start %p", b, unsafe.SliceData(b), want, start)
		}
		br.Discard(len(b))
	}
}
