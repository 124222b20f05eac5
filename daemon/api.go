package daemon

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/openai"
	"github.com/hearthd/hearth/runtime"
)

// Keys is what the deployment API needs from the API key ring.
type Keys interface {
	Authenticate(header []byte) (apikeys.Key, error)
	RecordUsage(id string, requests, promptTokens, completionTokens int64)
}

// APIConfig is the part of Config the deployment API itself uses.
type APIConfig struct {
	Model             string
	Version           string
	MaxConcurrent     int
	MaxQueue          int
	MaxBodyBytes      int
	WriteStallTimeout time.Duration
}

// API is the fasthttp deployment API: /api/v1 plus /healthz and /readyz.
type API struct {
	cfg         APIConfig
	rt          runtime.Runtime
	keys        Keys
	m           *metrics.Node
	log         *slog.Logger
	lim         *limiter
	created     int64 // the model's `created` in /models
	fingerprint string

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
func NewAPI(cfg APIConfig, rt runtime.Runtime, keys Keys, m *metrics.Node, log *slog.Logger) *API {
	base, cancel := context.WithCancel(context.Background())
	sum := sha256.Sum256([]byte(cfg.Model + "\x00" + cfg.Version))
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	a := &API{
		cfg:         cfg,
		rt:          rt,
		keys:        keys,
		m:           m,
		log:         log,
		lim:         newLimiter(cfg.MaxConcurrent, cfg.MaxQueue),
		created:     time.Now().Unix(),
		fingerprint: "fp_" + hex.EncodeToString(sum[:5]),
		base:        base,
		cancelBase:  cancel,
		reqPrefix:   "req_" + hex.EncodeToString(rnd[:]),
	}
	a.bufs.New = func() any { b := make([]byte, 0, 4096); return &b }
	m.RegisterQueueDepth(a.lim.queued)
	return a
}

// SetWarm marks the model loaded (or not); until then chat answers 503 and
// /readyz is false.
func (a *API) SetWarm(v bool) { a.warm.Store(v) }

// healthy reports whether the deployment can serve: the model is loaded and
// the runtime answers. The node agent reports it to the control plane.
func (a *API) healthy(ctx context.Context) error {
	if !a.warm.Load() {
		return errors.New("model is loading")
	}
	return a.rt.Ready(ctx)
}

// Server returns a fasthttp server for this API with the given limits.
func (a *API) Server(readTimeout, idleTimeout time.Duration) *fasthttp.Server {
	return &fasthttp.Server{
		Handler:            a.Handle,
		ErrorHandler:       a.handleTransportError,
		Name:               "hearthd",
		MaxRequestBodySize: a.cfg.MaxBodyBytes,
		ReadTimeout:        readTimeout,
		IdleTimeout:        idleTimeout,
		// WriteTimeout stays 0: fasthttp would apply it to the whole
		// response, cutting long streams. Stalled readers are bounded per
		// write instead (WriteStallTimeout).
		ReadBufferSize:               8192,
		NoDefaultServerHeader:        false,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		Logger:                       slogPrinter{a.log},
	}
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

// Close ends every generation at once.
func (a *API) Close() { a.cancelBase() }

const apiPrefix = "/api/v1"

// Handle routes one request.
func (a *API) Handle(ctx *fasthttp.RequestCtx) {
	path := ctx.Path()
	method := ctx.Method()
	ctx.Response.Header.Set("X-Request-Id", a.nextRequestID())
	route := metrics.RouteOther
	switch {
	case string(path) == apiPrefix+"/chat/completions":
		route = metrics.RouteChatCompletions
		if !bytes.Equal(method, []byte("POST")) {
			a.writeError(ctx, openai.MethodNotAllowed(string(method), string(path)))
			break
		}
		a.handleChat(ctx)
	case string(path) == apiPrefix+"/models":
		route = metrics.RouteModels
		if !isGet(method) {
			a.writeError(ctx, openai.MethodNotAllowed(string(method), string(path)))
			break
		}
		a.handleModels(ctx, "")
	case bytes.HasPrefix(path, []byte(apiPrefix+"/models/")):
		route = metrics.RouteModel
		if !isGet(method) {
			a.writeError(ctx, openai.MethodNotAllowed(string(method), string(path)))
			break
		}
		a.handleModels(ctx, string(path[len(apiPrefix+"/models/"):]))
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
}

func isGet(m []byte) bool { return string(m) == "GET" || string(m) == "HEAD" }

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
	return key, true
}

func (a *API) handleModels(ctx *fasthttp.RequestCtx, id string) {
	if _, ok := a.authenticate(ctx); !ok {
		return
	}
	bp := a.bufs.Get().(*[]byte)
	defer a.bufs.Put(bp)
	if id == "" {
		*bp = openai.AppendModelList((*bp)[:0], a.cfg.Model, a.created, "hearth")
	} else {
		if id != a.cfg.Model {
			a.writeError(ctx, openai.ModelNotFound(id))
			return
		}
		*bp = openai.AppendModel((*bp)[:0], a.cfg.Model, a.created, "hearth")
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
	if err := a.rt.Ready(rctx); err != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		b := []byte(`{"ready":false,"reason":`)
		b = strconv.AppendQuote(b, "model runtime: "+err.Error())
		ctx.SetBody(append(b, '}'))
		return
	}
	ctx.SetBodyString(`{"ready":true}`)
}

// handleTransportError answers requests fasthttp could not read: bodies over
// the limit, oversized headers, malformed HTTP, read timeouts.
func (a *API) handleTransportError(ctx *fasthttp.RequestCtx, err error) {
	var e *openai.Error
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		e = openai.RequestTooLarge(int64(a.cfg.MaxBodyBytes))
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
	p.l.Debug("fasthttp", "msg", fmt.Sprintf(format, args...))
}
