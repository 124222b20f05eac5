package bench

import (
	"bufio"
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
	"sync"
	"sync/atomic"
	"time"
)

// LoadConfig describes one load run against an OpenAI-compatible endpoint.
type LoadConfig struct {
	// Target is the OpenAI base URL; requests go to Target+"/chat/completions".
	Target string
	// Key is sent as a bearer token when set.
	Key       string
	Model     string
	Prompt    string
	MaxTokens int // sent as max_tokens when > 0

	// Concurrency is the number of streams in a closed loop, each starting
	// its next request when the previous one ends. With Rate set it instead
	// caps the requests in flight.
	Concurrency int
	// Rate, when > 0, runs an open loop: requests start at this many per
	// second whether or not earlier ones have finished.
	Rate float64
	// Duration bounds the time new requests start in; Requests, when > 0,
	// bounds their number.
	Duration time.Duration
	Requests int
	// Ramp spreads the start of closed-loop streams, so thousands of streams
	// do not all connect in the same millisecond.
	Ramp time.Duration
	// RequestTimeout bounds one request; default 2 minutes.
	RequestTimeout time.Duration
	// ExpectTokens, when > 0, counts a stream with a different number of
	// content chunks as an error.
	ExpectTokens int
	// Verify decodes every chunk fully and checks its shape; slower, for
	// tests.
	Verify bool
	// TLS is the client configuration for an https:// Target.
	TLS *tls.Config
}

// LoadResult is what one run measured.
type LoadResult struct {
	Requests     int           `json:"requests"`
	Completed    int           `json:"completed"`
	Errors       int           `json:"errors"`
	ErrorSamples []string      `json:"error_samples,omitempty"`
	Tokens       int64         `json:"tokens"`
	ContentBytes int64         `json:"content_bytes"`
	Elapsed      time.Duration `json:"elapsed_ns"`

	// Per-request and per-token samples, unsorted.
	TTFT  []time.Duration `json:"-"`
	Gaps  []time.Duration `json:"-"`
	Total []time.Duration `json:"-"`
}

// sample collects one worker's measurements, merged at the end so the hot
// loop takes no lock.
type sample struct {
	requests, completed, errors int
	errs                        []string
	tokens, bytes               int64
	ttft, gaps, total           []time.Duration
}

func (s *sample) fail(err error) {
	s.errors++
	if len(s.errs) < 5 {
		s.errs = append(s.errs, err.Error())
	}
}

// client is one keep-alive connection with its reusable buffers.
type client struct {
	conn net.Conn
	br   *bufio.Reader
	sse  *SSEReader
}

type loadgen struct {
	cfg     LoadConfig
	addr    string
	request []byte // the whole HTTP request, sent as is every time
	dialer  net.Dialer
}

func newLoadgen(cfg LoadConfig) (*loadgen, error) {
	u, err := url.Parse(cfg.Target)
	if err != nil {
		return nil, fmt.Errorf("parse target: %w", err)
	}
	port := "80"
	switch {
	case u.Scheme == "https" && cfg.TLS != nil:
		port = "443"
		if cfg.TLS.ServerName == "" {
			cfg.TLS = cfg.TLS.Clone()
			cfg.TLS.ServerName = u.Hostname()
		}
	case u.Scheme != "http":
		return nil, fmt.Errorf("target %q: want http://, or https:// with a TLS configuration", cfg.Target)
	default:
		cfg.TLS = nil
	}
	addr := u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(u.Hostname(), port)
	}
	if cfg.Prompt == "" {
		cfg.Prompt = "Write a story about a fox."
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 2 * time.Minute
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	body := map[string]any{
		"model":    cfg.Model,
		"messages": []map[string]string{{"role": "user", "content": cfg.Prompt}},
		"stream":   true,
	}
	if cfg.MaxTokens > 0 {
		body["max_tokens"] = cfg.MaxTokens
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s/chat/completions HTTP/1.1\r\nHost: %s\r\n", u.EscapedPath(), u.Host)
	req.WriteString("Content-Type: application/json\r\nAccept: text/event-stream\r\nUser-Agent: hearth-bench\r\n")
	if cfg.Key != "" {
		req.WriteString("Authorization: Bearer " + cfg.Key + "\r\n")
	}
	req.WriteString("Content-Length: " + strconv.Itoa(len(b)) + "\r\n\r\n")
	req.Write(b)
	return &loadgen{cfg: cfg, addr: addr, request: req.Bytes()}, nil
}

// RunLoad drives the configured load and returns what it measured.
func RunLoad(ctx context.Context, cfg LoadConfig) (*LoadResult, error) {
	lg, err := newLoadgen(cfg)
	if err != nil {
		return nil, err
	}
	if lg.cfg.Duration <= 0 && lg.cfg.Requests <= 0 {
		return nil, errors.New("load: set a duration or a request count")
	}
	var (
		mu  sync.Mutex
		all sample
	)
	merge := func(s *sample) {
		mu.Lock()
		defer mu.Unlock()
		all.requests += s.requests
		all.completed += s.completed
		all.errors += s.errors
		for _, e := range s.errs {
			if len(all.errs) < 10 {
				all.errs = append(all.errs, e)
			}
		}
		all.tokens += s.tokens
		all.bytes += s.bytes
		all.ttft = append(all.ttft, s.ttft...)
		all.gaps = append(all.gaps, s.gaps...)
		all.total = append(all.total, s.total...)
	}
	start := time.Now()
	var end time.Time
	if lg.cfg.Duration > 0 {
		end = start.Add(lg.cfg.Duration)
	}
	var issued atomic.Int64
	// take reserves the next request slot, or says the run is over. The
	// open loop ends by its schedule (a request due before end starts even
	// if the loop runs late); the closed loop by the clock.
	take := func() bool {
		if ctx.Err() != nil || (lg.cfg.Rate <= 0 && !end.IsZero() && time.Now().After(end)) {
			return false
		}
		return lg.cfg.Requests <= 0 || issued.Add(1) <= int64(lg.cfg.Requests)
	}
	if lg.cfg.Rate > 0 {
		lg.openLoop(ctx, start, end, take, merge)
	} else {
		lg.closedLoop(ctx, start, take, merge)
	}
	return &LoadResult{
		Requests: all.requests, Completed: all.completed, Errors: all.errors,
		ErrorSamples: all.errs, Tokens: all.tokens, ContentBytes: all.bytes,
		Elapsed: time.Since(start), TTFT: all.ttft, Gaps: all.gaps, Total: all.total,
	}, nil
}

func (lg *loadgen) closedLoop(ctx context.Context, start time.Time, take func() bool, merge func(*sample)) {
	var wg sync.WaitGroup
	n := lg.cfg.Concurrency
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var s sample
			defer merge(&s)
			if lg.cfg.Ramp > 0 {
				delay := time.Until(start.Add(lg.cfg.Ramp * time.Duration(i) / time.Duration(n)))
				select {
				case <-time.After(delay):
				case <-ctx.Done():
					return
				}
			}
			var c *client
			defer func() {
				if c != nil {
					_ = c.conn.Close()
				}
			}()
			for take() {
				c = lg.do(ctx, c, &s)
			}
		}()
	}
	wg.Wait()
}

func (lg *loadgen) openLoop(ctx context.Context, start, end time.Time, take func() bool, merge func(*sample)) {
	interval := time.Duration(float64(time.Second) / lg.cfg.Rate)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		idle []*client
	)
	slots := make(chan struct{}, lg.cfg.Concurrency)
	defer func() {
		wg.Wait()
		for _, c := range idle {
			_ = c.conn.Close()
		}
	}()
	var shed sample
	defer merge(&shed)
	timer := time.NewTimer(0)
	<-timer.C
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * interval)
		if !end.IsZero() && !at.Before(end) {
			return
		}
		if d := time.Until(at); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		if !take() {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			// The target fell so far behind that the in-flight cap is
			// reached: an open loop must not wait, so this request fails.
			shed.requests++
			shed.fail(fmt.Errorf("open loop: %d requests in flight", lg.cfg.Concurrency))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			mu.Lock()
			var c *client
			if n := len(idle); n > 0 {
				c, idle = idle[n-1], idle[:n-1]
			}
			mu.Unlock()
			var s sample
			c = lg.do(ctx, c, &s)
			merge(&s)
			if c != nil {
				mu.Lock()
				idle = append(idle, c)
				mu.Unlock()
			}
		}()
	}
}

// do runs one request on c (dialling when c is nil) and records it in s.
// It returns the connection if it can be reused, nil otherwise.
func (lg *loadgen) do(ctx context.Context, c *client, s *sample) *client {
	s.requests++
	if c == nil {
		conn, err := lg.dialer.DialContext(ctx, "tcp", lg.addr)
		if err != nil {
			s.fail(fmt.Errorf("dial: %w", err))
			return nil
		}
		if lg.cfg.TLS != nil {
			tc := tls.Client(conn, lg.cfg.TLS)
			if err := tc.HandshakeContext(ctx); err != nil {
				_ = conn.Close()
				s.fail(fmt.Errorf("TLS handshake: %w", err))
				return nil
			}
			conn = tc
		}
		c = &client{conn: conn, br: bufio.NewReaderSize(conn, 4096)}
	}
	reuse, err := lg.stream(c, s)
	if err != nil {
		s.fail(err)
	}
	if err != nil || !reuse {
		_ = c.conn.Close()
		return nil
	}
	return c
}

// stream sends the request and reads the event stream to its end.
func (lg *loadgen) stream(c *client, s *sample) (reuse bool, err error) {
	t0 := time.Now()
	if err := c.conn.SetDeadline(t0.Add(lg.cfg.RequestTimeout)); err != nil {
		return false, fmt.Errorf("set deadline: %w", err)
	}
	if _, err := c.conn.Write(lg.request); err != nil {
		return false, fmt.Errorf("write request: %w", err)
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return false, fmt.Errorf("read response: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return false, fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	if c.sse == nil {
		c.sse = NewSSEReader(resp.Body)
	} else {
		c.sse.Reset(resp.Body)
	}
	var (
		tokens   int
		nbytes   int64
		last     time.Time
		finished bool
	)
	for {
		data, err := c.sse.Next()
		if errors.Is(err, io.EOF) {
			return false, fmt.Errorf("stream ended without [DONE] after %d tokens", tokens)
		}
		if err != nil {
			return false, err
		}
		var ch Chunk
		if lg.cfg.Verify {
			ch, err = VerifyChunk(data)
			if err != nil {
				return false, err
			}
		} else {
			ch = ClassifyChunk(data)
		}
		if ch.Error {
			return false, fmt.Errorf("error event: %.200s", data)
		}
		if ch.Done {
			break
		}
		if ch.Finished {
			finished = true
		}
		if ch.ContentLen > 0 {
			now := time.Now()
			if tokens == 0 {
				s.ttft = append(s.ttft, now.Sub(t0))
			} else {
				s.gaps = append(s.gaps, now.Sub(last))
			}
			last = now
			tokens++
			nbytes += int64(ch.ContentLen)
		}
	}
	s.total = append(s.total, time.Since(t0))
	s.tokens += int64(tokens)
	s.bytes += nbytes
	if !finished {
		return false, errors.New("stream ended without a finish_reason")
	}
	if lg.cfg.ExpectTokens > 0 && tokens != lg.cfg.ExpectTokens {
		return false, fmt.Errorf("got %d tokens, want %d", tokens, lg.cfg.ExpectTokens)
	}
	// The body must be read to its end before the connection is reused.
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return false, fmt.Errorf("drain body: %w", err)
	}
	s.completed++
	return !resp.Close, nil
}

// VerifyChunk fully decodes an OpenAI chat.completion.chunk (or [DONE]) and
// checks its shape.
func VerifyChunk(data []byte) (Chunk, error) {
	if bytes.Equal(data, doneData) {
		return Chunk{Done: true}, nil
	}
	var v struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
		Choices []struct {
			Index int `json:"index"`
			Delta struct {
				Role    string  `json:"role"`
				Content *string `json:"content"`
			} `json:"delta"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
		Usage *struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return Chunk{}, fmt.Errorf("decode chunk %q: %w", data, err)
	}
	if v.Error != nil {
		return Chunk{Error: true}, nil
	}
	if v.Object != "chat.completion.chunk" || v.ID == "" || v.Created == 0 {
		return Chunk{}, fmt.Errorf("malformed chunk %q", data)
	}
	var c Chunk
	for _, ch := range v.Choices {
		if ch.Delta.Content != nil {
			c.ContentLen += len(*ch.Delta.Content)
		}
		if ch.FinishReason != nil {
			c.Finished = true
		}
	}
	if len(v.Choices) == 0 && v.Usage == nil {
		return Chunk{}, fmt.Errorf("chunk without choices or usage %q", data)
	}
	return c, nil
}
