package deployapi

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3/responses"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
	"github.com/hearthd/hearth/metrics"
)

func (ta *testAPI) postResponses(t *testing.T, body string) *http.Response {
	t.Helper()
	return ta.postTo(t, "/responses", body, nil)
}

func respBody(extra string) string {
	return `{"model":"hearth-tiny","input":"hi there"` + extra + `}`
}

// response decodes a non-streamed answer with openai-go's type.
func response(t *testing.T, resp *http.Response) *responses.Response {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var r responses.Response
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return &r
}

// respEvent is one typed event of a streamed response.
type respEvent struct {
	typ  string
	data string
	u    responses.ResponseStreamEventUnion
}

// readResponseEvents reads a Responses stream to its end, checking that
// each event names its type twice and that sequence numbers count from 0.
func readResponseEvents(t *testing.T, r io.Reader) []respEvent {
	t.Helper()
	var out []respEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	var typ string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "event: "):
			typ = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			ev := respEvent{typ: typ, data: line[len("data: "):]}
			if err := json.Unmarshal([]byte(ev.data), &ev.u); err != nil {
				t.Fatalf("event %q: %v", ev.data, err)
			}
			if ev.u.Type != typ || ev.u.SequenceNumber != int64(len(out)) {
				t.Fatalf("event %d under %q: type %q sequence_number %d", len(out), typ, ev.u.Type, ev.u.SequenceNumber)
			}
			out = append(out, ev)
			typ = ""
		default:
			t.Fatalf("unexpected SSE line %q", line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func eventTypes(evs []respEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, strings.TrimPrefix(e.typ, "response."))
	}
	return out
}

func TestResponsesNonStream(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"Hello", " world"}, PromptTokens: 7}, nil)
	r := response(t, ta.postResponses(t, respBody(`,"instructions":"be brief","temperature":0.5,"metadata":{"k":"v"},"user":"u","store":false`)))
	if !strings.HasPrefix(r.ID, "resp_") || r.Object != "response" || r.Status != "completed" || r.Model != testModel ||
		r.CreatedAt == 0 || r.Instructions.OfString != "be brief" || r.Temperature != 0.5 || r.Metadata["k"] != "v" ||
		!strings.Contains(r.RawJSON(), `"store":false`) {
		t.Fatalf("response %s", r.RawJSON())
	}
	if r.OutputText() != "Hello world" || len(r.Output) != 1 || r.Output[0].Type != "message" ||
		r.Output[0].Content[0].Type != "output_text" || r.Output[0].Status != "completed" || r.Output[0].Role != "assistant" {
		t.Fatalf("output %s", r.RawJSON())
	}
	if u := r.Usage; u.InputTokens != 7 || u.OutputTokens != 2 || u.TotalTokens != 9 || !u.JSON.InputTokensDetails.Valid() {
		t.Fatalf("usage %+v", u)
	}
	got := ta.rt.LastRequest()
	want := []llm.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi there"}}
	if fmt.Sprint(got.Messages) != fmt.Sprint(want) || *got.Options.Temperature != 0.5 {
		t.Fatalf("runtime request %+v", got)
	}
	// Usage is counted for the key, as for chat.
	if u := ta.keys.Usage(ta.keyID); u.Requests != 1 || u.PromptTokens != 7 || u.CompletionTokens != 2 {
		t.Fatalf("key usage %+v", u)
	}
}

func TestResponsesStream(t *testing.T) { overBoth(t, testResponsesStream) }

func testResponsesStream(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"Hello", " world"}, PromptTokens: 7}, nil)
	resp := ta.postResponses(t, respBody(`,"stream":true`))
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("status %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := readResponseEvents(t, resp.Body)
	want := []string{"created", "in_progress", "output_item.added", "content_part.added", "output_text.delta",
		"output_text.delta", "output_text.done", "content_part.done", "output_item.done", "completed"}
	if got := eventTypes(evs); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if d := evs[4].u.AsResponseOutputTextDelta(); d.Delta != "Hello" || d.ItemID == "" || d.OutputIndex != 0 {
		t.Fatalf("first delta %s", evs[4].data)
	}
	created, final := evs[0].u.AsResponseCreated().Response, evs[len(evs)-1].u.AsResponseCompleted().Response
	if created.Status != "in_progress" || final.ID != created.ID || final.Status != "completed" ||
		final.OutputText() != "Hello world" || final.Usage.TotalTokens != 9 {
		t.Fatalf("created %s\nfinal %s", created.RawJSON(), final.RawJSON())
	}
	if strings.Contains(evs[len(evs)-1].data, "[DONE]") {
		t.Fatal("a Responses stream has no [DONE]")
	}
}

// The model's tool call comes back as a function_call item; sent back as
// input with its output, it reaches the runtime as chat's tool round trip.
func TestResponsesToolRoundTrip(t *testing.T) {
	call := llm.ToolCall{ID: "call_1", Name: "get_weather", Arguments: json.RawMessage(`{"city":"Oslo"}`)}
	ta := startAPI(t, fake.Config{Tokens: []string{"Checking."}, ToolCalls: []llm.ToolCall{call}}, nil)
	tools := `,"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}]`
	r := response(t, ta.postResponses(t, respBody(tools+`,"tool_choice":"auto","parallel_tool_calls":false`)))
	if len(r.Output) != 2 || r.Output[1].Type != "function_call" {
		t.Fatalf("output %s", r.RawJSON())
	}
	fc := r.Output[1].AsFunctionCall()
	if fc.CallID != "call_1" || fc.Name != "get_weather" || fc.Arguments != `{"city":"Oslo"}` || fc.Status != "completed" ||
		!strings.HasPrefix(fc.ID, "fc_") || r.Status != "completed" || r.ToolChoice.OfToolChoiceMode != "auto" || r.ParallelToolCalls {
		t.Fatalf("function call %s", r.RawJSON())
	}
	if got := ta.rt.LastRequest(); got.ForceTool != "" || got.MaxToolCalls != 1 || len(got.Tools) != 1 {
		t.Fatalf("runtime request %+v", got)
	}

	// Round trip: the output items and the tool's result as the next input.
	out, _ := json.Marshal([]any{r.Output[0].AsMessage().ToParam(), fc.ToParam()})
	body := `{"model":"hearth-tiny","input":[{"role":"user","content":"weather?"},` + string(out[1:len(out)-1]) +
		`,{"type":"function_call_output","call_id":"call_1","output":"cold"}]` + tools +
		`,"tool_choice":{"type":"function","name":"get_weather"}}`
	_ = response(t, ta.postResponses(t, body))
	got := ta.rt.LastRequest()
	want := []llm.Message{
		{Role: "user", Content: "weather?"},
		{Role: "assistant", Content: "Checking.", ToolCalls: []llm.ToolCall{call}},
		{Role: "tool", Content: "cold", ToolName: "get_weather"},
	}
	// A named tool_choice is forced the way chat forces it: the runtime
	// is asked for the tool's arguments under its schema, with an
	// instruction first, and no tools of its own.
	msgs := got.Messages
	if len(msgs) != len(want)+1 || msgs[0].Role != "system" || !strings.Contains(msgs[0].Content, "get_weather") ||
		fmt.Sprint(msgs[1:]) != fmt.Sprint(want) || got.Format == nil || got.Tools != nil {
		t.Fatalf("runtime request %+v", got)
	}

	// Streamed, the call is its own item with its arguments' events.
	resp := ta.postResponses(t, respBody(tools+`,"stream":true`))
	evs := readResponseEvents(t, resp.Body)
	resp.Body.Close()
	wantTypes := []string{"created", "in_progress", "output_item.added", "content_part.added", "output_text.delta",
		"output_text.done", "content_part.done", "output_item.done",
		"output_item.added", "function_call_arguments.delta", "function_call_arguments.done", "output_item.done", "completed"}
	if got := eventTypes(evs); fmt.Sprint(got) != fmt.Sprint(wantTypes) {
		t.Fatalf("events %v, want %v", got, wantTypes)
	}
	if d := evs[10].u.AsResponseFunctionCallArgumentsDone(); d.Arguments != `{"city":"Oslo"}` || d.OutputIndex != 1 {
		t.Fatalf("arguments done %s", evs[10].data)
	}
}

// A response cut by max_output_tokens is incomplete, streamed or not.
func TestResponsesLengthIsIncomplete(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 5}, nil)
	r := response(t, ta.postResponses(t, respBody(`,"max_output_tokens":2`)))
	if r.Status != "incomplete" || r.IncompleteDetails.Reason != "max_output_tokens" || r.MaxOutputTokens != 2 ||
		r.Usage.OutputTokens != 2 || r.Output[0].Status != "incomplete" {
		t.Fatalf("response %s", r.RawJSON())
	}
	resp := ta.postResponses(t, respBody(`,"max_output_tokens":2,"stream":true`))
	evs := readResponseEvents(t, resp.Body)
	resp.Body.Close()
	last := evs[len(evs)-1]
	if last.typ != "response.incomplete" || last.u.AsResponseIncomplete().Response.IncompleteDetails.Reason != "max_output_tokens" {
		t.Fatalf("last event %s", last.data)
	}
}

// A runtime failure after the stream started ends it with response.failed.
func TestResponsesFailureMidStream(t *testing.T) {
	ta := startAPI(t, fake.Config{Tokens: []string{"a"}, TokenCount: 5, StreamErr: errors.New("boom"), FailAfter: 1}, nil)
	resp := ta.postResponses(t, respBody(`,"stream":true`))
	evs := readResponseEvents(t, resp.Body)
	resp.Body.Close()
	last := evs[len(evs)-1]
	f := last.u.AsResponseFailed().Response
	if last.typ != "response.failed" || f.Status != "failed" || f.Error.Code != "server_error" || f.Error.Message == "" ||
		strings.Contains(last.data, "boom") {
		t.Fatalf("last event %s", last.data)
	}
}

// A reasoning model's thinking is a reasoning item before the message.
func TestResponsesReasoning(t *testing.T) {
	ta := startAPI(t, thinker, nil)
	r := response(t, ta.postResponses(t, respBody(`,"reasoning":{"effort":"high"}`)))
	if len(r.Output) != 2 || r.Output[0].Type != "reasoning" || r.Output[0].Content[0].Text != "Let me think." ||
		r.OutputText() != "Hello world" || r.Usage.OutputTokensDetails.ReasoningTokens != 2 || r.Reasoning.Effort != "high" {
		t.Fatalf("response %s", r.RawJSON())
	}
	if got := ta.rt.LastRequest().Options.Think; got != llm.ThinkHigh {
		t.Fatalf("think %q", got)
	}
	resp := ta.postResponses(t, respBody(`,"stream":true`))
	evs := readResponseEvents(t, resp.Body)
	resp.Body.Close()
	types := eventTypes(evs)
	if types[2] != "output_item.added" || types[3] != "content_part.added" || types[4] != "reasoning_text.delta" ||
		!strings.Contains(fmt.Sprint(types), "reasoning_text.done") {
		t.Fatalf("events %v", types)
	}
}

// A refused request is answered 400 (404 for another model) naming the
// parameter, in the route's own names, and never reaches the runtime.
func TestResponsesRefusedNeverReachRuntime(t *testing.T) {
	ta := startAPI(t, fake.Config{Limits: llm.Limits{ContextLength: 4096, Capabilities: []string{"completion"}}},
		func(c *APIConfig) { c.MaxOutputTokens = 64 })
	tests := []struct {
		body   string
		status int
		param  string
	}{
		{respBody(`,"store":true`), 400, "store"},
		{respBody(`,"previous_response_id":"resp_x"`), 400, "previous_response_id"},
		{respBody(`,"tools":[{"type":"web_search_preview"}]`), 400, "tools[0].type"},
		{respBody(`,"bogus":1`), 400, "bogus"},
		{`{"model":"hearth-tiny","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}`, 400, "input[0].content[0].type"},
		{`{"model":"other","input":"hi"}`, 404, ""},
		{`{"model":"hearth-tiny","input":[]}`, 400, "input"},
		{`{"model":"hearth-tiny"`, 400, ""},
		// The deployment's limits, named as this route names them.
		{respBody(`,"max_output_tokens":65`), 400, "max_output_tokens"},
		{respBody(`,"reasoning":{"effort":"low"}`), 400, "reasoning.effort"},
		{`{"model":"hearth-tiny","input":"` + strings.Repeat("word ", 8000) + `"}`, 400, "input"},
		{respBody(`,"tools":[{"type":"function","name":"f"}]`), 400, "tools"},
	}
	for _, tt := range tests {
		resp := ta.postResponses(t, tt.body)
		e := errorOf(t, resp)
		if resp.StatusCode != tt.status || fmt.Sprint(e["param"]) != fmt.Sprint(map[bool]any{true: nil, false: tt.param}[tt.param == ""]) {
			t.Errorf("%.80s: status %d error %v, want %d naming %q", tt.body, resp.StatusCode, e, tt.status, tt.param)
		}
	}
	if n := ta.rt.Calls(); n != 0 {
		t.Fatalf("the runtime was called %d times", n)
	}
	req, _ := http.NewRequest("GET", ta.url+"/responses", nil)
	req.Header.Set("Authorization", "Bearer "+ta.secret)
	resp, err := ta.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Fatalf("GET /responses: %d", resp.StatusCode)
	}
	// A bad key is refused before anything else.
	req, _ = http.NewRequest("POST", ta.url+"/responses", strings.NewReader(respBody("")))
	req.Header.Set("Authorization", "Bearer nope")
	if resp, err = ta.client.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || ta.rt.Calls() != 0 {
		t.Fatalf("bad key: %d", resp.StatusCode)
	}
}

// The route is counted under its own label.
func TestResponsesMetricsRoute(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	response(t, ta.postResponses(t, respBody("")))
	mfs, err := ta.api.m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if mf.GetName() == "hearth_http_requests_total" && labels["route"] == metrics.RouteResponses && labels["code"] == "200" {
				found = m.GetCounter().GetValue() == 1
			}
		}
	}
	if !found {
		t.Fatal("the request is not counted once under route responses")
	}
}

// A client that leaves mid-stream cancels the generation at once.
func TestResponsesDisconnectCancels(t *testing.T) { overBoth(t, testResponsesDisconnectCancels) }

func testResponsesDisconnectCancels(t *testing.T, overTLS bool) {
	ta := startAPIOver(t, overTLS, fake.Config{Tokens: []string{"x"}, TokenCount: 2, TokenDelay: slowToken}, nil)
	conn := ta.streamUntil(t, "/responses", respBody(`,"stream":true`), `"delta":"x"`)
	leave(t, conn, ta.rt.LastStream())
}

// A key's per-minute limit counts /responses with /chat/completions, and a
// request over it never reaches the runtime.
func TestResponsesShareTheKeyLimit(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	ta.keys.Now = testutil.NewClock().Now
	secret, _ := ta.keys.AddLimited("limited", 2, 0)
	auth := map[string]string{"Authorization": "Bearer " + secret}
	for _, path := range []string{"/chat/completions", "/responses"} {
		body := hiBody
		if path == "/responses" {
			body = respBody("")
		}
		resp := ta.postTo(t, path, body, auth)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d", path, resp.StatusCode)
		}
	}
	resp := ta.postTo(t, "/responses", respBody(""), auth)
	e := errorOf(t, resp)
	if resp.StatusCode != 429 || e["code"] != "rate_limit_exceeded" || resp.Header.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("over the limit: %d %v", resp.StatusCode, e)
	}
	if n := ta.rt.Calls(); n != 2 {
		t.Fatalf("the runtime was called %d times, want 2", n)
	}
}
