package deployapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/certreload"
	"github.com/hearthd/hearth/internal/certreload/certtest"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/metrics"
)

func discardLog() *slog.Logger { return slog.New(slog.DiscardHandler) }

// gatedRuntime holds its first stream after `after` events until open is
// closed, so a test decides when that generation may go on (a negative
// after never holds). Every stream is announced on started.
type gatedRuntime struct {
	*fake.Runtime
	after   int
	open    chan struct{}
	started chan *fake.StreamInfo
	calls   atomic.Int64
}

func (g *gatedRuntime) Chat(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	s, err := g.Runtime.Chat(ctx, req)
	if err != nil {
		return nil, err
	}
	select {
	case g.started <- g.LastStream():
	default:
	}
	left := -1
	if g.calls.Add(1) == 1 {
		left = g.after
	}
	return &gatedStream{Stream: s, ctx: ctx, left: left, open: g.open}, nil
}

type gatedStream struct {
	llm.Stream
	ctx  context.Context
	left int
	open <-chan struct{}
}

func (s *gatedStream) Recv() (llm.Event, error) {
	if s.left == 0 {
		select {
		case <-s.open:
		case <-s.ctx.Done():
		}
	}
	s.left--
	return s.Stream.Recv()
}

// tlsAPI is the deployment API over HTTPS with a reloading certificate.
// Renewals are picked up by calling reloader.Reload, so that the tests say
// when; Run's polling is tested in internal/certreload.
type tlsAPI struct {
	url      string
	rt       *gatedRuntime
	secret   string
	reloader *certreload.Reloader
	ca       *certtest.CA
	files    *certtest.Dir
}

func startTLSAPI(t *testing.T, fc fake.Config, gateAfter int) *tlsAPI {
	t.Helper()
	ca := certtest.NewCA(t)
	files := certtest.NewDir(t)
	c, k := ca.Issue(t, 1, time.Now().Add(24*time.Hour))
	files.Renew(t, c, k)
	r, err := certreload.New(files.Cert(), files.Key(), discardLog())
	if err != nil {
		t.Fatal(err)
	}
	rt := &gatedRuntime{Runtime: fake.New(fc), after: gateAfter, open: make(chan struct{}), started: make(chan *fake.StreamInfo, 16)}
	keys := apikeys.NewStatic()
	secret, _ := keys.Add("test")
	api := NewAPI(APIConfig{
		Model: testModel, Version: "test", MaxConcurrent: 8, MaxQueue: 8,
		MaxBodyBytes: 64 << 10, WriteStallTimeout: 5 * time.Second,
	}, rt, keys, metrics.NewNode("test"), discardLog())
	api.SetWarm(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := api.Server(30*time.Second, 30*time.Second)
	go func() { _ = srv.Serve(Listener(tls.NewListener(ln, TLSConfig(r)))) }()
	t.Cleanup(func() {
		api.Close()
		_ = srv.Shutdown()
	})
	return &tlsAPI{
		url: "https://" + ln.Addr().String() + "/api/v1", rt: rt, secret: secret,
		reloader: r, ca: ca, files: files,
	}
}

// connRecorder is an http.RoundTripper noting, per request, the server
// certificate's serial and whether the connection was reused.
type connRecorder struct {
	base *http.Transport
	mu   sync.Mutex
	seen []connSeen
}

type connSeen struct {
	serial int64
	reused bool
}

func newConnRecorder(pool *x509.CertPool) *connRecorder {
	return &connRecorder{base: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: pool},
		MaxIdleConnsPerHost: 1,
	}}
}

func (c *connRecorder) RoundTrip(req *http.Request) (*http.Response, error) {
	var reused bool
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	resp, err := c.base.RoundTrip(req.WithContext(httptrace.WithClientTrace(req.Context(), trace)))
	if err != nil {
		return nil, err
	}
	s := connSeen{serial: -1, reused: reused}
	if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
		s.serial = resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	c.mu.Lock()
	c.seen = append(c.seen, s)
	c.mu.Unlock()
	return resp, nil
}

func (c *connRecorder) last(t *testing.T) connSeen {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.seen) == 0 {
		t.Fatal("no request recorded")
	}
	return c.seen[len(c.seen)-1]
}

func (ta *tlsAPI) client(rec *connRecorder) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(ta.url),
		option.WithAPIKey(ta.secret),
		option.WithHTTPClient(&http.Client{Transport: rec}),
		option.WithMaxRetries(0),
	)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    testModel,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
}

// newConnSerial makes one request on a fresh connection and returns the
// serial of the certificate it was served.
func (ta *tlsAPI) newConnSerial(t *testing.T) int64 {
	t.Helper()
	rec := newConnRecorder(ta.ca.Pool)
	defer rec.base.CloseIdleConnections()
	c := ta.client(rec)
	if _, err := c.Models.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	s := rec.last(t)
	if s.reused {
		t.Fatal("fresh client reused a connection")
	}
	return s.serial
}

// reload picks up the files now and wants a new certificate served (or,
// with want false, the current one kept).
func (ta *tlsAPI) reload(t *testing.T, want bool) {
	t.Helper()
	changed, err := ta.reloader.Reload()
	if changed != want {
		t.Fatalf("Reload: changed %v (err %v), want %v", changed, err, want)
	}
}

func TestTLSServesAndRenews(t *testing.T) {
	// The first generation holds after three tokens until the test opens
	// the gate: the stream below is in flight across the renewal for
	// certain.
	const tokens = 150
	ta := startTLSAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: tokens}, 3)
	ctx := context.Background()

	// A second client opens a stream and reads its first tokens...
	recStream := newConnRecorder(ta.ca.Pool)
	defer recStream.base.CloseIdleConnections()
	cs := ta.client(recStream)
	stream := cs.Chat.Completions.NewStreaming(ctx, chatParams())
	var content strings.Builder
	for content.Len() < 3 && stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			content.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if s := recStream.last(t); s.serial != 1 {
		t.Fatalf("stream connection: %+v", s)
	}

	// A chat completion over HTTPS with the SDK, trusting only the test CA.
	rec := newConnRecorder(ta.ca.Pool)
	defer rec.base.CloseIdleConnections()
	c := ta.client(rec)
	resp, err := c.Chat.Completions.New(ctx, chatParams())
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Choices[0].Message.Content; got != strings.Repeat("x", tokens) {
		t.Fatalf("content %q", got)
	}
	if s := rec.last(t); s.serial != 1 || s.reused {
		t.Fatalf("first request: %+v", s)
	}
	// TLS only: the same port refuses plain HTTP.
	plain := strings.Replace(ta.url, "https://", "http://", 1) + "/models"
	if r, err := http.Get(plain); err == nil {
		r.Body.Close()
		if r.StatusCode < 400 {
			t.Fatalf("plain HTTP answered %d", r.StatusCode)
		}
	}
	if len(ta.rt.Streams()) != 2 || ta.rt.Streams()[0].Finished() {
		t.Fatal("the first stream is not held open")
	}

	// ...renewal to the same paths: new connections get the new
	// certificate at once.
	c2, k2 := ta.ca.Issue(t, 2, time.Now().Add(48*time.Hour))
	ta.files.Renew(t, c2, k2)
	ta.reload(t, true)
	if got := ta.newConnSerial(t); got != 2 {
		t.Fatalf("new connection after renewal: serial %d", got)
	}

	// The stream opened before the renewal runs to its end.
	close(ta.rt.open)
	for stream.Next() {
		if ch := stream.Current(); len(ch.Choices) > 0 {
			content.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("stream across renewal: %v", err)
	}
	stream.Close()
	if content.String() != strings.Repeat("x", tokens) {
		t.Fatalf("stream content %q", content.String())
	}
	// The stream's connection (written on directly, hijack.go) serves the
	// client's next request, in its TLS session.
	if _, err := cs.Models.List(ctx); err != nil {
		t.Fatal(err)
	}
	if s := recStream.last(t); s.serial != 1 || !s.reused {
		t.Fatalf("the stream's connection after it: %+v", s)
	}
	// ...and the idle keep-alive connection still serves, in its session.
	if _, err := c.Chat.Completions.New(ctx, chatParams()); err != nil {
		t.Fatal(err)
	}
	if s := rec.last(t); s.serial != 1 || !s.reused {
		t.Fatalf("keep-alive connection after renewal: %+v", s)
	}
	if got := ta.reloader.Certificate().SerialNumber.Int64(); got != 2 || ta.reloader.Reloads() != 1 {
		t.Fatalf("reloader serves serial %d after %d reloads", got, ta.reloader.Reloads())
	}

	// A broken renewal keeps the current certificate serving.
	if err := os.WriteFile(ta.files.Cert(), []byte("-----BEGIN CERTIFICATE-----\ngarbage\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ta.reload(t, false)
	if got := ta.newConnSerial(t); got != 2 || ta.reloader.Failures() != 1 {
		t.Fatalf("after a broken renewal new connections get serial %d (%d failures)", got, ta.reloader.Failures())
	}
	// A later good renewal is picked up again.
	c3, k3 := ta.ca.Issue(t, 3, time.Now().Add(72*time.Hour))
	ta.files.Renew(t, c3, k3)
	ta.reload(t, true)
	if got := ta.newConnSerial(t); got != 3 {
		t.Fatalf("recovery after a broken renewal: serial %d", got)
	}
}

// The deployment API offers HTTP/1.1 only over ALPN: fasthttp speaks
// nothing else; and TLS 1.2 only with AEAD cipher suites.
func TestTLSConfigOffersHTTP11(t *testing.T) {
	ta := startTLSAPI(t, fake.Config{}, -1)
	host := strings.TrimSuffix(strings.TrimPrefix(ta.url, "https://"), "/api/v1")
	conn, err := tls.Dial("tcp", host, &tls.Config{RootCAs: ta.ca.Pool, NextProtos: []string{"h2", "http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if p := conn.ConnectionState().NegotiatedProtocol; p != "http/1.1" {
		t.Fatalf("ALPN chose %q", p)
	}
	if v := TLSConfig(ta.reloader).MinVersion; v != tls.VersionTLS12 {
		t.Fatalf("min version %x", v)
	}
	certtest.RequireAEADOnly(t, host, ta.ca.Pool)
}

// A client that leaves an HTTPS request before the first token cancels the
// generation, as over plain HTTP: its TLS close_notify alert arrives ahead
// of the FIN and must not be taken for a pipelined request.
func TestTLSDisconnectBeforeFirstToken(t *testing.T) {
	ta := startTLSAPI(t, fake.Config{FirstTokenDelay: slowToken}, -1)
	host := strings.TrimSuffix(strings.TrimPrefix(ta.url, "https://"), "/api/v1")
	conn, err := tls.Dial("tcp", host, &tls.Config{RootCAs: ta.ca.Pool})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	if _, err := io.WriteString(conn, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+ta.secret+
		"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	leave(t, conn, <-ta.rt.started)
}

// Over TLS too, requests pipelined behind a stream are answered after it,
// in order: what fasthttp buffered and what the TLS connection decrypted
// ahead both reach the next request (keepAlive reads them out without
// waiting on the socket).
func TestTLSPipelinedRequestsAfterAStream(t *testing.T) {
	ta := startTLSAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 3}, -1)
	host := strings.TrimSuffix(strings.TrimPrefix(ta.url, "https://"), "/api/v1")
	conn, err := tls.Dial("tcp", host, &tls.Config{RootCAs: ta.ca.Pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	body := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	stream := "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + ta.secret +
		"\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	pipelineStreamsAndModels(t, conn, bufio.NewReader(conn), stream, ta.secret)
}
