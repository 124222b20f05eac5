package console

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// handlerTransport delivers the console client's requests to the
// management API's handler in process: the same authentication, checks and
// rate limits as over the network, without a connection to the control
// plane's own listener (whose address, TLS and socket activation the
// console need not know). The API's answers are small JSON documents, so
// each is buffered whole.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	in := req.Clone(req.Context())
	if in.Body == nil {
		in.Body = http.NoBody
	}
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "console"
	in.Host = req.URL.Host
	w := &bufferedResponse{header: http.Header{}}
	t.h.ServeHTTP(w, in)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return &http.Response{Status: strconv.Itoa(w.status) + " " + http.StatusText(w.status), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: w.header, Request: req,
		Body: io.NopCloser(bytes.NewReader(w.body.Bytes())), ContentLength: int64(w.body.Len())}, nil
}

// bufferedResponse is the http.ResponseWriter handlerTransport gives the
// handler.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *bufferedResponse) Header() http.Header { return w.header }

func (w *bufferedResponse) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}

func (w *bufferedResponse) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
