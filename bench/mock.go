// Package bench measures what hearthd adds on top of the model runtime: a
// mock runtime that speaks Ollama's native and OpenAI-compatible APIs with a
// configurable pace, a load generator for any OpenAI-compatible endpoint, and
// the suite that drives the same load directly and through hearthd.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/types/model"
)

// MockConfig paces the mock runtime's generations.
type MockConfig struct {
	// Tokens is the number of tokens in a response unless the request asks
	// for fewer (num_predict / max_tokens).
	Tokens int `json:"tokens"`
	// TPS is tokens per second per stream; 0 means as fast as possible.
	TPS float64 `json:"tps"`
	// TTFT is the delay before the first token.
	TTFT time.Duration `json:"ttft"`
	// FlushEvery flushes the response after this many tokens (default 1,
	// as Ollama does). Larger values only matter at unlimited speed, where
	// they cut the mock's own syscalls so the relay gets the CPU.
	FlushEvery int `json:"flush_every"`
}

func (c MockConfig) withDefaults() MockConfig {
	if c.Tokens <= 0 {
		c.Tokens = 64
	}
	if c.FlushEvery <= 0 {
		c.FlushEvery = 1
	}
	return c
}

// mockVersion is the Ollama version the mock claims to be; its wire format
// follows that release.
const mockVersion = "0.9.6"

// Mock is an Ollama-compatible runtime that streams synthetic tokens.
type Mock struct {
	model  string // full name with tag, as Ollama's /api/ps reports it
	cfg    atomic.Pointer[MockConfig]
	loaded atomic.Bool
	mux    *http.ServeMux

	// Counters the suite checks relay completeness against.
	requests atomic.Int64
	tokens   atomic.Int64
	active   atomic.Int64 // generations being answered now
}

// NewMock returns a mock serving model (a bare name gets the tag "latest").
func NewMock(model string, cfg MockConfig) *Mock {
	if !strings.Contains(model, ":") {
		model += ":latest"
	}
	m := &Mock{model: model}
	c := cfg.withDefaults()
	m.cfg.Store(&c)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", m.root)
	mux.HandleFunc("HEAD /{$}", m.root)
	mux.HandleFunc("GET /api/version", m.version)
	mux.HandleFunc("HEAD /api/version", m.version)
	mux.HandleFunc("POST /api/show", m.show)
	mux.HandleFunc("GET /api/tags", m.tags)
	mux.HandleFunc("HEAD /api/tags", m.tags)
	mux.HandleFunc("GET /api/ps", m.ps)
	mux.HandleFunc("POST /api/chat", m.chat)
	mux.HandleFunc("POST /v1/chat/completions", m.openAIChat)
	mux.HandleFunc("GET /mock/config", m.getConfig)
	mux.HandleFunc("PUT /mock/config", m.putConfig)
	mux.HandleFunc("GET /mock/stats", m.stats)
	m.mux = mux
	return m
}

// ServeHTTP implements http.Handler.
func (m *Mock) ServeHTTP(w http.ResponseWriter, r *http.Request) { m.mux.ServeHTTP(w, r) }

// SetConfig changes the pace of generations that start from now on.
func (m *Mock) SetConfig(c MockConfig) {
	c = c.withDefaults()
	m.cfg.Store(&c)
}

// MockStats counts what the mock generated.
type MockStats struct {
	Requests int64 `json:"requests"`
	Tokens   int64 `json:"tokens"`
	// Active is how many generations are being answered now: one ends when
	// it is complete or its client went away, so tests see a relay cancel
	// its upstream request.
	Active int64 `json:"active"`
}

// Stats returns the generation counters.
func (m *Mock) Stats() MockStats {
	return MockStats{Requests: m.requests.Load(), Tokens: m.tokens.Load(), Active: m.active.Load()}
}

func (m *Mock) matches(name string) bool {
	if name == m.model {
		return true
	}
	return !strings.Contains(name, ":") && name+":latest" == m.model
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

func errJSON(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

func (m *Mock) root(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "Ollama is running")
}

func (m *Mock) version(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": mockVersion})
}

var mockDetails = api.ModelDetails{
	Format: "gguf", Family: "llama", Families: []string{"llama"},
	ParameterSize: "1M", QuantizationLevel: "F32",
}

const mockDigest = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"

func (m *Mock) show(w http.ResponseWriter, r *http.Request) {
	var req api.ShowRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		errJSON(w, http.StatusBadRequest, err.Error())
		return
	}
	name := req.Model
	if name == "" {
		name = req.Name //nolint:staticcheck // older clients still send name
	}
	if !m.matches(name) {
		errJSON(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", name))
		return
	}
	writeJSON(w, http.StatusOK, api.ShowResponse{
		Modelfile:    "FROM mock\n",
		Template:     "{{ .Prompt }}",
		Details:      mockDetails,
		Capabilities: []model.Capability{model.CapabilityCompletion},
		ModifiedAt:   time.Now(),
	})
}

func (m *Mock) tags(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.ListResponse{Models: []api.ListModelResponse{{
		Name: m.model, Model: m.model, ModifiedAt: time.Now(), Size: 1 << 20,
		Digest: mockDigest, Details: mockDetails,
	}}})
}

func (m *Mock) ps(w http.ResponseWriter, _ *http.Request) {
	models := []api.ProcessModelResponse{}
	if m.loaded.Load() {
		models = append(models, api.ProcessModelResponse{
			Name: m.model, Model: m.model, Size: 1 << 20, Digest: mockDigest,
			Details: mockDetails, ExpiresAt: time.Now().Add(24 * time.Hour * 365 * 100),
		})
	}
	writeJSON(w, http.StatusOK, api.ProcessResponse{Models: models})
}

func (m *Mock) getConfig(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, m.cfg.Load())
}

func (m *Mock) putConfig(w http.ResponseWriter, r *http.Request) {
	var c MockConfig
	if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
		errJSON(w, http.StatusBadRequest, err.Error())
		return
	}
	m.SetConfig(c)
	writeJSON(w, http.StatusOK, m.cfg.Load())
}

func (m *Mock) stats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, m.Stats())
}

// mockChatRequest is the part of an Ollama chat request the mock reads.
type mockChatRequest struct {
	Model     string          `json:"model"`
	Messages  []api.Message   `json:"messages"`
	Stream    *bool           `json:"stream"`
	KeepAlive *api.Duration   `json:"keep_alive"`
	Options   map[string]any  `json:"options"`
	Format    json.RawMessage `json:"format"`
}

func (m *Mock) chat(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var req mockChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		if err == io.EOF {
			errJSON(w, http.StatusBadRequest, "missing request body")
			return
		}
		errJSON(w, http.StatusBadRequest, err.Error())
		return
	}
	if req.Model == "" {
		errJSON(w, http.StatusBadRequest, "model is required")
		return
	}
	if !m.matches(req.Model) {
		errJSON(w, http.StatusNotFound, fmt.Sprintf("model %q not found, try pulling it first", req.Model))
		return
	}
	if len(req.Messages) == 0 {
		reason := "load"
		if req.KeepAlive != nil && req.KeepAlive.Duration == 0 {
			m.loaded.Store(false)
			reason = "unload"
		} else {
			m.loaded.Store(true)
		}
		writeJSON(w, http.StatusOK, api.ChatResponse{
			Model: req.Model, CreatedAt: time.Now().UTC(),
			Message: api.Message{Role: "assistant"}, Done: true, DoneReason: reason,
		})
		return
	}
	m.loaded.Store(true)
	cfg := *m.cfg.Load()
	n, reason := cfg.Tokens, "stop"
	if np, ok := req.Options["num_predict"].(float64); ok && np > 0 && int(np) < n {
		n, reason = int(np), "length"
	}
	g := generation{
		cfg: cfg, n: n, reason: reason, start: start,
		promptTokens: promptTokens(req.Messages),
	}
	m.requests.Add(1)
	m.active.Add(1)
	defer m.active.Add(-1)
	if req.Stream != nil && !*req.Stream {
		m.chatWhole(w, r.Context(), req.Model, &g)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := ndjsonEncoder{model: jsonString(req.Model)}
	m.stream(w, r.Context(), &g, &enc)
}

func promptTokens(msgs []api.Message) int {
	n := 0
	for _, msg := range msgs {
		n += len(msg.Content)/4 + 4
	}
	return n
}

// generation is one synthetic completion.
type generation struct {
	cfg          MockConfig
	n            int
	reason       string
	start        time.Time
	promptTokens int
	evalStart    time.Time
}

// mockTokens are the words generations cycle through: plain ASCII that
// needs no JSON escaping, so content byte counts are predictable.
var mockTokens = [...]string{" the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", "."}

// MockTokenBytes is the content length of a generation of n tokens.
func MockTokenBytes(n int) int {
	total := 0
	for i := range n {
		total += len(mockTokens[i%len(mockTokens)])
	}
	return total
}

// tokenEncoder appends one streamed line for a token, and the final line.
type tokenEncoder interface {
	token(b []byte, tok string) []byte
	final(b []byte, g *generation, now time.Time) []byte
}

// stream paces the tokens of g onto w, flushing like Ollama does (once per
// token unless FlushEvery says otherwise). It stops when ctx ends.
func (m *Mock) stream(w http.ResponseWriter, ctx context.Context, g *generation, enc tokenEncoder) {
	flusher, _ := w.(http.Flusher)
	var interval time.Duration
	if g.cfg.TPS > 0 {
		interval = time.Duration(float64(time.Second) / g.cfg.TPS)
	}
	var timer *time.Timer
	wait := func(until time.Time) bool {
		d := time.Until(until)
		if d <= 0 {
			return ctx.Err() == nil
		}
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	first := g.start.Add(g.cfg.TTFT)
	if !wait(first) {
		return
	}
	g.evalStart = time.Now()
	buf := make([]byte, 0, 512)
	pending := 0
	for i := range g.n {
		if interval > 0 && i > 0 && !wait(first.Add(time.Duration(i)*interval)) {
			return
		}
		buf = enc.token(buf, mockTokens[i%len(mockTokens)])
		pending++
		if pending >= g.cfg.FlushEvery || interval > 0 {
			if _, err := w.Write(buf); err != nil {
				return
			}
			buf = buf[:0]
			pending = 0
			if flusher != nil {
				flusher.Flush()
			}
		}
		m.tokens.Add(1)
	}
	buf = enc.final(buf, g, time.Now())
	if _, err := w.Write(buf); err != nil {
		return
	}
	if flusher != nil {
		flusher.Flush()
	}
}

func (m *Mock) chatWhole(w http.ResponseWriter, ctx context.Context, model string, g *generation) {
	var content strings.Builder
	var interval time.Duration
	if g.cfg.TPS > 0 {
		interval = time.Duration(float64(time.Second) / g.cfg.TPS)
	}
	select {
	case <-time.After(time.Until(g.start.Add(g.cfg.TTFT + time.Duration(max(g.n-1, 0))*interval))):
	case <-ctx.Done():
		return
	}
	g.evalStart = g.start.Add(g.cfg.TTFT)
	for i := range g.n {
		content.WriteString(mockTokens[i%len(mockTokens)])
	}
	m.tokens.Add(int64(g.n))
	now := time.Now()
	writeJSON(w, http.StatusOK, api.ChatResponse{
		Model: model, CreatedAt: now.UTC(),
		Message:    api.Message{Role: "assistant", Content: content.String()},
		DoneReason: g.reason, Done: true,
		Metrics: api.Metrics{
			TotalDuration: now.Sub(g.start), LoadDuration: time.Millisecond,
			PromptEvalCount: g.promptTokens, PromptEvalDuration: g.cfg.TTFT,
			EvalCount: g.n, EvalDuration: now.Sub(g.evalStart),
		},
	})
}

// jsonString is s as a JSON string literal.
func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// ndjsonEncoder writes Ollama's native /api/chat stream lines, byte for
// byte what encoding/json makes of api.ChatResponse, without reflection on
// the hot path.
type ndjsonEncoder struct {
	model []byte
}

func (e *ndjsonEncoder) head(b []byte, now time.Time) []byte {
	b = append(b, `{"model":`...)
	b = append(b, e.model...)
	b = append(b, `,"created_at":"`...)
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	return append(b, `","message":{"role":"assistant","content":`...)
}

func (e *ndjsonEncoder) token(b []byte, tok string) []byte {
	b = e.head(b, time.Now())
	b = append(b, '"')
	b = append(b, tok...)
	return append(b, `"},"done":false}`+"\n"...)
}

func (e *ndjsonEncoder) final(b []byte, g *generation, now time.Time) []byte {
	b = e.head(b, now)
	b = append(b, `""},"done_reason":"`...)
	b = append(b, g.reason...)
	b = append(b, `","done":true`...)
	b = appendDur(b, "total_duration", now.Sub(g.start))
	b = appendDur(b, "load_duration", time.Millisecond)
	b = appendDur(b, "prompt_eval_count", time.Duration(g.promptTokens))
	b = appendDur(b, "prompt_eval_duration", g.cfg.TTFT)
	b = appendDur(b, "eval_count", time.Duration(g.n))
	b = appendDur(b, "eval_duration", now.Sub(g.evalStart))
	return append(b, "}\n"...)
}

// appendDur appends an omitempty integer field.
func appendDur(b []byte, key string, d time.Duration) []byte {
	if d == 0 {
		return b
	}
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":`...)
	return strconv.AppendInt(b, int64(d), 10)
}

// openAIChatRequest is the part of an OpenAI chat request the mock reads.
type openAIChatRequest struct {
	Model         string        `json:"model"`
	Messages      []api.Message `json:"messages"`
	Stream        bool          `json:"stream"`
	StreamOptions *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	MaxTokens *int `json:"max_tokens"`
}

// openAIError is Ollama's OpenAI-compatible error body.
type openAIError struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   any     `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func openAIErr(w http.ResponseWriter, code int, msg string) {
	var e openAIError
	e.Error.Message = msg
	e.Error.Type = "api_error"
	if code == http.StatusBadRequest {
		e.Error.Type = "invalid_request_error"
	}
	writeJSON(w, code, e)
}

// openAIChat serves /v1/chat/completions as Ollama's compatibility layer
// does, so a gateway in front of the mock and a client talking to it directly
// see the same stream.
func (m *Mock) openAIChat(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var req openAIChatRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		openAIErr(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(req.Messages) == 0 {
		openAIErr(w, http.StatusBadRequest, "[] is too short - 'messages'")
		return
	}
	if !m.matches(req.Model) {
		openAIErr(w, http.StatusInternalServerError, fmt.Sprintf("model %q not found, try pulling it first", req.Model))
		return
	}
	m.loaded.Store(true)
	cfg := *m.cfg.Load()
	n, reason := cfg.Tokens, "stop"
	if req.MaxTokens != nil && *req.MaxTokens > 0 && *req.MaxTokens < n {
		n, reason = *req.MaxTokens, "length"
	}
	g := generation{cfg: cfg, n: n, reason: reason, start: start, promptTokens: promptTokens(req.Messages)}
	m.requests.Add(1)
	m.active.Add(1)
	defer m.active.Add(-1)
	id := "chatcmpl-" + strconv.Itoa(rand.IntN(999))
	if !req.Stream {
		m.openAIWhole(w, r.Context(), id, req.Model, &g)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	enc := sseEncoder{
		id: jsonString(id), model: jsonString(req.Model),
		usage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
	}
	m.stream(w, r.Context(), &g, &enc)
}

func (m *Mock) openAIWhole(w http.ResponseWriter, ctx context.Context, id, model string, g *generation) {
	var interval time.Duration
	if g.cfg.TPS > 0 {
		interval = time.Duration(float64(time.Second) / g.cfg.TPS)
	}
	select {
	case <-time.After(time.Until(g.start.Add(g.cfg.TTFT + time.Duration(max(g.n-1, 0))*interval))):
	case <-ctx.Done():
		return
	}
	var content strings.Builder
	for i := range g.n {
		content.WriteString(mockTokens[i%len(mockTokens)])
	}
	m.tokens.Add(int64(g.n))
	type message struct {
		Role    string `json:"role"`
		Content any    `json:"content"`
	}
	type choice struct {
		Index        int     `json:"index"`
		Message      message `json:"message"`
		FinishReason *string `json:"finish_reason"`
	}
	reason := g.reason
	body := struct {
		ID                string   `json:"id"`
		Object            string   `json:"object"`
		Created           int64    `json:"created"`
		Model             string   `json:"model"`
		SystemFingerprint string   `json:"system_fingerprint"`
		Choices           []choice `json:"choices"`
		Usage             usage    `json:"usage"`
	}{
		ID: id, Object: "chat.completion", Created: time.Now().Unix(), Model: model,
		SystemFingerprint: "fp_ollama",
		Choices:           []choice{{Message: message{Role: "assistant", Content: content.String()}, FinishReason: &reason}},
		Usage:             usage{g.promptTokens, g.n, g.promptTokens + g.n},
	}
	// Ollama answers non-streamed completions through json.Encoder, which
	// ends the body with a newline.
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// sseEncoder writes Ollama's OpenAI-compatible chunks: one "data:" event per
// token, then the finish chunk, the optional usage chunk and [DONE].
type sseEncoder struct {
	id, model []byte
	usage     bool
}

func (e *sseEncoder) head(b []byte) []byte {
	b = append(b, `data: {"id":`...)
	b = append(b, e.id...)
	b = append(b, `,"object":"chat.completion.chunk","created":`...)
	b = strconv.AppendInt(b, time.Now().Unix(), 10)
	b = append(b, `,"model":`...)
	b = append(b, e.model...)
	return append(b, `,"system_fingerprint":"fp_ollama","choices":`...)
}

func (e *sseEncoder) token(b []byte, tok string) []byte {
	b = e.head(b)
	b = append(b, `[{"index":0,"delta":{"role":"assistant","content":"`...)
	b = append(b, tok...)
	return append(b, `"},"finish_reason":null}]}`+"\n\n"...)
}

func (e *sseEncoder) final(b []byte, g *generation, _ time.Time) []byte {
	b = e.head(b)
	b = append(b, `[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"`...)
	b = append(b, g.reason...)
	b = append(b, `"}]}`+"\n\n"...)
	if e.usage {
		b = e.head(b)
		b = append(b, `[],"usage":{"prompt_tokens":`...)
		b = strconv.AppendInt(b, int64(g.promptTokens), 10)
		b = append(b, `,"completion_tokens":`...)
		b = strconv.AppendInt(b, int64(g.n), 10)
		b = append(b, `,"total_tokens":`...)
		b = strconv.AppendInt(b, int64(g.promptTokens+g.n), 10)
		b = append(b, "}}\n\n"...)
	}
	return append(b, "data: [DONE]\n\n"...)
}

// MockServer is a Mock listening on a loopback port.
type MockServer struct {
	*Mock
	// URL is the base URL, e.g. http://127.0.0.1:41234.
	URL string
	srv *http.Server
	ln  net.Listener
}

// StartMock serves a new Mock on addr (host:port; port 0 picks one).
func StartMock(addr, model string, cfg MockConfig) (*MockServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("mock listen: %w", err)
	}
	m := NewMock(model, cfg)
	srv := &http.Server{Handler: m, ReadHeaderTimeout: 30 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return &MockServer{Mock: m, URL: "http://" + ln.Addr().String(), srv: srv, ln: ln}, nil
}

// Close stops the server and ends open streams.
func (s *MockServer) Close() error {
	return s.srv.Close()
}
