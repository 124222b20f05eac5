// Package ollama is the Ollama backend of llm.Runtime, and the supervisor
// that keeps a private `ollama serve` running beside hearthd.
//
// Model management (show, create, pull, list running) goes through the
// official client, github.com/ollama/ollama/api. Chat sends an
// api.ChatRequest but reads the stream itself: api.Client.Chat turns a 400
// answer into an error without its status code (so a bad request could not be
// told apart from a broken runtime) and decodes every line twice, where
// reading the lines in place allocates nothing per token but its text (see
// stream.go).
package ollama

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/internal/jsonw"
	"github.com/hearthd/hearth/llm"
)

// Config configures a Backend.
type Config struct {
	// BaseURL is where Ollama listens, e.g. http://127.0.0.1:11434.
	BaseURL string
	// Model is the name of the deployment's model in Ollama.
	Model string
	// HTTPClient, if set, is used for every request. It must not have a
	// Timeout: chat streams last as long as generations do.
	HTTPClient *http.Client
	// FirstByteTimeout bounds the time from sending a chat request to its
	// first line (first token or error). Zero means no bound beyond ctx.
	FirstByteTimeout time.Duration
	// Logger receives progress of model pulls and creation. Nil discards.
	Logger *slog.Logger
	// MaxConns is how many chat streams can run at once (the daemon's
	// admission limit, queue included). The default transport keeps that
	// many idle connections to Ollama, so no stream has to dial one once
	// the deployment has been that busy. Zero means DefaultMaxConns. It
	// does not apply to HTTPClient.
	MaxConns int
	// WedgeTimeout is how long the runtime may send nothing back for any
	// request in flight, while a one-token probe gets no answer either,
	// before it is taken for wedged rather than busy (see watch). Zero
	// turns the watch off.
	WedgeTimeout time.Duration
	// OnWedged, if set, is called when the runtime is found wedged, and
	// reports whether it is being restarted (hearthd restarts the
	// `ollama serve` it supervises): the backend then holds generations
	// until Warm succeeds. Otherwise (or unset) the backend logs an error
	// and Ready fails with ErrWedged until the runtime answers again. It
	// must not block.
	OnWedged func(reason string) (restarting bool)
}

// DefaultMaxConns is the idle connection pool size when Config.MaxConns is
// not set.
const DefaultMaxConns = 256

// ModelSource says where the model comes from if Ollama does not have it.
type ModelSource struct {
	// GGUFPath, if set, is a local GGUF file the model is created from;
	// otherwise the model is pulled from its registry by name.
	GGUFPath string
	// Template is the chat template (Go template syntax) for a model
	// created from GGUFPath; empty uses what Ollama infers from the file.
	Template string
	// System is a default system prompt for a created model.
	System string
	// Parameters are default options for a created model (e.g.
	// "num_ctx": 4096).
	Parameters map[string]any
	// Insecure allows pulling over plain HTTP, for a private registry on
	// a trusted network.
	Insecure bool
	// Progress, if set, is called with a pull's progress as Ollama reports
	// it: its status ("pulling manifest", "pulling 6a0746a1ec1a", …) and,
	// while a layer downloads, bytes completed of total.
	Progress func(status string, completed, total int64)
}

// Backend talks to one Ollama server about one model. It is safe for
// concurrent use.
type Backend struct {
	cfg     Config
	base    string // BaseURL without a trailing slash
	chatURL string
	genURL  string // /api/generate
	embURL  string // /api/embed
	hc      *http.Client
	api     *api.Client
	log     *slog.Logger
	// watch is shared with the backends WithModel returns: one runtime.
	watch *watch
}

// New returns a Backend for cfg.
func New(cfg Config) (*Backend, error) {
	if cfg.Model == "" {
		return nil, errors.New("ollama: model name is required")
	}
	u, err := url.Parse(cfg.BaseURL)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("ollama: invalid base URL %q", cfg.BaseURL)
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: loopbackTransport(cfg.MaxConns)}
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := strings.TrimRight(u.String(), "/")
	b := &Backend{
		cfg:     cfg,
		base:    base,
		chatURL: base + "/api/chat",
		genURL:  base + "/api/generate",
		embURL:  base + "/api/embed",
		hc:      hc,
		api:     api.NewClient(u, hc),
		log:     log,
	}
	b.watch = newWatch(cfg.FirstByteTimeout, cfg.WedgeTimeout, cfg.OnWedged, log.With("runtime", base))
	return b, nil
}

// Model is the model this backend serves.
func (b *Backend) Model() string { return b.cfg.Model }

// WithModel returns a backend for another model of the same Ollama,
// sharing this one's connections: what a model switch serves from.
func (b *Backend) WithModel(model string) *Backend {
	nb := *b
	nb.cfg.Model = model
	return &nb
}

// CloseIdleConnections closes the connections to the runtime kept for
// reuse; the daemon calls it at shutdown so that none outlives it.
func (b *Backend) CloseIdleConnections() {
	b.hc.CloseIdleConnections()
}

// loopbackTransport is an HTTP transport for an Ollama on the same host.
func loopbackTransport(maxConns int) *http.Transport {
	if maxConns <= 0 {
		maxConns = DefaultMaxConns
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	// Ollama is local; proxies from the environment do not apply.
	tr.Proxy = nil
	tr.DialContext = (&net.Dialer{
		// A loopback connect either succeeds at once or is refused;
		// waiting long only hides a runtime that is down.
		Timeout: 5 * time.Second,
		// The kernel resets loopback connections of a process that dies,
		// so keepalive probes would find nothing; skip their timers.
		KeepAlive: -1,
	}).DialContext
	// Every stream holds a connection for as long as it runs. Keep as
	// many idle ones as streams may run at once: a smaller pool closes the
	// connections of streams beyond it after each answer, and the next
	// request dials again (a TIME_WAIT socket per request under load).
	// Connections are not capped: the daemon's admission control is the
	// limit, and a cap would add a second, silent queue.
	tr.MaxIdleConns = maxConns
	tr.MaxIdleConnsPerHost = maxConns
	// Compression over loopback costs CPU per token and saves nothing.
	tr.DisableCompression = true
	// The write buffer lives as long as the connection but only carries
	// request headers and bodies, once per request; a small one saves
	// memory per stream (a larger body is written past it).
	tr.WriteBufferSize = 1 << 10
	return tr
}

// unreachable wraps a transport failure.
func (b *Backend) unreachable(err error) error {
	return fmt.Errorf("%w: model runtime at %s is unreachable: %w", llm.ErrUnavailable, b.base, err)
}

// apiError classifies an error from the api client.
func (b *Backend) apiError(what string, err error) error {
	var se api.StatusError
	if errors.As(err, &se) {
		if se.StatusCode == http.StatusBadRequest {
			return &llm.InvalidRequestError{Msg: se.ErrorMessage}
		}
		return fmt.Errorf("%w: %s: %w", llm.ErrUnavailable, what, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	var ue *url.Error
	var ne net.Error
	if errors.As(err, &ue) || errors.As(err, &ne) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: %w", what, b.unreachable(err))
	}
	// The runtime answered, with an error in its stream (a pull its
	// registry refused, a model too large to load): its own words say why.
	return &answeredError{msg: what + ": " + err.Error(), err: err}
}

// answeredError is an error the runtime reported in its answer. It is
// llm.ErrUnavailable too: the model cannot be served.
type answeredError struct {
	msg string
	err error
}

func (e *answeredError) Error() string   { return e.msg }
func (e *answeredError) Unwrap() []error { return []error{e.err, llm.ErrUnavailable} }

// EnsureModel makes sure Ollama has the model: it is there already, or it
// is created from src.GGUFPath, or else pulled by name.
func (b *Backend) EnsureModel(ctx context.Context, src ModelSource) error {
	_, err := b.api.Show(ctx, &api.ShowRequest{Model: b.cfg.Model})
	if err == nil {
		return nil
	}
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusNotFound {
		return b.apiError("show model "+b.cfg.Model, err)
	}
	if src.GGUFPath != "" {
		return b.create(ctx, src)
	}
	return b.pull(ctx, src)
}

func (b *Backend) create(ctx context.Context, src ModelSource) error {
	start := time.Now()
	f, err := os.Open(src.GGUFPath)
	if err != nil {
		return fmt.Errorf("ollama: open model file: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("ollama: hash model file: %w", err)
	}
	digest := "sha256:" + hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("ollama: rewind model file: %w", err)
	}
	b.log.Info("uploading model file to runtime", "model", b.cfg.Model, "path", src.GGUFPath, "digest", digest)
	if err := b.api.CreateBlob(ctx, digest, f); err != nil {
		return b.apiError("upload model file", err)
	}
	stream := false
	req := &api.CreateRequest{
		Model:      b.cfg.Model,
		Stream:     &stream,
		Files:      map[string]string{filepath.Base(src.GGUFPath): digest},
		Template:   src.Template,
		System:     src.System,
		Parameters: src.Parameters,
	}
	if err := b.api.Create(ctx, req, func(api.ProgressResponse) error { return nil }); err != nil {
		return b.apiError("create model "+b.cfg.Model, err)
	}
	b.log.Info("model created", "model", b.cfg.Model, "took", time.Since(start))
	return nil
}

func (b *Backend) pull(ctx context.Context, src ModelSource) error {
	b.log.Info("pulling model", "model", b.cfg.Model)
	start := time.Now()
	var lastStatus string
	var lastLog time.Time
	err := b.api.Pull(ctx, &api.PullRequest{Model: b.cfg.Model, Insecure: src.Insecure}, func(p api.ProgressResponse) error {
		if src.Progress != nil {
			src.Progress(p.Status, p.Completed, p.Total)
		}
		// Log status changes, and download progress at most every 5s.
		if p.Status != lastStatus || time.Since(lastLog) > 5*time.Second {
			lastStatus, lastLog = p.Status, time.Now()
			args := []any{"model", b.cfg.Model, "status", p.Status}
			if p.Total > 0 {
				args = append(args, "completed", p.Completed, "total", p.Total)
			}
			b.log.Info("pulling model", args...)
		}
		return nil
	})
	if err != nil {
		return b.apiError("pull model "+b.cfg.Model, err)
	}
	b.log.Info("model pulled", "model", b.cfg.Model, "took", time.Since(start))
	return nil
}

// keepForever keeps the model loaded for as long as Ollama runs.
var keepForever = &api.Duration{Duration: -1}

// Warm loads the model and pins it in memory, returning how long the load
// took. The deployment is ready only after this.
func (b *Backend) Warm(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	b.watch.loadBegin()
	err := b.load(ctx, keepForever)
	b.watch.loadEnd(err == nil)
	if err != nil {
		return 0, b.apiError("load model "+b.cfg.Model, err)
	}
	took := time.Since(start)
	b.log.Info("model loaded", "model", b.cfg.Model, "took", took)
	return took, nil
}

// Unload takes the model out of memory (a load request with keep_alive 0):
// after a switch, the previous model must not keep its memory for ever.
func (b *Backend) Unload(ctx context.Context) error {
	b.watch.loadBegin()
	err := b.load(ctx, &api.Duration{Duration: 0})
	b.watch.loadEnd(false)
	if err != nil {
		return b.apiError("unload model "+b.cfg.Model, err)
	}
	return nil
}

// load sends the request that only loads the model, kept for keep: a chat
// without messages, or for an embedding model (which Ollama refuses to
// chat with) an embedding of nothing.
func (b *Backend) load(ctx context.Context, keep *api.Duration) error {
	if b.embeddingOnly(ctx) {
		_, err := b.api.Embed(ctx, &api.EmbedRequest{Model: b.cfg.Model, KeepAlive: keep})
		return err
	}
	stream := false
	return b.api.Chat(ctx, &api.ChatRequest{
		Model:     b.cfg.Model,
		Messages:  []api.Message{},
		Stream:    &stream,
		KeepAlive: keep,
	}, func(api.ChatResponse) error { return nil })
}

// embeddingOnly reports whether the runtime lists the model as an embedding
// model that cannot generate. (Any failure to tell is left to the chat
// request that follows.)
func (b *Backend) embeddingOnly(ctx context.Context) bool {
	resp, err := b.api.Show(ctx, &api.ShowRequest{Model: b.cfg.Model})
	if err != nil {
		return false
	}
	l := limitsOf(resp)
	return l.Capabilities != nil && l.Can("embedding") && !l.Can("completion")
}

// Ready implements llm.Runtime: Ollama answers and has the model loaded,
// and is neither being restarted (ErrRestarting) nor found wedged
// (ErrWedged; a probe in the background asks it for a token meanwhile, and
// its answer ends the report).
func (b *Backend) Ready(ctx context.Context) error {
	switch h, reason := b.watch.state(); h {
	case Restarting:
		return fmt.Errorf("%w: %w", llm.ErrUnavailable, ErrRestarting)
	case Degraded:
		return fmt.Errorf("%w: %w: %s; restart it", llm.ErrUnavailable, ErrWedged, reason)
	}
	ps, err := b.api.ListRunning(ctx)
	if err != nil {
		return b.apiError("list running models", err)
	}
	for _, m := range ps.Models {
		if sameModel(m.Name, b.cfg.Model) || sameModel(m.Model, b.cfg.Model) {
			return nil
		}
	}
	return fmt.Errorf("%w: model %s is not loaded", llm.ErrUnavailable, b.cfg.Model)
}

// sameModel compares model names, where a missing tag means "latest".
func sameModel(a, b string) bool {
	norm := func(s string) string {
		if i := strings.LastIndexByte(s, ':'); i < 0 || strings.Contains(s[i:], "/") {
			return s + ":latest"
		}
		return s
	}
	return norm(a) == norm(b)
}

var _ llm.Runtime = (*Backend)(nil)

// Chat implements llm.Runtime. It returns once Ollama has sent the first
// line of its answer, or failed.
//
// Ollama cannot stop in the middle of reading a prompt: a request dropped
// then is still evaluated up to its first token, only then does the
// runner notice. So when the caller gives up first (ctx ends, or the first
// line takes longer than FirstByteTimeout), the request is not dropped:
// Chat returns an error that implements llm.Abandoned and keeps the
// request open in the background until the first line arrives, then
// closes it, which stops the generation at once. The caller holds its slot
// until RuntimeDone. A runtime that sends nothing for abandonWait more
// (FirstByteTimeout again, a minute at least) is stuck rather than busy:
// the request is closed then all the same.
func (b *Backend) Chat(ctx context.Context, req *llm.Request) (llm.Stream, error) {
	body, err := b.chatBody(req)
	if err != nil {
		return nil, err
	}
	st, err := b.generation(ctx, b.chatURL, body)
	return st, schemaRefusal(err)
}

// timedOut is the error of a request with no answer within FirstByteTimeout.
func (b *Backend) timedOut() error {
	return fmt.Errorf("%w: model runtime at %s sent nothing within %s", llm.ErrTimeout, b.base, b.cfg.FirstByteTimeout)
}

// abandonWait is how long an abandoned request is kept open for the
// runtime to finish reading its prompt: its allowance for a first answer
// (FirstByteTimeout) once more, and at least minAbandonWait, since a
// prompt the caller stopped waiting for early may take that long to read.
// Past it the runtime is stuck, not busy: Ollama (0.9.6 to 0.17.4 at
// least) loses a parallel slot for good when a client leaves a stream at
// the wrong moment (ollama/ollama#17131), and every later request of the
// model then waits for a slot that never frees. Such a request must not be
// held for long: it keeps the caller's slot, and on Ollama a reference to
// the model's runner, and Ollama reloads a runner it finds broken only
// once no request holds one.
func (b *Backend) abandonWait() time.Duration {
	return max(b.cfg.FirstByteTimeout, minAbandonWait)
}

// minAbandonWait is the least abandonWait.
const minAbandonWait = time.Minute

// abandon keeps the abandoned request s open until its first line (or an
// error) arrives on first, at most abandonWait, then closes it; err, the
// caller's answer, reports when.
func (b *Backend) abandon(s *stream, first <-chan error, err error) error {
	done := make(chan struct{})
	wait := b.abandonWait()
	go func() {
		defer close(done)
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-first:
		case <-t.C:
			b.log.Warn("model runtime sent nothing for an abandoned request; closing it",
				"runtime", b.base, "model", b.cfg.Model, "waited", wait)
			// Give up: cancelling ends the read in flight.
			s.cancel(context.DeadlineExceeded)
			<-first
		}
		s.Close()
	}()
	return &abandonedError{err: err, done: done}
}

type abandonedError struct {
	err  error
	done chan struct{}
}

func (e *abandonedError) Error() string                { return e.err.Error() }
func (e *abandonedError) Unwrap() error                { return e.err }
func (e *abandonedError) RuntimeDone() <-chan struct{} { return e.done }

// statusError turns a non-200 answer into the error the API maps to a status.
// A refusal of the request's JSON schema is the client's to fix, whatever
// the status the runtime gives it (Ollama answers 500 for most).
func (b *Backend) statusError(resp *http.Response) error {
	msg := errorMessage(resp)
	if schemaRefused(msg) {
		return refusedSchema(msg)
	}
	switch resp.StatusCode {
	case http.StatusBadRequest, http.StatusUnprocessableEntity:
		return &llm.InvalidRequestError{Msg: msg}
	case http.StatusNotFound:
		return fmt.Errorf("%w: model runtime at %s does not have model %s: %s", llm.ErrUnavailable, b.base, b.cfg.Model, msg)
	default:
		return fmt.Errorf("%w: model runtime at %s answered %s: %s", llm.ErrUnavailable, b.base, resp.Status, msg)
	}
}

// errorMessage reads the message of an error answer: its JSON "error", or
// the text.
func errorMessage(resp *http.Response) string {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var e struct {
		Error string `json:"error"`
	}
	if json.Unmarshal(data, &e) == nil && e.Error != "" {
		return e.Error
	}
	return strings.TrimSpace(string(data))
}

// chatBody encodes req as an Ollama chat request.
func (b *Backend) chatBody(req *llm.Request) ([]byte, error) {
	if body, ok := b.plainChatBody(req); ok {
		return body, nil
	}
	return b.encodeChatBody(req)
}

// encodeChatBody encodes any chat request through encoding/json.
func (b *Backend) encodeChatBody(req *llm.Request) ([]byte, error) {
	stream := true
	cr := api.ChatRequest{
		Model:     b.cfg.Model,
		Messages:  make([]api.Message, len(req.Messages)),
		Stream:    &stream,
		Format:    req.Format,
		KeepAlive: keepForever,
		Options:   options(&req.Options),
	}
	for i, m := range req.Messages {
		am := api.Message{Role: m.Role, Content: m.Content, Thinking: m.Thinking}
		if m.Role == "tool" {
			am.ToolName = m.ToolName
		}
		for _, tc := range m.ToolCalls {
			var args api.ToolCallFunctionArguments
			if len(tc.Arguments) > 0 {
				if err := json.Unmarshal(tc.Arguments, &args); err != nil {
					return nil, &llm.InvalidRequestError{Msg: fmt.Sprintf("messages[%d]: tool call %q: arguments are not a JSON object: %v", i, tc.Name, err)}
				}
			}
			am.ToolCalls = append(am.ToolCalls, api.ToolCall{Function: api.ToolCallFunction{Name: tc.Name, Arguments: args}})
		}
		cr.Messages[i] = am
	}
	for i, t := range req.Tools {
		at := api.Tool{Type: "function"}
		at.Function.Name = t.Name
		at.Function.Description = t.Description
		if len(t.Parameters) > 0 && string(t.Parameters) != "null" {
			if err := json.Unmarshal(t.Parameters, &at.Function.Parameters); err != nil {
				return nil, &llm.InvalidRequestError{Msg: fmt.Sprintf("tools[%d] (%s): unsupported parameters schema: %v", i, t.Name, err)}
			}
		}
		if at.Function.Parameters.Type == "" {
			at.Function.Parameters.Type = "object"
		}
		cr.Tools = append(cr.Tools, at)
	}
	body, err := json.Marshal(&chatRequest{ChatRequest: cr, Logprobs: req.Options.Logprobs, TopLogprobs: req.Options.TopLogprobs,
		Think: think(req.Options.Think)})
	if err != nil {
		return nil, fmt.Errorf("ollama: encode chat request: %w", err)
	}
	return body, nil
}

// plainChatBody encodes by hand what nearly every request is: messages of
// text, no tools, no format. encoding/json's reflection over
// api.ChatRequest (and the options map) was a third of the request's own
// cost in hearthd; anything else goes through it. ok is false for a
// request it does not cover. TestPlainChatBody holds both to the same JSON.
func (b *Backend) plainChatBody(req *llm.Request) (body []byte, ok bool) {
	if len(req.Tools) > 0 || len(req.Format) > 0 {
		return nil, false
	}
	size := 160 + len(b.cfg.Model)
	for _, m := range req.Messages {
		if len(m.ToolCalls) > 0 {
			return nil, false
		}
		size += 56 + len(m.Role) + len(m.Content) + len(m.Thinking) + len(m.ToolName)
	}
	o := &req.Options
	w := make([]byte, 0, size)
	w = append(w, `{"model":`...)
	w = jsonw.AppendString(w, b.cfg.Model)
	w = append(w, `,"messages":[`...)
	for i, m := range req.Messages {
		if i > 0 {
			w = append(w, ',')
		}
		w = append(w, `{"role":`...)
		w = jsonw.AppendString(w, m.Role)
		w = append(w, `,"content":`...)
		w = jsonw.AppendString(w, m.Content)
		if m.Thinking != "" {
			w = append(w, `,"thinking":`...)
			w = jsonw.AppendString(w, m.Thinking)
		}
		if m.Role == "tool" && m.ToolName != "" {
			w = append(w, `,"tool_name":`...)
			w = jsonw.AppendString(w, m.ToolName)
		}
		w = append(w, '}')
	}
	// keep_alive -1 is keepForever as api.Duration writes it.
	w = append(w, `],"stream":true,"keep_alive":-1,"options":`...)
	opts := len(w)
	w = append(w, '{')
	w = appendFloatOpt(w, "temperature", o.Temperature)
	w = appendFloatOpt(w, "top_p", o.TopP)
	if o.MaxTokens != nil {
		w = strconv.AppendInt(appendKey(w, "num_predict"), int64(*o.MaxTokens), 10)
	}
	if o.Stop != nil {
		w = append(appendKey(w, "stop"), '[')
		for i, s := range o.Stop {
			if i > 0 {
				w = append(w, ',')
			}
			w = jsonw.AppendString(w, s)
		}
		w = append(w, ']')
	}
	if o.Seed != nil {
		w = strconv.AppendInt(appendKey(w, "seed"), *o.Seed, 10)
	}
	w = appendFloatOpt(w, "presence_penalty", o.PresencePenalty)
	w = appendFloatOpt(w, "frequency_penalty", o.FrequencyPenalty)
	if o.TopK != nil {
		w = strconv.AppendInt(appendKey(w, "top_k"), max(*o.TopK, 0), 10) // as options()
	}
	w = appendFloatOpt(w, "min_p", o.MinP)
	w = appendFloatOpt(w, "repeat_penalty", o.RepetitionPenalty)
	if len(w) == opts+1 {
		w = append(w[:opts], "null"...) // options() gives nil: no option set
	} else {
		w = append(w, '}')
	}
	if o.Logprobs {
		w = append(w, `,"logprobs":true`...)
	}
	if o.TopLogprobs != 0 {
		w = strconv.AppendInt(append(w, `,"top_logprobs":`...), int64(o.TopLogprobs), 10)
	}
	if t := think(o.Think); t != nil {
		w = strconv.AppendBool(append(w, `,"think":`...), *t)
	}
	return append(w, '}'), true
}

// appendKey appends "key": after a comma unless the object just opened.
func appendKey(w []byte, key string) []byte {
	if w[len(w)-1] != '{' {
		w = append(w, ',')
	}
	w = append(append(append(w, '"'), key...), `":`...)
	return w
}

// appendFloatOpt appends "key":v if v is set. The options were checked in
// range when decoded, so v is finite.
func appendFloatOpt(w []byte, key string, v *float64) []byte {
	if v == nil {
		return w
	}
	return strconv.AppendFloat(appendKey(w, key), *v, 'g', -1, 64)
}

// chatRequest is api.ChatRequest with the fields of current Ollama that the
// api package this module builds with (the oldest supported version's)
// does not have yet.
type chatRequest struct {
	api.ChatRequest
	Logprobs    bool `json:"logprobs,omitempty"`
	TopLogprobs int  `json:"top_logprobs,omitempty"`
	// Think is Ollama's think flag. Current Ollama also takes an effort
	// ("low", "medium", "high") for the models that have levels, but the
	// oldest supported version refuses anything but a bool, so an effort
	// is sent as true.
	Think *bool `json:"think,omitempty"`
}

// think is Options.Think as Ollama's think: unset, false for "none", else
// true.
func think(effort string) *bool {
	if effort == "" {
		return nil
	}
	on := effort != llm.ThinkNone
	return &on
}

// options returns only the options the client set, in Ollama's names.
func options(o *llm.Options) map[string]any {
	m := make(map[string]any, 7)
	if o.Temperature != nil {
		m["temperature"] = *o.Temperature
	}
	if o.TopP != nil {
		m["top_p"] = *o.TopP
	}
	if o.MaxTokens != nil {
		m["num_predict"] = *o.MaxTokens
	}
	if o.Stop != nil {
		m["stop"] = o.Stop
	}
	if o.Seed != nil {
		m["seed"] = *o.Seed
	}
	if o.PresencePenalty != nil {
		m["presence_penalty"] = *o.PresencePenalty
	}
	if o.FrequencyPenalty != nil {
		m["frequency_penalty"] = *o.FrequencyPenalty
	}
	if o.TopK != nil {
		m["top_k"] = max(*o.TopK, 0) // vLLM's -1 (off) is Ollama's 0
	}
	if o.MinP != nil {
		m["min_p"] = *o.MinP
	}
	if o.RepetitionPenalty != nil {
		m["repeat_penalty"] = *o.RepetitionPenalty
	}
	if len(m) == 0 {
		return nil
	}
	return m
}
