package deployapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
)

// startSwitchAPI starts the API serving hearth-tiny on a runtime whose
// streams stop after their first token until release is closed.
func startSwitchAPI(t *testing.T, mod func(*APIConfig)) (ta *testAPI, release chan struct{}) {
	release = make(chan struct{})
	return startAPI(t, fake.Config{Tokens: []string{"a", "b", "c"}, Hold: release}, mod), release
}

// sse reads a stream's events up to [DONE].
type sse struct{ r *bufio.Reader }

func (s sse) next(t *testing.T) string {
	t.Helper()
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended: %v", err)
		}
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
			return d
		}
	}
}

func (s sse) rest(t *testing.T) []string {
	t.Helper()
	var out []string
	for {
		d := s.next(t)
		out = append(out, d)
		if d == "[DONE]" {
			return out
		}
	}
}

func (ta *testAPI) stream(t *testing.T, model string) (*http.Response, sse) {
	t.Helper()
	resp := ta.post(t, `{"model":"`+model+`","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("stream on %s: %d", model, resp.StatusCode)
	}
	return resp, sse{bufio.NewReader(resp.Body)}
}

func (ta *testAPI) modelsID(t *testing.T) string {
	t.Helper()
	req, _ := http.NewRequest("GET", ta.url+"/models", nil)
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := decodeJSON(t, resp.Body)
	return m["data"].([]any)[0].(map[string]any)["id"].(string)
}

func (g *gate) state() (switching bool, active, waiting int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.switching != nil, g.active, g.waiting
}

// A switch lets the stream in flight on the old model finish on it, holds
// new requests until the new model is loaded, then serves them from it;
// /models and the model check follow the switch.
func TestSwitchDrainsThenServesTheNewModel(t *testing.T) {
	ta, release := startSwitchAPI(t, nil)
	next := fake.New(fake.Config{Tokens: []string{"new"}})
	resp, s1 := ta.stream(t, testModel)
	defer resp.Body.Close()
	if d := s1.next(t); !strings.Contains(d, `"model":"hearth-tiny"`) {
		t.Fatalf("first event %s", d)
	}

	loading, loaded := make(chan struct{}), make(chan struct{})
	switched := make(chan error, 1)
	go func() {
		switched <- ta.api.Switch(context.Background(), "model-b", next, time.Hour, func(context.Context) error {
			close(loading)
			<-loaded
			return nil
		})
	}()
	testutil.WaitFor(t, 10*time.Second, "the switch under way", func() bool { sw, _, _ := ta.api.gate.state(); return sw })

	// A request for the new model waits for the switch.
	type answer struct {
		code int
		body string
	}
	waited := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("POST", ta.url+"/chat/completions",
			strings.NewReader(`{"model":"model-b","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+ta.secret)
		r, err := ta.client.Do(req)
		if err != nil {
			waited <- answer{0, err.Error()}
			return
		}
		defer r.Body.Close()
		var m struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&m)
		waited <- answer{r.StatusCode, m.Model}
	}()
	testutil.WaitFor(t, 10*time.Second, "the new request waiting", func() bool { _, _, w := ta.api.gate.state(); return w == 1 })
	if id := ta.modelsID(t); id != testModel {
		t.Fatalf("/models during the switch: %s", id)
	}
	select {
	case <-loading:
		t.Fatal("the new model loads while a stream runs on the old one")
	default:
	}

	// The old stream finishes, on the old model.
	close(release)
	for _, d := range s1.rest(t) {
		if d != "[DONE]" && !strings.Contains(d, `"model":"hearth-tiny"`) {
			t.Fatalf("old stream event %s", d)
		}
	}
	<-loading
	if _, _, w := ta.api.gate.state(); w != 1 {
		t.Fatal("the waiting request did not wait for the load")
	}
	close(loaded)
	if err := <-switched; err != nil {
		t.Fatal(err)
	}
	if a := <-waited; a != (answer{200, "model-b"}) || next.Calls() != 1 {
		t.Fatalf("request during the switch: %+v (new runtime called %d times)", a, next.Calls())
	}
	if id, m := ta.modelsID(t), ta.api.Model(); id != "model-b" || m != "model-b" {
		t.Fatalf("/models after the switch: %s (%s)", id, m)
	}
	r := ta.post(t, hiBody, nil)
	if e := errorOf(t, r); r.StatusCode != 404 || e["code"] != "model_not_found" {
		t.Fatalf("the old model after the switch: %d %v", r.StatusCode, e)
	}
	if _, a, _ := ta.api.gate.state(); a != 0 {
		t.Fatalf("%d requests still counted in the gate", a)
	}
}

// A stream still running when the drain time is up is ended cleanly: an
// error event and [DONE]. A request waiting longer than SwitchWait gets
// 503 with Retry-After. A load that fails leaves the old model serving.
func TestSwitchDrainTimeoutAndFailedLoad(t *testing.T) {
	ta, release := startSwitchAPI(t, func(c *APIConfig) { c.SwitchWait = time.Nanosecond })
	next := fake.New(fake.Config{})
	resp, s1 := ta.stream(t, testModel)
	defer resp.Body.Close()
	s1.next(t)

	loading, fail := make(chan struct{}), make(chan struct{})
	switched := make(chan error, 1)
	go func() {
		// A drain of a nanosecond: over at once.
		switched <- ta.api.Switch(context.Background(), "model-b", next, time.Nanosecond, func(context.Context) error {
			close(loading)
			<-fail
			return errors.New("out of memory")
		})
	}()
	rest := s1.rest(t)
	if len(rest) < 2 || !strings.Contains(rest[len(rest)-2], `"error"`) {
		t.Fatalf("a stream ended by the drain: %q", rest)
	}
	<-loading
	r := ta.post(t, hiBody, nil)
	if e := errorOf(t, r); r.StatusCode != 503 || r.Header.Get("Retry-After") != "5" || !strings.Contains(e["message"].(string), "switching") {
		t.Fatalf("request during a long switch: %d %v Retry-After %q", r.StatusCode, e, r.Header.Get("Retry-After"))
	}
	close(fail)
	if err := <-switched; err == nil || !strings.Contains(err.Error(), "out of memory") {
		t.Fatalf("Switch: %v", err)
	}
	// The old model serves on, on a fresh context (the drain cancelled
	// the old one).
	if id := ta.modelsID(t); id != testModel {
		t.Fatalf("/models after a failed switch: %s", id)
	}
	r2, s2 := ta.stream(t, testModel)
	defer r2.Body.Close()
	s2.next(t)
	close(release)
	if rest := s2.rest(t); strings.Contains(strings.Join(rest, ""), `"error"`) {
		t.Fatalf("a stream after the failed switch: %q", rest)
	}
}
