package nodeapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/hearthd/hearth/internal/config"
	"github.com/hearthd/hearth/internal/noredirect"
)

// Error is a non-2xx answer from the control plane.
type Error struct {
	Status    int
	Code      string
	Message   string
	RequestID string
	// RetryAfter is the control plane's Retry-After (a 429 or 503), 0 if
	// it sent none.
	RetryAfter time.Duration
}

// RetryAfter is the wait err asks for before the next try: its Retry-After
// if it is an *Error carrying one, else 0.
func RetryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

func (e *Error) Error() string {
	return fmt.Sprintf("control plane answered %d %s: %s (request %s)", e.Status, e.Code, e.Message, e.RequestID)
}

// IsRateLimited reports whether err is the control plane asking the node
// to slow down (429): it is there, and RetryAfter says for how long.
func IsRateLimited(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusTooManyRequests
}

// IsUnauthorized reports whether err is the control plane rejecting the
// credential.
func IsUnauthorized(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusUnauthorized
}

// Client talks to the control plane on behalf of one node.
type Client struct {
	// bases are the control plane's replicas (or one load-balanced URL);
	// cur indexes the one in use. A replica that cannot be reached or
	// answers 502/503/504 makes the client move to the next for the
	// following request; the caller's retry does the rest.
	bases []string
	cur   atomic.Int32
	http  *http.Client
	// credential is the node credential, or the enrollment token while
	// enrolling; set with SetCredential.
	credential string
	// plain is set when base is plain HTTP to another machine: no
	// credential is ever sent there.
	plain error
}

// NewClient returns a client for the control plane at baseURL (scheme and
// host, e.g. "http://127.0.0.1:8400"), or at any of a comma-separated list
// of such URLs, one per replica. A nil httpClient uses a client of its own
// with no overall timeout, since long-polls are bounded by their own wait.
// The client follows no redirect, whatever httpClient's CheckRedirect: the
// enrollment token or the credential would go with it.
func NewClient(baseURL string, httpClient *http.Client) *Client {
	if httpClient == nil {
		// Its own transport, so that CloseIdleConnections closes only its
		// connections.
		httpClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	c := &Client{http: noredirect.Client(httpClient)}
	for _, u := range SplitURLs(baseURL) {
		c.bases = append(c.bases, strings.TrimRight(u, "/"))
	}
	if len(c.bases) == 0 {
		c.bases = []string{""}
	}
	c.plain = CheckURL(baseURL)
	return c
}

// SplitURLs splits a control_url setting into its URLs: one, or a
// comma-separated list of the control plane's replicas.
func SplitURLs(s string) []string {
	var out []string
	for _, u := range strings.Split(s, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// CheckURL refuses a control plane URL (or any URL of a list) that would
// carry the enrollment token and the node credential in the clear: plain
// HTTP is only for loopback (a control plane on the same machine, tests).
func CheckURL(baseURL string) error {
	for _, one := range SplitURLs(baseURL) {
		u, err := url.Parse(one)
		if err != nil {
			return fmt.Errorf("control plane URL: %w", err)
		}
		if u.Scheme == "http" && !config.LoopbackHost(u.Hostname()) {
			return fmt.Errorf("control plane URL %s is plain HTTP to another machine, which would send the node's enrollment token and credential in the clear: use https (plain http is only for loopback)", one)
		}
	}
	return nil
}

// BaseURL is the control plane URL the next request goes to.
func (c *Client) BaseURL() string { return c.bases[int(c.cur.Load())%len(c.bases)] }

// failover moves to the next replica after one failed at index i, unless
// another request already moved on.
func (c *Client) failover(i int32) {
	if len(c.bases) > 1 {
		c.cur.CompareAndSwap(i, (i+1)%int32(len(c.bases)))
	}
}

// CloseIdleConnections closes the connections kept for reuse (when the
// node agent stops, so that none outlives it).
func (c *Client) CloseIdleConnections() { c.http.CloseIdleConnections() }

// SetCredential sets the node credential used by Desired and ReportObserved.
func (c *Client) SetCredential(credential string) { c.credential = credential }

// Enroll exchanges an enrollment token for a node credential. It does not
// change the client's credential.
func (c *Client) Enroll(ctx context.Context, enrollmentToken string, req EnrollRequest) (EnrollResponse, error) {
	var resp EnrollResponse
	status, err := c.do(ctx, http.MethodPost, PathEnroll, enrollmentToken, req, &resp)
	if err != nil {
		return EnrollResponse{}, fmt.Errorf("enroll: %w", err)
	}
	if status != http.StatusCreated && status != http.StatusOK {
		return EnrollResponse{}, fmt.Errorf("enroll: unexpected status %d", status)
	}
	return resp, nil
}

// Desired long-polls for a desired state newer than after, waiting up to
// wait on the server (zero means the server's default). changed is false
// when the wait ended with nothing newer.
func (c *Client) Desired(ctx context.Context, after uint64, wait time.Duration) (d Desired, changed bool, err error) {
	q := url.Values{"after": {strconv.FormatUint(after, 10)}}
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', -1, 64))
	}
	status, err := c.do(ctx, http.MethodGet, PathDesired+"?"+q.Encode(), c.credential, nil, &d)
	if err != nil {
		return Desired{}, false, fmt.Errorf("poll desired state: %w", err)
	}
	if status == http.StatusNoContent {
		return Desired{}, false, nil
	}
	return d, true, nil
}

// ReportObserved posts what the node applied.
func (c *Client) ReportObserved(ctx context.Context, o Observed) error {
	var reused bool
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }})
	_, err := c.do(tctx, http.MethodPost, PathObserved, c.credential, o, nil)
	var apiErr *Error
	if err != nil && reused && ctx.Err() == nil && !errors.As(err, &apiErr) && !noredirect.Is(err) {
		// A kept connection broke under the report before any answer (the
		// server, or the pool's idle timer, closed it as it was taken). A
		// report may be applied twice (the control plane keeps a node's
		// newest), so it is sent again at once on a fresh connection.
		_, err = c.do(ctx, http.MethodPost, PathObserved, c.credential, o, nil)
	}
	if err != nil {
		return fmt.Errorf("report observed state: %w", err)
	}
	return nil
}

func (c *Client) do(ctx context.Context, method, path, bearer string, in, out any) (int, error) {
	if c.plain != nil {
		return 0, c.plain
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	i := c.cur.Load() % int32(len(c.bases))
	req, err := http.NewRequestWithContext(ctx, method, c.bases[i]+path, body)
	if err != nil {
		return 0, fmt.Errorf("build request: %w", err)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			c.failover(i)
		}
		return 0, err
	}
	switch resp.StatusCode {
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		c.failover(i)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
		if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs > 0 {
			e.RetryAfter = time.Duration(secs) * time.Second
		}
		var eb ErrorBody
		if json.Unmarshal(raw, &eb) == nil {
			e.Code, e.Message = eb.Error.Code, eb.Error.Message
		}
		return resp.StatusCode, e
	}
	if out != nil && resp.StatusCode != http.StatusNoContent && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			return resp.StatusCode, fmt.Errorf("decode response: %w", err)
		}
	}
	return resp.StatusCode, nil
}
