package deployapi

import (
	"io"
	"strings"
	"testing"

	"github.com/hearthd/hearth/llm"
	"github.com/hearthd/hearth/llm/fake"
)

// Every JSON schema the runtime samples with is checked before it sees it
// (llm/schemacheck): one it cannot take is a 400 naming the parameter
// that carried it, and the runtime is never called.
func TestSchemasTheRuntimeCannotTakeAre400(t *testing.T) {
	ta := startAPI(t, fake.Config{}, nil)
	bad := `{"type":"object","properties":{"a":{"type":"string","maxLength":2001}}}`
	fn := func(params string) string {
		return `{"type":"function","function":{"name":"f","parameters":` + params + `}}`
	}
	flat := func(params string) string { return `{"type":"function","name":"f","parameters":` + params + `}` }
	for _, c := range []struct {
		path, body, param string
	}{
		{"/chat/completions", chatBody("hi", `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":`+bad+`}}`), "response_format"},
		{"/chat/completions", chatBody("hi", `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"$ref":"https://example.com/s.json"}}}`), "response_format"},
		{"/chat/completions", chatBody("hi", `,"tools":[`+fn(`{"type":"object"}`)+`,`+strings.Replace(fn(bad), `"f"`, `"g"`, 1)+`],"tool_choice":{"type":"function","function":{"name":"g"}}`), "tools[1].function.parameters"},
		{"/chat/completions", chatBody("hi", `,"tools":[`+fn(`{"type":"object","properties":{"n":{"type":"string","pattern":"^a{1000000}$"}}}`)+`],"tool_choice":"required"`), "tools[0].function.parameters"},
		// Each tool's $ref points into its own parameters; in the one
		// schema of a "required" call it points nowhere.
		{"/chat/completions", chatBody("hi", `,"tools":[`+fn(`{"$defs":{"p":{"type":"string"}},"type":"object","properties":{"n":{"$ref":"#/$defs/p"}}}`)+`],"tool_choice":"required"`), "tool_choice"},
		{"/responses", respBody(`,"text":{"format":{"type":"json_schema","name":"x","schema":` + bad + `}}`), "text.format"},
		{"/responses", respBody(`,"tools":[` + flat(bad) + `],"tool_choice":"required"`), "tools[0].parameters"},
	} {
		resp := ta.postTo(t, c.path, c.body, nil)
		e := errorOf(t, resp)
		if resp.StatusCode != 400 || e["param"] != c.param || e["code"] != "invalid_json_schema" {
			t.Errorf("%s %.150s: %d %v", c.path, c.body, resp.StatusCode, e)
		}
	}
	if n := ta.rt.Calls(); n != 0 {
		t.Fatalf("the runtime was called %d times for refused schemas", n)
	}

	// Tools the model is only offered are no grammar: their parameters are
	// not held to it, and a named forced call takes its tool's $refs.
	for _, body := range []string{
		chatBody("hi", `,"tools":[`+fn(`{"type":"object","properties":{"n":{"type":"string","pattern":"^\\d+$"}}}`)+`]`),
		chatBody("hi", `,"tools":[`+fn(`{"$defs":{"p":{"type":"string"}},"type":"object","properties":{"n":{"$ref":"#/$defs/p"}}}`)+`],"tool_choice":{"type":"function","function":{"name":"f"}}`),
	} {
		resp := ta.post(t, body, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%.150s: %d %s", body, resp.StatusCode, b)
		}
	}
}

// A runtime that refuses a request's schema anyway (its words recognised
// by the backend) is a 400 naming the parameter that carried the schema,
// never a 503 that SDKs would retry.
func TestRuntimeSchemaRefusalIs400(t *testing.T) {
	ta := startAPI(t, fake.Config{ChatErr: &llm.InvalidRequestError{Msg: "The model runtime cannot constrain its output with this JSON schema.", Schema: true}}, nil)
	for _, c := range []struct{ path, body, param string }{
		{"/chat/completions", chatBody("hi", `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"string"}}}`), "response_format"},
		{"/chat/completions", chatBody("hi", `,"stream":true,"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required"`), "tool_choice"},
		{"/responses", respBody(`,"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"string"}}}`), "text.format"},
	} {
		resp := ta.postTo(t, c.path, c.body, nil)
		e := errorOf(t, resp)
		if resp.StatusCode != 400 || e["param"] != c.param || !strings.Contains(e["message"].(string), "JSON schema") {
			t.Errorf("%s %.120s: %d %v", c.path, c.body, resp.StatusCode, e)
		}
	}
}
