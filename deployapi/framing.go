package deployapi

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// ambiguousFraming reports a request that came with both Transfer-Encoding
// and Content-Length. fasthttp reads such a body by Transfer-Encoding (as
// RFC 9112 §6.1 says) but keeps the connection open; a proxy in front that
// framed it by Content-Length would then see a different next request, so
// the request is refused and the connection closed. fasthttp drops the
// Content-Length it parsed, so the raw header block tells; it is only
// scanned for chunked requests, which are rare here.
func ambiguousFraming(h *fasthttp.RequestHeader) bool {
	if h.ContentLength() != -1 {
		return false
	}
	for line := range bytes.SplitSeq(h.RawHeaders(), []byte("\n")) {
		name, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(name), []byte("Content-Length")) {
			return true
		}
	}
	return false
}
