package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/ollamatest"
)

// JSON schemas that crash the real runtime's model runner, hang or kill
// its server, or make it sample something else, sent through every
// parameter that carries one, while another stream runs on the same
// deployment: each is a 400 naming its parameter, and the stream ends
// whole, untouched. A schema the runtime takes still works afterwards.
func TestSchemasTheRuntimeCannotTake(t *testing.T) {
	shared.ollama.ForEach(t, testSchemasTheRuntimeCannotTake)
}

func testSchemasTheRuntimeCannotTake(t *testing.T, inst *ollamatest.Instance) {
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL, "--max-output-tokens", "100000"}})

	// The stream that must not be disturbed: long enough to outlast the
	// refusals, which never wait for the runtime.
	conn := dialRaw(t, h.root)
	defer conn.Close()
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":1500,"messages":[{"role":"user","content":"Tell a long story."}]}`, inst.Model)
	rawPost(conn, "/api/v1/chat/completions", h.secret, len(body), body)
	br := bufio.NewReader(conn)
	for n := 0; n < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"content":"`) {
			n++
		}
	}

	prop := func(s string) string { return `{"type":"object","properties":{"a":` + s + `}}` }
	pattern := func(p string) string {
		b, _ := json.Marshal(p)
		return prop(`{"type":"string","pattern":` + string(b) + `}`)
	}
	schemas := []string{
		prop(`{"type":"string","maxLength":2001}`), // runner crash
		prop(`{"type":"array","items":{"type":"string"},"minItems":2001}`),
		prop(`{"type":"string","minLength":5,"maxLength":3}`),     // server hangs
		pattern(`^a{1000000}$`),                                   // runner crash
		pattern(`^\d{3}$`),                                        // runner crash
		pattern(`^(?:ab)$`),                                       // server dies
		pattern(`^a}$`),                                           // server hangs
		pattern(`^(a?)+$`),                                        // runner crash
		`{"$ref":"#"}`,                                            // 500
		`{"$defs":{"a":{"$ref":"#/$defs/a"}},"$ref":"#/$defs/a"}`, // server hangs
		`{"$ref":"https://example.com/schema.json"}`,              // samples anything
		prop(`{"type":"integer","minimum":1e300}`),                // 500
		prop(`{"type":"integer","maximum":-1e300}`),               // 500
	}
	chat := func(extra string) string {
		return fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"user","content":"hi"}]%s}`, inst.Model, extra)
	}
	responses := func(extra string) string {
		return fmt.Sprintf(`{"model":%q,"max_output_tokens":16,"input":"hi"%s}`, inst.Model, extra)
	}
	type refusal struct{ path, body, param string }
	var cases []refusal
	for _, s := range schemas {
		cases = append(cases,
			refusal{"/chat/completions", chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":` + s + `}}`), "response_format"},
			refusal{"/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":` + s + `}}],"tool_choice":"required"`), "tools[0].function.parameters"},
			refusal{"/responses", responses(`,"text":{"format":{"type":"json_schema","name":"x","schema":` + s + `}}`), "text.format"},
			refusal{"/responses", responses(`,"tools":[{"type":"function","name":"f","parameters":` + s + `}],"tool_choice":{"type":"function","name":"f"}`), "tools[0].parameters"})
	}
	// Each tool's $ref, fine on its own, points nowhere in the one schema
	// a "required" call samples with.
	cases = append(cases, refusal{"/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"$defs":{"p":{"type":"string"}},"type":"object","properties":{"a":{"$ref":"#/$defs/p"}}}}}],"tool_choice":"required"`), "tool_choice"})
	for _, c := range cases {
		req, _ := http.NewRequest("POST", h.url+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+h.secret)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_, code := openAIError(t, b)
		var e struct {
			Error struct{ Param string } `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if resp.StatusCode != 400 || code != "invalid_json_schema" || e.Error.Param != c.param {
			t.Errorf("%s %.160s: %d %s", c.path, c.body, resp.StatusCode, b)
		}
	}

	// The stream ran on, to its own end.
	var rest []string
	for len(rest) == 0 || rest[len(rest)-1] != "[DONE]" {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream was cut (%v); it ended %q", err, tail(rest, 3))
		}
		if d, ok := strings.CutPrefix(strings.TrimSpace(line), "data: "); ok {
			rest = append(rest, d)
		}
	}
	if len(rest) < 2 || rest[len(rest)-1] != "[DONE]" || !strings.Contains(rest[len(rest)-2], `"finish_reason":"length"`) ||
		strings.Contains(strings.Join(rest, "\n"), `"error"`) {
		t.Fatalf("the stream was disturbed; it ended %q", tail(rest, 3))
	}

	// The runtime still samples with a schema it can take.
	ok := chat(`,"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":9}},"required":["n"]}}}],"tool_choice":"required","max_tokens":300`)
	req, _ := http.NewRequest("POST", h.url+"/chat/completions", strings.NewReader(ok))
	req.Header.Set("Authorization", "Bearer "+h.secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"finish_reason"`) {
		t.Fatalf("a schema the runtime takes: %d %s", resp.StatusCode, b)
	}
}
