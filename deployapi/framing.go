package deployapi

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// A request that comes with both Transfer-Encoding and Content-Length is
// read by fasthttp by Transfer-Encoding (as RFC 9112 §6.1 says), and the
// connection would stay open; a proxy in front that framed it by
// Content-Length would then see a different next request. Such a request
// is refused, whatever its key, and the connection closed: headerReceived
// marks it before the key is looked at or the body read (refuseFraming),
// and Handle answers it before anything else (framingRefused).

// ambiguousFraming reports a request whose headers carry both framings. It
// runs on the headers alone, where fasthttp reports every chunked request
// as Content-Length -1 and has dropped the Content-Length it parsed, so the
// raw header block tells; it is only scanned for chunked requests, which
// are rare here.
func ambiguousFraming(h *fasthttp.RequestHeader) bool {
	return h.ContentLength() == -1 && rawHeader(h, "Content-Length")
}

// refuseFraming makes fasthttp read no body for h and close the connection
// after the answer, so nothing that follows on the connection is read as a
// request.
func refuseFraming(h *fasthttp.RequestHeader) {
	h.SetContentLength(0)
	h.SetConnectionClose()
}

// framingRefused reports a request refuseFraming marked: one that asks for
// the connection to close (rare) is scanned for both framing headers.
func framingRefused(h *fasthttp.RequestHeader) bool {
	return h.ConnectionClose() && rawHeader(h, "Content-Length") && rawHeader(h, "Transfer-Encoding")
}

// rawHeader reports whether the header block as received names the header.
func rawHeader(h *fasthttp.RequestHeader, name string) bool {
	for line := range bytes.SplitSeq(h.RawHeaders(), []byte("\n")) {
		key, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(key), []byte(name)) {
			return true
		}
	}
	return false
}
