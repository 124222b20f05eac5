package deployapi

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/certreload"
	"github.com/hearthd/hearth/internal/certreload/certtest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/metrics"
)

const testModel = "hearth-tiny"

type testAPI struct {
	url    string // base URL of /api/v1
	root   string // scheme://host
	api    *API
	rt     *fake.Runtime
	keys   *apikeys.Static
	secret string
	keyID  string
	// client trusts the API's certificate when it serves TLS (tlsConf;
	// serverTLS is the server's side).
	client    *http.Client
	tlsConf   *tls.Config
	serverTLS *tls.Config
	caFile    string // the CA's certificate, for clients of other programs
}

func startAPI(t *testing.T, fc fake.Config, mod func(*APIConfig)) *testAPI {
	t.Helper()
	return startAPIOver(t, false, fc, mod)
}

// startAPIOver is startAPI, serving TLS if overTLS.
func startAPIOver(t *testing.T, overTLS bool, fc fake.Config, mod func(*APIConfig)) *testAPI {
	t.Helper()
	return startAPILogOver(t, overTLS, fc, mod, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// startAPILog is startAPI with the API logging to log.
func startAPILog(t *testing.T, fc fake.Config, mod func(*APIConfig), log *slog.Logger) *testAPI {
	t.Helper()
	return startAPILogOver(t, false, fc, mod, log)
}

func startAPILogOver(t *testing.T, overTLS bool, fc fake.Config, mod func(*APIConfig), log *slog.Logger) *testAPI {
	t.Helper()
	cfg := APIConfig{
		Model:             testModel,
		Version:           "test",
		MaxConcurrent:     8,
		MaxQueue:          8,
		MaxBodyBytes:      64 << 10,
		WriteStallTimeout: 5 * time.Second,
	}
	if mod != nil {
		mod(&cfg)
	}
	rt := fake.New(fc)
	ta := serveAPIOver(t, overTLS, cfg, rt, log)
	ta.rt = rt
	return ta
}

// overBoth runs f over plain HTTP and over TLS: a stream takes the same
// path on both.
func overBoth(t *testing.T, f func(t *testing.T, overTLS bool)) {
	t.Helper()
	for _, overTLS := range []bool{false, true} {
		if testing.Short() && !overTLS {
			continue // the unit tier takes the production path; make test both
		}
		name := "http"
		if overTLS {
			name = "tls"
		}
		t.Run(name, func(t *testing.T) { f(t, overTLS) })
	}
}

// serveAPI serves an API over rt, with one key, on a loopback port until
// the test ends.
func serveAPI(t *testing.T, cfg APIConfig, rt llm.Runtime, log *slog.Logger) *testAPI {
	t.Helper()
	return serveAPIOver(t, false, cfg, rt, log)
}

// serveAPIOver is serveAPI, over TLS if overTLS (a certificate of a test
// CA, reloaded as in production).
func serveAPIOver(t *testing.T, overTLS bool, cfg APIConfig, rt llm.Runtime, log *slog.Logger) *testAPI {
	t.Helper()
	keys := apikeys.NewStatic()
	secret, key := keys.Add("test")
	api := NewAPI(cfg, rt, keys, metrics.NewNode("test"), log)
	api.SetWarm(true)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ta := &testAPI{api: api, keys: keys, secret: secret, keyID: key.ID}
	root := "http://" + ln.Addr().String()
	tr := &http.Transport{}
	if overTLS {
		ca := certtest.NewCA(t)
		files := certtest.NewDir(t)
		c, k := ca.Issue(t, 1, time.Now().Add(24*time.Hour))
		files.Renew(t, c, k)
		r, err := certreload.New(files.Cert(), files.Key(), discardLog())
		if err != nil {
			t.Fatal(err)
		}
		ta.serverTLS = TLSConfig(r)
		ln = tls.NewListener(ln, ta.serverTLS)
		root = "https://" + strings.TrimPrefix(root, "http://")
		ta.tlsConf = &tls.Config{RootCAs: ca.Pool}
		ta.caFile = filepath.Join(t.TempDir(), "ca.pem")
		if err := os.WriteFile(ta.caFile, ca.PEM(), 0o600); err != nil {
			t.Fatal(err)
		}
		tr.TLSClientConfig = ta.tlsConf
	}
	srv := api.Server(5*time.Second, 5*time.Second)
	go func() { _ = srv.Serve(Listener(ln)) }()
	ta.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		api.Close()
		_ = srv.Shutdown()
	})
	ta.url, ta.root = root+"/api/v1", root
	return ta
}

// addr is the API's host:port.
func (ta *testAPI) addr() string {
	_, hostPort, _ := strings.Cut(ta.root, "://")
	return hostPort
}

// dial opens a connection to the API, over TLS if it serves TLS.
func (ta *testAPI) dial() (net.Conn, error) {
	if ta.tlsConf != nil {
		return tls.Dial("tcp", ta.addr(), ta.tlsConf)
	}
	return net.Dial("tcp", ta.addr())
}

// get GETs path below the root and returns the status.
func (ta *testAPI) get(t *testing.T, path string) int {
	t.Helper()
	r, err := ta.client.Get(ta.root + path)
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	return r.StatusCode
}

func (ta *testAPI) post(t *testing.T, body string, hdr map[string]string) *http.Response {
	t.Helper()
	return ta.postTo(t, "/chat/completions", body, hdr)
}

// postTo POSTs body to path below /api/v1 with the test key.
func (ta *testAPI) postTo(t *testing.T, path, body string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest("POST", ta.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func decodeJSON(t *testing.T, r io.Reader) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		t.Fatal(err)
	}
	return m
}

// sseEvent is one `data:` payload with the time it arrived.
type sseEvent struct {
	data string
	at   time.Time
}

func readSSE(t *testing.T, r io.Reader) []sseEvent {
	t.Helper()
	var out []sseEvent
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("unexpected SSE line %q", line)
		}
		out = append(out, sseEvent{data: data, at: time.Now()})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func chunkOf(t *testing.T, e sseEvent) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(e.data), &m); err != nil {
		t.Fatalf("chunk %q: %v", e.data, err)
	}
	return m
}

func TestNonStreamCompletion(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"Hello", " world"}, PromptTokens: 7}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	m := decodeJSON(t, resp.Body)
	id, _ := m["id"].(string)
	if !strings.HasPrefix(id, "chatcmpl-") || len(id) < len("chatcmpl-")+24 {
		t.Errorf("id %q", id)
	}
	if m["object"] != "chat.completion" || m["model"] != testModel {
		t.Errorf("object/model: %v %v", m["object"], m["model"])
	}
	if fp, _ := m["system_fingerprint"].(string); !strings.HasPrefix(fp, "fp_") {
		t.Errorf("system_fingerprint %q", fp)
	}
	if _, ok := m["created"].(float64); !ok {
		t.Errorf("created missing")
	}
	ch := m["choices"].([]any)[0].(map[string]any)
	msg := ch["message"].(map[string]any)
	if msg["role"] != "assistant" || msg["content"] != "Hello world" {
		t.Errorf("message %v", msg)
	}
	if ch["finish_reason"] != "stop" {
		t.Errorf("finish_reason %v", ch["finish_reason"])
	}
	u := m["usage"].(map[string]any)
	if u["prompt_tokens"] != 7.0 || u["completion_tokens"] != 2.0 || u["total_tokens"] != 9.0 {
		t.Errorf("usage %v", u)
	}
	if got := ta.keys.Usage(ta.keyID); got.Requests != 1 || got.CompletionTokens != 2 || got.PromptTokens != 7 {
		t.Errorf("recorded usage %+v", got)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}
}

func TestCompletionIDsAreUnique(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	seen := map[string]bool{}
	for range 20 {
		resp := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
		m := decodeJSON(t, resp.Body)
		resp.Body.Close()
		id := m["id"].(string)
		if seen[id] {
			t.Fatalf("duplicate id %s", id)
		}
		seen[id] = true
	}
}

func TestStreamWireFormat(t *testing.T) { overBoth(t, testStreamWireFormat) }

func testStreamWireFormat(t *testing.T, overTLS bool) {
	for _, includeUsage := range []bool{false, true} {
		t.Run(fmt.Sprintf("include_usage=%v", includeUsage), func(t *testing.T) {
			ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"a", "b", "c"}, PromptTokens: 4}, nil)
			body := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			if includeUsage {
				body = `{"model":"hearth-tiny","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`
			}
			resp := ta.post(t, body, nil)
			defer resp.Body.Close()
			if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			evs := readSSE(t, resp.Body)
			if evs[len(evs)-1].data != "[DONE]" {
				t.Fatalf("last event %q", evs[len(evs)-1].data)
			}
			chunks := evs[:len(evs)-1]
			var id string
			var created float64
			var content strings.Builder
			sawFinish := false
			for i, e := range chunks {
				c := chunkOf(t, e)
				if i == 0 {
					id, created = c["id"].(string), c["created"].(float64)
				}
				if c["id"] != id || c["created"] != created || c["object"] != "chat.completion.chunk" || c["model"] != testModel {
					t.Fatalf("chunk %d header mismatch: %v", i, c)
				}
				if _, ok := c["system_fingerprint"].(string); !ok {
					t.Fatalf("chunk %d lacks system_fingerprint", i)
				}
				u, hasUsage := c["usage"]
				if includeUsage != hasUsage {
					t.Fatalf("chunk %d usage present=%v want %v", i, hasUsage, includeUsage)
				}
				choices := c["choices"].([]any)
				if includeUsage && i == len(chunks)-1 {
					if len(choices) != 0 {
						t.Fatalf("usage chunk has choices %v", choices)
					}
					um := u.(map[string]any)
					if um["prompt_tokens"] != 4.0 || um["completion_tokens"] != 3.0 || um["total_tokens"] != 7.0 {
						t.Fatalf("usage %v", um)
					}
					continue
				}
				if includeUsage && u != nil {
					t.Fatalf("chunk %d usage %v, want null", i, u)
				}
				ch := choices[0].(map[string]any)
				delta := ch["delta"].(map[string]any)
				switch {
				case i == 0:
					if delta["role"] != "assistant" {
						t.Fatalf("first delta %v", delta)
					}
				case ch["finish_reason"] != nil:
					if ch["finish_reason"] != "stop" || len(delta) != 0 {
						t.Fatalf("finish chunk %v", ch)
					}
					sawFinish = true
				default:
					if _, ok := delta["role"]; ok || len(delta) != 1 {
						t.Fatalf("content delta %v carries more than content", delta)
					}
					content.WriteString(delta["content"].(string))
				}
			}
			if !sawFinish || content.String() != "abc" {
				t.Fatalf("finish=%v content=%q", sawFinish, content.String())
			}
		})
	}
}

// Each event must reach the client when it is produced: the first content
// chunk arrives while the runtime is still generating.
func TestStreamFlushesPerEvent(t *testing.T) { overBoth(t, testStreamFlushesPerEvent) }

func testStreamFlushesPerEvent(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 5, TokenDelay: 150 * time.Millisecond}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	contentChunks := 0
	for contentChunks < 1 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":"x"`) {
			contentChunks++
		}
	}
	st := ta.rt.LastStream()
	if st.Finished() {
		t.Fatal("first content chunk arrived only after the generation finished: events are batched")
	}
	if n := st.Sent(); n >= 5 {
		t.Fatalf("runtime had sent %d of 5 tokens before the client saw the first", n)
	}
	_, _ = io.Copy(io.Discard, br)
}

// A client that disconnects mid-stream cancels the generation at once: the
// next token is 30 s away, so no failed write could be what notices.
func TestDisconnectCancelsGeneration(t *testing.T) { overBoth(t, testDisconnectCancelsGeneration) }

func testDisconnectCancelsGeneration(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 2, TokenDelay: slowToken}, nil)
	conn := ta.streamUntil(t, "/chat/completions", `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`"content":"x"`)
	leave(t, conn, ta.rt.LastStream())
}

// streamUntil POSTs body to path on a raw connection and reads the stream
// until a line holds marker; the caller closes the connection.
func (ta *testAPI) streamUntil(t *testing.T, path, body, marker string) net.Conn {
	t.Helper()
	conn, err := ta.dial()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /api/v1%s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		path, ta.secret, len(body), body)
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, marker) {
			return conn
		}
	}
}

// A client that leaves before the first token (long prefill) also cancels.
func TestDisconnectBeforeFirstToken(t *testing.T) { overBoth(t, testDisconnectBeforeFirstToken) }

func testDisconnectBeforeFirstToken(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{FirstTokenDelay: slowToken}, nil)
	conn, err := ta.dial()
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	fmt.Fprintf(conn, "POST /api/v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", ta.secret, len(body), body)
	testutil.WaitFor(t, 10*time.Second, "the generation to start", func() bool { return ta.rt.LastStream() != nil })
	leave(t, conn, ta.rt.LastStream())
}

// slowToken is how long the disconnect tests' runtimes take for their next
// token: far beyond leave's bound, so that only hearth's watch on the
// peer's close can end the generation in time, and short enough that a
// broken build fails rather than hangs (the server waits out the
// generation when the test ends).
const slowToken = 30 * time.Second

// leave closes the client's connection and fails unless that cancels the
// generation st within 10 s: a bound for a broken build, not a measurement.
func leave(t *testing.T, conn net.Conn, st *fake.StreamInfo) {
	t.Helper()
	conn.Close()
	select {
	case <-st.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("generation still running 10 s after the client left")
	}
	if cancelled, _ := st.Cancelled(); !cancelled {
		t.Fatal("stream ended without being cancelled")
	}
}

func TestQueueFullGives429(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"x"}, TokenCount: 1000, TokenDelay: 20 * time.Millisecond},
		func(c *APIConfig) { c.MaxConcurrent, c.MaxQueue = 1, 1 })
	body := `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for range 2 { // one runs, one waits in the queue
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", ta.url+"/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+ta.secret)
			if resp, err := ta.client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "one generation running and one queued", func() bool {
		return ta.api.lim.active() == 1 && ta.api.lim.queued() == 1
	})
	resp := ta.post(t, body, nil)
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if e := m["error"].(map[string]any); e["code"] != "rate_limit_exceeded" {
		t.Fatalf("error %v", e)
	}
	cancel()
	wg.Wait()
	// Slots come back once the clients are gone.
	testutil.WaitFor(t, 10*time.Second, "the generation slot back (else it leaked)", func() bool { return ta.api.lim.active() == 0 })
}

func errorOf(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	defer resp.Body.Close()
	m := decodeJSON(t, resp.Body)
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("no error object in %v", m)
	}
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := e[k]; !ok {
			t.Fatalf("error lacks %q: %v", k, e)
		}
	}
	if msg, _ := e["message"].(string); msg == "" {
		t.Fatalf("empty message: %v", e)
	}
	return e
}

func TestBadInput(t *testing.T) {
	ta := startAPI(t, fake.Config{}, func(c *APIConfig) { c.MaxConcurrentPerKey = 4 })
	revokedSecret, revoked := ta.keys.Add("gone")
	if err := ta.keys.Revoke(revoked.ID); err != nil {
		t.Fatal(err)
	}
	good := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	cases := []struct {
		name   string
		body   string
		auth   string // "" keeps the valid key; "-" sends none
		status int
		code   string
		param  string
	}{
		{"malformed JSON", `{"model":`, "", 400, "", ""},
		{"not an object", `[1,2]`, "", 400, "", ""},
		{"empty body", ``, "", 400, "", ""},
		{"messages wrong type", `{"model":"hearth-tiny","messages":"hi"}`, "", 400, "", "messages"},
		{"missing messages", `{"model":"hearth-tiny"}`, "", 400, "", "messages"},
		{"empty messages", `{"model":"hearth-tiny","messages":[]}`, "", 400, "", "messages"},
		{"unknown role", `{"model":"hearth-tiny","messages":[{"role":"wizard","content":"x"}]}`, "", 400, "", "messages[0].role"},
		{"content wrong type", `{"model":"hearth-tiny","messages":[{"role":"user","content":5}]}`, "", 400, "", "messages[0].content"},
		{"temperature wrong type", `{"model":"hearth-tiny","temperature":"hot","messages":[{"role":"user","content":"x"}]}`, "", 400, "", "temperature"},
		{"temperature out of range", `{"model":"hearth-tiny","temperature":3,"messages":[{"role":"user","content":"x"}]}`, "", 400, "", "temperature"},
		{"n above the cap", `{"model":"hearth-tiny","n":9,"messages":[{"role":"user","content":"x"}]}`, "", 400, "", "n"},
		{"n above the slots", `{"model":"hearth-tiny","n":8,"messages":[{"role":"user","content":"x"}]}`, "", 400, "integer_above_max_value", "n"},
		{"tool_choice names a missing tool", `{"model":"hearth-tiny","tools":[{"type":"function","function":{"name":"f"}}],` +
			`"tool_choice":{"type":"function","function":{"name":"g"}},"messages":[{"role":"user","content":"x"}]}`, "", 400, "", "tool_choice"},
		{"logit_bias", `{"model":"hearth-tiny","logit_bias":{"1":2},"messages":[{"role":"user","content":"x"}]}`, "", 400, "", "logit_bias"},
		{"unknown field", `{"model":"hearth-tiny","frobnicate":1,"messages":[{"role":"user","content":"x"}]}`, "", 400, "", "frobnicate"},
		{"missing model", `{"messages":[{"role":"user","content":"x"}]}`, "", 400, "", "model"},
		{"other model", `{"model":"gpt-4o","messages":[{"role":"user","content":"x"}]}`, "", 404, "model_not_found", ""},
		{"huge body", `{"model":"hearth-tiny","messages":[{"role":"user","content":"` + strings.Repeat("a", 70<<10) + `"}]}`, "", 413, "", ""},
		{"no key", good, "-", 401, "invalid_api_key", ""},
		{"malformed key", good, "Bearer hearth_live_short", 401, "invalid_api_key", ""},
		{"foreign prefix", good, "Bearer sk-proj-abcdefghijklmnopqrstuvwxyz0123456789", 401, "invalid_api_key", ""},
		{"wrong scheme", good, "Basic " + ta.secret, 401, "invalid_api_key", ""},
		{"unknown key", good, "Bearer hearth_live_" + strings.Repeat("A", 32), 401, "invalid_api_key", ""},
		{"revoked key", good, "Bearer " + revokedSecret, 401, "invalid_api_key", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hdr := map[string]string{}
			switch c.auth {
			case "":
			case "-":
				hdr["Authorization"] = ""
			default:
				hdr["Authorization"] = c.auth
			}
			resp := ta.post(t, c.body, hdr)
			if resp.StatusCode != c.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d want %d: %s", resp.StatusCode, c.status, b)
			}
			e := errorOf(t, resp)
			if c.code != "" && e["code"] != c.code {
				t.Errorf("code %v want %s", e["code"], c.code)
			}
			if c.param != "" && e["param"] != c.param {
				t.Errorf("param %v want %s", e["param"], c.param)
			}
			if c.status == 400 && e["type"] != "invalid_request_error" {
				t.Errorf("type %v", e["type"])
			}
		})
	}
	// The daemon keeps serving, and nothing reached the runtime.
	if n := ta.rt.Calls(); n != 0 {
		t.Errorf("runtime called %d times for rejected requests", n)
	}
	resp := ta.post(t, good, nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("good request after bad ones: %d", resp.StatusCode)
	}
}

func TestRevocationTakesEffectOnNextRequest(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	good := `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`
	resp := ta.post(t, good, nil)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	if err := ta.keys.Revoke(ta.keyID); err != nil {
		t.Fatal(err)
	}
	resp = ta.post(t, good, nil)
	if resp.StatusCode != 401 {
		t.Fatalf("after revoke: %d", resp.StatusCode)
	}
	errorOf(t, resp)
}

func TestRuntimeUnavailable(t *testing.T) {
	down := fmt.Errorf("dial: %w", llm.ErrUnavailable)
	ta := startAPI(t, fake.Config{ChatErr: down, ReadyErr: down}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if e := errorOf(t, resp); !strings.Contains(e["message"].(string), "runtime") {
		t.Errorf("message %v does not say what is wrong", e["message"])
	}
	if code := ta.get(t, "/readyz"); code != 503 {
		t.Errorf("readyz %d, want 503", code)
	}
	if code := ta.get(t, "/healthz"); code != 200 {
		t.Errorf("healthz %d, want 200", code)
	}
}

func TestRuntimeErrorsMapToStatus(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
	}{
		{fmt.Errorf("slow: %w", llm.ErrTimeout), 504},
		{&llm.InvalidRequestError{Msg: "bad schema"}, 400},
		{errors.New("weird"), 502},
	} {
		ta := startAPI(t, fake.Config{ChatErr: c.err}, nil)
		resp := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
		if resp.StatusCode != c.status {
			t.Errorf("%v: status %d want %d", c.err, resp.StatusCode, c.status)
		}
		errorOf(t, resp)
	}
}

func TestNotWarmGives503AndReadyzFalse(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	ta.api.SetWarm(false)
	resp := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 503 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	errorOf(t, resp)
	if code := ta.get(t, "/readyz"); code != 503 {
		t.Fatalf("readyz %d", code)
	}
	ta.api.SetWarm(true)
	if code := ta.get(t, "/readyz"); code != 200 {
		t.Fatalf("readyz after warm %d", code)
	}
}

func TestMidStreamFailureEndsWithErrorEvent(t *testing.T) {
	overBoth(t, testMidStreamFailureEndsWithErrorEvent)
}

func testMidStreamFailureEndsWithErrorEvent(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 10, StreamErr: errors.New("runner died"), FailAfter: 2}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	evs := readSSE(t, resp.Body)
	if evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("stream did not end cleanly: %v", evs)
	}
	errEv := chunkOf(t, evs[len(evs)-2])
	if _, ok := errEv["error"].(map[string]any); !ok {
		t.Fatalf("no error event before [DONE]: %v", errEv)
	}
}

func TestModels(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	get := func(path string) *http.Response {
		req, _ := http.NewRequest("GET", ta.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+ta.secret)
		resp, err := ta.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := get("/models")
	m := decodeJSON(t, resp.Body)
	resp.Body.Close()
	data := m["data"].([]any)
	if m["object"] != "list" || len(data) != 1 || data[0].(map[string]any)["id"] != testModel || data[0].(map[string]any)["object"] != "model" {
		t.Fatalf("models %v", m)
	}
	resp = get("/models/" + testModel)
	m = decodeJSON(t, resp.Body)
	resp.Body.Close()
	if m["id"] != testModel || m["owned_by"] == nil {
		t.Fatalf("model %v", m)
	}
	resp = get("/models/gpt-4")
	if resp.StatusCode != 404 || errorOf(t, resp)["code"] != "model_not_found" {
		t.Fatalf("unknown model: %d", resp.StatusCode)
	}
	resp = get("/nope")
	if resp.StatusCode != 404 {
		t.Fatalf("unknown route %d", resp.StatusCode)
	}
	errorOf(t, resp)
	req, _ := http.NewRequest("DELETE", ta.url+"/models", nil)
	resp, _ = ta.client.Do(req)
	if resp.StatusCode != 405 {
		t.Fatalf("DELETE /models: %d", resp.StatusCode)
	}
	errorOf(t, resp)
}

func TestUnsentOptionsStayUnset(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
	resp.Body.Close()
	o := ta.rt.LastRequest().Options
	if o.Temperature != nil || o.TopP != nil || o.MaxTokens != nil || o.Seed != nil || o.Stop != nil ||
		o.PresencePenalty != nil || o.FrequencyPenalty != nil {
		t.Fatalf("options the client did not send reached the runtime: %+v", o)
	}
	resp = ta.post(t, `{"model":"hearth-tiny","temperature":0,"seed":7,"max_tokens":5,"stop":"END","messages":[{"role":"user","content":"hi"}]}`, nil)
	resp.Body.Close()
	o = ta.rt.LastRequest().Options
	if o.Temperature == nil || *o.Temperature != 0 || o.Seed == nil || *o.Seed != 7 || o.MaxTokens == nil || *o.MaxTokens != 5 ||
		len(o.Stop) != 1 || o.Stop[0] != "END" {
		t.Fatalf("options not mapped: %+v", o)
	}
}

func TestDrainFinishesInFlightStreams(t *testing.T) { overBoth(t, testDrainFinishesInFlightStreams) }

func testDrainFinishesInFlightStreams(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 10, TokenDelay: 30 * time.Millisecond}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	defer resp.Body.Close()
	// The first event: the stream is under way, and in flight for Drain.
	body := bufio.NewReader(resp.Body)
	if line, err := body.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first SSE line %q, %v", line, err)
	}
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		drained <- ta.api.Drain(ctx)
	}()
	evs := readSSE(t, body)
	if len(evs) < 10 || evs[len(evs)-1].data != "[DONE]" {
		t.Fatalf("in-flight stream did not finish: %d more events", len(evs))
	}
	if err := <-drained; err != nil {
		t.Fatal(err)
	}
	// The stream's connection closed at its end (a draining server keeps
	// none open); a new one is answered 503.
	ta.client.CloseIdleConnections()
	r := ta.post(t, `{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`, nil)
	if r.StatusCode != 503 {
		t.Fatalf("new request while draining: %d", r.StatusCode)
	}
	errorOf(t, r)
	if code := ta.get(t, "/readyz"); code != 503 {
		t.Fatalf("readyz while draining: %d", code)
	}
}

// /readyz quotes the runtime's error as JSON, whatever bytes it holds:
// control characters, quotes, invalid UTF-8 and U+2028 included (Go's
// strconv quoting, used before, wrote \x01 and \a, which is not JSON).
func TestReadyzQuotesTheErrorAsJSON(t *testing.T) {
	msg := "dial \x00\x01\a\x1b[31m \"quoted\" \\ back\nline \xff\xfe \u2028 end"
	ta := startAPI(t, fake.Config{ReadyErr: errors.New(msg)}, nil)
	resp, err := ta.client.Get(ta.root + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !json.Valid(body) {
		t.Fatalf("readyz %d: invalid JSON %q", resp.StatusCode, body)
	}
	var got struct {
		Ready  bool   `json:"ready"`
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	// encoding/json's reading of the same message is the reference.
	ref, _ := json.Marshal("model runtime: " + msg)
	var want string
	_ = json.Unmarshal(ref, &want)
	if got.Ready || got.Reason != want {
		t.Fatalf("readyz %+v, want reason %q", got, want)
	}
}
