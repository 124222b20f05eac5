// Package deployapi is the deployment API: the fasthttp server in front of
// the model runtime (OpenAI-compatible /api/v1 plus /healthz and /readyz),
// with API key auth, admission, the SSE relay and the drain on shutdown.
package deployapi

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
)

// Keys is what the deployment API needs from the API key ring.
type Keys = apikeys.Authenticator

// APIConfig is the part of Config the deployment API itself uses.
type APIConfig struct {
	// Model is the model served at first (Switch changes it).
	Model         string
	Version       string
	MaxConcurrent int
	// MaxConcurrentPerKey caps one API key's generations at once; 0 (or
	// more than MaxConcurrent) is MaxConcurrent.
	MaxConcurrentPerKey int
	MaxQueue            int
	// MaxBodyBytes bounds a request body (413 above it); 0 derives it from
	// the served model's context length (limits.go).
	MaxBodyBytes int
	// MaxOutputTokens caps max_tokens (400 above it) and the output of a
	// request that names none; 0 is the model's context length.
	MaxOutputTokens int
	// NoReasoning asks a reasoning model never to think, and refuses
	// reasoning_effort other than "none" (limits.go).
	NoReasoning       bool
	WriteStallTimeout time.Duration
	// SwitchWait is how long a chat request waits for a model switch to
	// end before it gets 503 with Retry-After. Default 10 s.
	SwitchWait time.Duration
	// CORS is which browser pages' origins may call the API (none by
	// default).
	CORS CORSPolicy
	// Sealer seals the reasoning the Responses API hands back in
	// encrypted_content (a key of the node's, internal/sealbox); nil:
	// encrypted reasoning is refused.
	Sealer openai.Sealer
}

// DefaultSwitchWait is APIConfig.SwitchWait's default.
const DefaultSwitchWait = 10 * time.Second

// API is the fasthttp deployment API: /api/v1 plus /healthz and /readyz.
type API struct {
	cfg  APIConfig
	keys Keys
	m    *metrics.Node
	log  *slog.Logger
	lim  *limiter
	gate gate // the served model and its switches

	// base is the parent of every generation's context; cancelling it ends
	// all generations (the hard stop after the drain timeout).
	base       context.Context
	cancelBase context.CancelFunc

	warm     atomic.Bool // the model is loaded; set once start-up finishes
	draining atomic.Bool
	inflight sync.WaitGroup

	reqPrefix string
	reqSeq    atomic.Uint64
	bufs      sync.Pool
}

// NewAPI builds the deployment API over a runtime and a key ring, observing
// into m.
func NewAPI(cfg APIConfig, rt llm.Runtime, keys Keys, m *metrics.Node, log *slog.Logger) *API {
	base, cancel := context.WithCancel(context.Background())
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	if cfg.SwitchWait <= 0 {
		cfg.SwitchWait = DefaultSwitchWait
	}
	a := &API{
		cfg:        cfg,
		keys:       keys,
		m:          m,
		log:        log,
		lim:        newLimiter(cfg.MaxConcurrent, cfg.MaxConcurrentPerKey, cfg.MaxQueue),
		base:       base,
		cancelBase: cancel,
		reqPrefix:  "req_" + hex.EncodeToString(rnd[:]),
	}
	a.gate.cur.Store(a.newServed(cfg.Model, rt))
	a.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	m.RegisterQueueDepth(a.lim.queued)
	return a
}

// SetWarm marks the model loaded (or not); until then chat answers 503 and
// /readyz is false.
func (a *API) SetWarm(v bool) {
	if s := a.gate.cur.Load(); v && s != nil {
		s.limits(s.ctx) // known before the first request, as after a Switch
	}
	a.warm.Store(v)
}

// Warm reports whether a model has been loaded (SetWarm, or a Switch).
func (a *API) Warm() bool { return a.warm.Load() }

// Healthy reports whether the deployment can serve: the model is loaded and
// the runtime answers. The node agent reports it to the control plane.
func (a *API) Healthy(ctx context.Context) error {
	if !a.warm.Load() {
		return errors.New("model is loading")
	}
	return a.gate.cur.Load().rt.Ready(ctx)
}

// Server returns a fasthttp server for this API with the given limits.
func (a *API) Server(readTimeout, idleTimeout time.Duration) *fasthttp.Server {
	s := &fasthttp.Server{
		Handler:            a.Handle,
		HeaderReceived:     a.headerReceived,
		ErrorHandler:       a.handleTransportError,
		Name:               "hearthd",
		MaxRequestBodySize: a.serverBodyLimit(), // per request: headerReceived
		ReadTimeout:        readTimeout,
		IdleTimeout:        idleTimeout,
		// WriteTimeout stays 0: fasthttp would apply it to the whole
		// response, cutting long streams. Stalled readers are bounded per
		// write instead (WriteStallTimeout).
		ReadBufferSize:  readBufferSize,
		WriteBufferSize: writeBufferSize,
		// The read buffer goes back to a pool once a request is read
		// (unless a pipelined one follows it), and an idle keep-alive
		// connection holds no buffers: a stream, which may last minutes,
		// holds only its write buffer.
		ReduceMemoryUsage:            true,
		NoDefaultServerHeader:        false,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       slogPrinter{a.log},
		// fasthttp's connection errors would otherwise quote the request,
		// Authorization header included.
		SecureErrorLogMessage: true,
	}
	return s
}

// Drain makes new requests fail with 503 and waits until in-flight ones
// finish or ctx ends; then it cancels whatever is still generating.
func (a *API) Drain(ctx context.Context) error {
	a.draining.Store(true)
	done := make(chan struct{})
	go func() { a.inflight.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		a.cancelBase()
		<-done
		return ctx.Err()
	}
}

// Shutdown takes the API out of service: /readyz turns false and new
// requests get 503 at once, the listener closes, and in-flight generations
// have up to timeout to finish before they are ended. It returns once srv
// has stopped.
func (a *API) Shutdown(srv *fasthttp.Server, timeout time.Duration) {
	drainCtx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	shutdownDone := make(chan error, 1)
	go func() {
		// Open connections close as their responses end; the margin lets
		// the streams ended at the drain timeout write their last event.
		sctx, c := context.WithTimeout(context.Background(), timeout+5*time.Second)
		defer c()
		shutdownDone <- srv.ShutdownWithContext(sctx)
	}()
	if err := a.Drain(drainCtx); err != nil {
		a.log.Warn("drain timed out: ended remaining generations", "err", err)
	}
	if err := <-shutdownDone; err != nil && !errors.Is(err, context.Canceled) {
		a.log.Warn("listener shutdown", "err", err)
	}
}

// Close ends every generation at once.
func (a *API) Close() {
	a.cancelBase()
}

const APIPrefix = "/api/v1"

// Handle routes one request.
func (a *API) Handle(ctx *fasthttp.RequestCtx) {
	start := time.Now()
	route := metrics.RouteOther
	defer a.recoverHandler(ctx, &route)
	path := ctx.Path()
	method := ctx.Method()
	ctx.Response.Header.Set("X-Request-Id", a.nextRequestID())
	a.cors(ctx)
	if framingRefused(&ctx.Request.Header) {
		// Its body was never read: discarded before the answer, so that
		// the close does not reset the connection under it.
		drainRefusedBody(ctx)
		a.writeError(ctx, openai.InvalidRequest("", "Request has both Content-Length and Transfer-Encoding."))
		ctx.SetConnectionClose()
		a.m.Request(route, ctx.Response.StatusCode())
		return
	}
	switch {
	case string(path) == APIPrefix+"/chat/completions":
		route = metrics.RouteChatCompletions
		if !a.methodAllowed(ctx, "POST") {
			break
		}
		a.handleChat(ctx)
	case string(path) == APIPrefix+"/responses":
		route = metrics.RouteResponses
		if !a.methodAllowed(ctx, "POST") {
			break
		}
		a.handleResponses(ctx)
	case string(path) == APIPrefix+"/embeddings":
		route = metrics.RouteEmbeddings
		if !a.methodAllowed(ctx, "POST") {
			break
		}
		a.handleEmbeddings(ctx)
	case string(path) == APIPrefix+"/completions":
		route = metrics.RouteCompletions
		if !a.methodAllowed(ctx, "POST") {
			break
		}
		a.handleCompletions(ctx)
	case string(path) == APIPrefix+"/models":
		route = metrics.RouteModels
		if !a.methodAllowed(ctx, "GET, HEAD") {
			break
		}
		a.handleModels(ctx, "")
	case bytes.HasPrefix(path, []byte(APIPrefix+"/models/")):
		route = metrics.RouteModels
		if !a.methodAllowed(ctx, "GET, HEAD") {
			break
		}
		a.handleModels(ctx, string(path[len(APIPrefix+"/models/"):]))
	case string(path) == "/healthz":
		route = metrics.RouteHealthz
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	case string(path) == "/readyz":
		route = metrics.RouteReadyz
		a.handleReady(ctx)
	default:
		a.writeError(ctx, openai.NotFound(string(method), string(path)))
	}
	a.m.Request(route, ctx.Response.StatusCode())
	if !ctx.Response.IsBodyStream() {
		// A stream's duration is observed at its end (completion.observe).
		a.m.ObserveRequest(route, a.Model(), time.Since(start))
	}
	a.noteFailure(ctx)
}

func isGet(m []byte) bool { return string(m) == "GET" || string(m) == "HEAD" }

// methodAllowed reports whether the request may go on to its route's
// handler, which takes methods ("POST", or "GET, HEAD"). Otherwise it has
// answered it: a CORS preflight when browsers may call the API, else 405.
func (a *API) methodAllowed(ctx *fasthttp.RequestCtx, methods string) bool {
	m := ctx.Method()
	if methods == "POST" && string(m) == "POST" || methods != "POST" && isGet(m) {
		return true
	}
	if a.cfg.CORS.Enabled() && isPreflight(ctx) {
		a.preflight(ctx, methods)
		return false
	}
	a.writeError(ctx, openai.MethodNotAllowed(string(m), string(ctx.Path())))
	return false
}

func (a *API) authenticate(ctx *fasthttp.RequestCtx) (apikeys.Key, bool) {
	key, err := a.keys.Authenticate(ctx.Request.Header.Peek("Authorization"))
	if err != nil {
		// The reason is safe to log; the token never is.
		reason := apikeys.Reason(err)
		a.m.AuthFailure(reason)
		a.log.Debug("rejected API key", "reason", reason, "remote", ctx.RemoteIP().String())
		a.writeError(ctx, openai.InvalidAPIKey())
		return apikeys.Key{}, false
	}
	noteKey(ctx, key.ID)
	return key, true
}

func (a *API) handleModels(ctx *fasthttp.RequestCtx, id string) {
	if _, ok := a.authenticate(ctx); !ok {
		return
	}
	bp := a.bufs.Get().(*[]byte)
	defer a.bufs.Put(bp)
	s := a.gate.cur.Load()
	l := s.knownLimits()
	info := openai.ModelInfo{ContextLength: l.ContextLength, Capabilities: l.Capabilities}
	if id == "" {
		*bp = openai.AppendModelList((*bp)[:0], s.model, s.created, "hearth", info)
	} else {
		if id != s.model {
			a.writeError(ctx, openai.ModelNotFound(id))
			return
		}
		*bp = openai.AppendModel((*bp)[:0], s.model, s.created, "hearth", info)
	}
	ctx.SetContentType("application/json")
	ctx.SetBody(*bp)
}

func (a *API) handleReady(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("application/json")
	if a.draining.Load() {
		// Out of the load balancer's pool at once while in-flight streams
		// finish.
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"ready":false,"reason":"shutting down"}`)
		return
	}
	if !a.warm.Load() {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString(`{"ready":false,"reason":"model is loading"}`)
		return
	}
	rctx, cancel := context.WithTimeout(a.base, 2*time.Second)
	defer cancel()
	if err := a.gate.cur.Load().rt.Ready(rctx); err != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		b := []byte(`{"ready":false,"reason":`)
		b = openai.AppendJSONString(b, "model runtime: "+err.Error())
		ctx.SetBody(append(b, '}'))
		return
	}
	ctx.SetBodyString(`{"ready":true}`)
}

// headerReceived runs once a request's headers are in, before its body is
// read. A request with ambiguous framing is marked to be refused, whatever
// its key. A request to the API whose key does not authenticate is allowed
// a body of one byte, so a bad key never makes hearthd buffer a large body;
// the read stops at once and handleTransportError answers 401. (A valid key
// is looked up again by the handler: a hash and a map read.)
func (a *API) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if ambiguousFraming(h) {
		// Before the key: refused whatever it is (framing.go).
		refuseFraming(h)
		return fasthttp.RequestConfig{}
	}
	if h.ContentLength() == 0 || !bytes.HasPrefix(h.RequestURI(), []byte(APIPrefix)) {
		return fasthttp.RequestConfig{}
	}
	if _, err := a.keys.Authenticate(h.Peek("Authorization")); err != nil {
		return fasthttp.RequestConfig{MaxRequestBodySize: unauthenticatedBodyBytes}
	}
	return fasthttp.RequestConfig{MaxRequestBodySize: a.bodyLimit()}
}

// serverBodyLimit is fasthttp's limit, above every per-request one.
func (a *API) serverBodyLimit() int {
	if a.cfg.MaxBodyBytes > 0 {
		return a.cfg.MaxBodyBytes
	}
	return maxBodyCeiling
}

// unauthenticatedBodyBytes is the body a request with a bad key may send.
const unauthenticatedBodyBytes = 1

// bodyless reports whether h was refused its body by headerReceived.
func bodyless(h *fasthttp.RequestHeader) bool {
	return bytes.HasPrefix(h.RequestURI(), []byte(APIPrefix)) && h.ContentLength() != 0
}

// handleTransportError answers requests fasthttp could not read: bodies over
// the limit, oversized headers, malformed HTTP, read timeouts.
func (a *API) handleTransportError(ctx *fasthttp.RequestCtx, err error) {
	a.cors(ctx) // the page may read why
	var e *openai.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge) && bodyless(&ctx.Request.Header):
		// Refused by headerReceived: the key is checked before the body.
		if _, ok := a.authenticate(ctx); !ok {
			drainRefusedBody(ctx)
			ctx.SetConnectionClose()
			a.m.Request(metrics.RouteOther, ctx.Response.StatusCode())
			return
		}
		drainRefusedBody(ctx)
		e = openai.RequestTooLarge(int64(a.bodyLimit()))
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		drainRefusedBody(ctx)
		e = openai.RequestTooLarge(int64(a.bodyLimit()))
	case isTimeout(err):
		e = &openai.Error{Status: fasthttp.StatusRequestTimeout, Message: "Request not received in time.", Type: openai.TypeInvalidRequest, Code: "request_timeout"}
	case errors.Is(err, fasthttp.ErrSmallReadBuffer) || strings.Contains(err.Error(), "small read buffer"):
		e = &openai.Error{Status: fasthttp.StatusRequestHeaderFieldsTooLarge, Message: "Request headers too large.", Type: openai.TypeInvalidRequest, Code: "headers_too_large"}
	default:
		e = openai.InvalidRequest("", "Malformed HTTP request.")
	}
	a.writeError(ctx, e)
	ctx.SetConnectionClose()
	a.m.Request(metrics.RouteOther, e.Status)
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

func (a *API) writeError(ctx *fasthttp.RequestCtx, e *openai.Error) {
	ctx.SetStatusCode(e.Status)
	ctx.SetContentType("application/json")
	if e.Status == fasthttp.StatusTooManyRequests || e.Status == fasthttp.StatusServiceUnavailable {
		ctx.Response.Header.Set("Retry-After", "1")
	}
	ctx.SetBody(openai.AppendErrorJSON(nil, e))
}

func (a *API) nextRequestID() string {
	var b [40]byte
	out := append(b[:0], a.reqPrefix...)
	out = append(out, '_')
	out = strconv.AppendUint(out, a.reqSeq.Add(1), 36)
	return string(out)
}

// slogPrinter adapts fasthttp's Printf logger to slog.
type slogPrinter struct{ l *slog.Logger }

func (p slogPrinter) Printf(format string, args ...any) {
	p.l.Debug("fasthttp", "msg", redactSecrets(fmt.Sprintf(format, args...)))
}

// secretPattern matches what must never reach a log: API keys and any
// bearer credential.
var secretPattern = regexp.MustCompile(`(?i)(hearth_live_|bearer\s+)[^\s"\\]+`)

// redactSecrets replaces credentials in a library's log line; hearth's own
// log lines never carry one.
func redactSecrets(s string) string {
	return secretPattern.ReplaceAllString(s, "${1}[redacted]")
}
