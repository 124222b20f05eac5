// Package client is the Go client of hearth's management API (/v1, see
// control/README.md and control/openapi.json): servers, SSH keys, firewall
// rules and deployment API keys. The hearth CLI and the end-to-end tests
// use it.
//
//	c, err := client.New("https://control.example.com", client.WithToken(os.Getenv("HEARTH_TOKEN")))
//	srv, err := c.CreateServer(ctx, client.CreateServerRequest{Name: "web", Chip: "cpu", RAM: 8, Storage: 40,
//		Stack: client.StackDeployment, Model: "llama3.2:1b", Billing: client.BillingMonthly})
//	srv, err = c.WaitServerRunning(ctx, srv.ID, client.WaitOptions{})
//	for key, err := range c.AllSSHKeys(ctx, client.ListParams{}) { … }
//
// Every call takes a context. Errors of the API are APIError values with
// the status, code, param and request ID. Creates carry an Idempotency-Key
// (generated unless the context holds one, see WithIdempotencyKey), so
// the client retries them safely after a lost answer; it also retries
// rate-limited (429) and unavailable (502–504) answers, after Retry-After
// where the API sends one.
package client

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
	"github.com/hearthd/hearth/internal/ids"
	"github.com/hearthd/hearth/internal/noredirect"
)

// Client calls the management API with one token. It is safe for
// concurrent use.
type Client struct {
	base      *url.URL
	token     string
	http      *http.Client
	userAgent string
	retries   int
	retryMin  time.Duration
	retryMax  time.Duration

	rlMu sync.Mutex
	rl   RateLimit // from the latest answer that carried the headers
}

// RateLimit is the token's request budget as the management API's
// RateLimit-* headers said in its latest answer: Limit requests per
// window, Remaining of them now, the window full again after Reset.
type RateLimit struct {
	Limit, Remaining int
	Reset            time.Duration
	// At is when the answer came; zero if none carried the headers yet.
	At time.Time
}

// RateLimit returns the budget the latest answer reported, and false if
// no answer has carried RateLimit-* headers yet.
func (c *Client) RateLimit() (RateLimit, bool) {
	c.rlMu.Lock()
	defer c.rlMu.Unlock()
	return c.rl, !c.rl.At.IsZero()
}

// noteRateLimit keeps the RateLimit-* headers of an answer, if it has them.
func (c *Client) noteRateLimit(h http.Header) {
	limit, err1 := strconv.Atoi(h.Get("RateLimit-Limit"))
	remaining, err2 := strconv.Atoi(h.Get("RateLimit-Remaining"))
	reset, err3 := strconv.Atoi(h.Get("RateLimit-Reset"))
	if err1 != nil || err2 != nil || err3 != nil {
		return
	}
	c.rlMu.Lock()
	c.rl = RateLimit{Limit: limit, Remaining: remaining, Reset: time.Duration(reset) * time.Second, At: time.Now()}
	c.rlMu.Unlock()
}

// settings collects the options before New builds the client.
type settings struct {
	token          string
	httpClient     *http.Client
	tlsConfig      *tls.Config
	caFile         string
	userAgent      string
	retries        int
	retryMin       time.Duration
	retryMax       time.Duration
	allowPlainHTTP bool
}

// Option configures a Client.
type Option func(*settings)

// WithToken sets the management API token (sent as a bearer token).
func WithToken(token string) Option { return func(s *settings) { s.token = token } }

// WithHTTPClient makes the client send its requests through hc, e.g. one
// with a proxy or a transport of its own. WithTLSConfig and WithCAFile
// then apply to a copy of hc's transport, which must be an *http.Transport
// (or nil, for http.DefaultTransport). Whatever hc's CheckRedirect, the
// client follows no redirect: the token would go with it.
func WithHTTPClient(hc *http.Client) Option { return func(s *settings) { s.httpClient = hc } }

// WithTLSConfig sets the TLS configuration of HTTPS connections.
func WithTLSConfig(cfg *tls.Config) Option { return func(s *settings) { s.tlsConfig = cfg } }

// WithCAFile makes HTTPS connections trust the PEM certificates in path as
// well as the system's roots: for a control plane whose certificate comes
// from a private CA.
func WithCAFile(path string) Option { return func(s *settings) { s.caFile = path } }

// WithUserAgent sets the User-Agent header.
func WithUserAgent(ua string) Option { return func(s *settings) { s.userAgent = ua } }

// WithRetries sets how many times a request is retried (default 3; 0
// never retries) and the pauses between attempts (default 0.5 s to 10 s):
// exponential from min to max, jittered, unless the API says how long to
// wait (Retry-After). An answer asking for a wait longer than max is
// returned at once.
func WithRetries(n int, min, max time.Duration) Option {
	return func(s *settings) { s.retries, s.retryMin, s.retryMax = n, min, max }
}

// WithAllowPlainHTTP lets the client send its token over plain HTTP to a
// host other than loopback. Without it, New refuses such a URL: the token
// would cross the network in the clear.
func WithAllowPlainHTTP() Option { return func(s *settings) { s.allowPlainHTTP = true } }

// New returns a client of the management API at baseURL (scheme, host and
// port, e.g. "https://control.example.com"; a trailing /v1 is accepted).
func New(baseURL string, opts ...Option) (*Client, error) {
	s := settings{retries: 3, retryMin: 500 * time.Millisecond, retryMax: 10 * time.Second, userAgent: "hearth-go-client"}
	for _, o := range opts {
		o(&s)
	}
	u, err := parseBase(baseURL, s.allowPlainHTTP)
	if err != nil {
		return nil, err
	}
	hc, err := httpClient(s)
	if err != nil {
		return nil, err
	}
	hc = noredirect.Client(hc)
	if s.retries < 0 || s.retryMin < 0 || s.retryMax < s.retryMin {
		return nil, fmt.Errorf("retries: want n ≥ 0 and 0 ≤ min ≤ max, got %d, %v, %v", s.retries, s.retryMin, s.retryMax)
	}
	return &Client{base: u, token: s.token, http: hc, userAgent: s.userAgent,
		retries: s.retries, retryMin: s.retryMin, retryMax: s.retryMax}, nil
}

func parseBase(raw string, allowPlain bool) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return nil, fmt.Errorf("control plane URL: %w", err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("control plane URL %q: want http(s)://host[:port]", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return nil, fmt.Errorf("control plane URL %q: no user, query or fragment allowed", raw)
	}
	if u.Scheme == "http" && !allowPlain && !isLoopback(u.Hostname()) {
		return nil, fmt.Errorf("control plane URL %q: plain HTTP to a host other than loopback would send the token in the clear; use https (or allow plain HTTP explicitly)", raw)
	}
	u.Path = strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/v1")
	return u, nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// httpClient is the HTTP client the options ask for.
func httpClient(s settings) (*http.Client, error) {
	hc := s.httpClient
	if hc == nil {
		// No overall timeout: every call takes a context.
		hc = &http.Client{}
	}
	if s.tlsConfig == nil && s.caFile == "" {
		if hc.Transport == nil {
			// A transport of its own, so that CloseIdleConnections
			// closes only this client's connections.
			c := *hc
			c.Transport = http.DefaultTransport.(*http.Transport).Clone()
			hc = &c
		}
		return hc, nil
	}
	var tr *http.Transport
	switch t := hc.Transport.(type) {
	case nil:
		tr = http.DefaultTransport.(*http.Transport).Clone()
	case *http.Transport:
		tr = t.Clone()
	default:
		return nil, fmt.Errorf("TLS options need an *http.Transport, the HTTP client has a %T", hc.Transport)
	}
	cfg := s.tlsConfig
	if s.caFile != "" {
		var err error
		if cfg, err = TLSConfigWithCA(cfg, s.caFile); err != nil {
			return nil, err
		}
	}
	tr.TLSClientConfig = cfg
	c := *hc
	c.Transport = tr
	return &c, nil
}

// CloseIdleConnections closes the connections kept for reuse.
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

type idempotencyKey struct{}

// WithIdempotencyKey returns a context whose create calls send key as
// their Idempotency-Key instead of a generated one: a program that retries
// a create across runs (after a crash or a timeout) uses the same key to
// get the first answer back instead of a second server. The API keeps
// keys for 24 hours, scoped to the token.
func WithIdempotencyKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, idempotencyKey{}, key)
}

// request is one API call, made and possibly retried by do.
type request struct {
	method string
	path   string // under the base URL, already escaped
	query  url.Values
	body   any // JSON-encoded, or nil
}

// do sends r, retrying what can safely be retried, and decodes a 2xx
// answer into out (unless out is nil). It returns the answer's headers.
func (c *Client) do(ctx context.Context, r request, out any) (http.Header, error) {
	var body []byte
	if r.body != nil {
		var err error
		if body, err = json.Marshal(r.body); err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
	}
	idem := ""
	if r.method == http.MethodPost {
		idem, _ = ctx.Value(idempotencyKey{}).(string)
		if idem == "" {
			idem = ids.New("hcli_", 24)
		}
	}
	bo := backoff.Backoff{Min: c.retryMin, Max: c.retryMax, Jitter: true}
	ambiguous := false // an earlier attempt may have taken effect
	for attempt := 0; ; attempt++ {
		resp, err := c.send(ctx, r, body, idem)
		if err != nil {
			if ctx.Err() != nil || attempt == c.retries || !retryTransport(r.method) || permanent(err) {
				return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
			}
			ambiguous = true
			if err := backoff.Sleep(ctx, bo.Next()); err != nil {
				return nil, fmt.Errorf("%s %s: %w", r.method, r.path, err)
			}
			continue
		}
		hdr, apiErr, err := c.finish(resp, out)
		c.noteRateLimit(hdr)
		if err != nil {
			return hdr, fmt.Errorf("%s %s: %w", r.method, r.path, err)
		}
		if apiErr == nil {
			return hdr, nil
		}
		// A DELETE whose earlier attempt may have been done: it is now.
		if ambiguous && r.method == http.MethodDelete && apiErr.StatusCode == http.StatusNotFound {
			return hdr, nil
		}
		wait, retry := retryStatus(r.method, *apiErr)
		// A wait beyond the client's longest pause is the caller's to
		// decide on (APIError.RetryAfter says how long).
		if !retry || attempt == c.retries || wait > c.retryMax {
			return hdr, *apiErr
		}
		if apiErr.StatusCode != http.StatusTooManyRequests {
			ambiguous = true
		}
		if wait == 0 {
			wait = bo.Next()
		}
		if err := backoff.Sleep(ctx, wait); err != nil {
			return hdr, fmt.Errorf("%s %s: waiting to retry after %w: %w", r.method, r.path, *apiErr, err)
		}
	}
}

// retryTransport reports whether a request whose answer never came may be
// sent again: GETs and DELETEs (a repeated DELETE's 404 counts as done),
// and POSTs, which always carry an Idempotency-Key. A PATCH is not sent
// twice blindly.
func retryTransport(method string) bool { return method != http.MethodPatch }

// permanent reports whether a transport error would only repeat: the
// server's certificate is not trusted, or it answered with a redirect.
func permanent(err error) bool {
	var cv *tls.CertificateVerificationError
	return errors.As(err, &cv) || noredirect.Is(err)
}

// retryStatus reports whether an error answer is worth another attempt,
// and how long the API asked to wait (0: the client's backoff).
func retryStatus(method string, e APIError) (time.Duration, bool) {
	switch e.StatusCode {
	case http.StatusTooManyRequests:
		return e.RetryAfter, true // refused before anything was done
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if e.Code == CodeUnavailable {
			return e.RetryAfter, true // the control plane changed nothing
		}
		return e.RetryAfter, retryTransport(method)
	}
	return 0, false
}

func (c *Client) send(ctx context.Context, r request, body []byte, idem string) (*http.Response, error) {
	target := c.base.String() + r.path
	if len(r.query) > 0 {
		target += "?" + r.query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, target, rd)
	if err != nil {
		return nil, fmt.Errorf("build request: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	return c.http.Do(req)
}

// maxAnswer bounds what is read of an answer; the API's largest (a page
// of 100 servers) is far below it.
const maxAnswer = 16 << 20

// finish reads an answer: a 2xx decoded into out, or the API's error.
func (c *Client) finish(resp *http.Response, out any) (http.Header, *APIError, error) {
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return resp.Header, nil, fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode >= 300 {
		e := apiError(resp, raw)
		return resp.Header, &e, nil
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.Header, nil, fmt.Errorf("decode answer (HTTP %d): %w", resp.StatusCode, err)
		}
	}
	return resp.Header, nil, nil
}

func apiError(resp *http.Response, raw []byte) APIError {
	e := APIError{StatusCode: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	var body errorBody
	if json.Unmarshal(raw, &body) == nil && body.Error.Message != "" {
		e.Code, e.Message = body.Error.Code, body.Error.Message
		if body.Error.Param != nil {
			e.Param = *body.Error.Param
		}
		if body.Error.RequestID != "" {
			e.RequestID = body.Error.RequestID
		}
		return e
	}
	// Not the API's answer (a proxy's, say): say what came back.
	e.Message = http.StatusText(resp.StatusCode)
	if snippet := strings.TrimSpace(string(raw[:min(len(raw), 200)])); snippet != "" {
		e.Message += ": " + snippet
	}
	return e
}
