package openai

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// docTable returns the field names in the request mapping table of the
// package comment: the top-level fields (first column, comma-separated,
// possibly over several lines) and the message fields (".role").
func docTable(t *testing.T, header string) (top, message []string) {
	t.Helper()
	return docTableOf(t, header)
}

// docTableOf is docTable for the table whose first column is headed
// header.
func docTableOf(t *testing.T, header string) (top, message []string) {
	t.Helper()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(src), "//\t"+header)
	if !ok {
		t.Fatal("doc.go has no request mapping table")
	}
	table, _, _ = strings.Cut(table, "\n//\n")
	dotted := regexp.MustCompile(`\.[a-z_]+`)
	for _, line := range strings.Split(table, "\n")[2:] { // after the header and its underline
		row, ok := strings.CutPrefix(line, "//\t")
		if !ok {
			t.Fatalf("unexpected line in the doc table: %q", line)
		}
		if nested, ok := strings.CutPrefix(row, "  ."); ok { // a message field: "  .audio, .function_call"
			first, _, _ := strings.Cut("."+nested, "  ")
			for _, m := range dotted.FindAllString(first, -1) {
				message = append(message, m[1:])
			}
			continue
		}
		// The first column ends at a run of spaces; it is empty on a
		// line that continues the second column.
		first, _, _ := strings.Cut(row, "  ")
		if first == "" || strings.HasPrefix(first, "(") { // "(unknown field X)" is not a field
			continue
		}
		for _, name := range strings.Split(first, ",") {
			if name = strings.TrimSpace(name); name != "" {
				top = append(top, name)
			}
		}
	}
	return top, message
}

// The package comment documents exactly the fields the decoder knows.
func TestDocTableMatchesFields(t *testing.T) {
	docTop, docMessage := docTable(t, "OpenAI field")
	same := func(what string, doc, code []string) {
		t.Helper()
		slices.Sort(doc)
		code = slices.Clone(code)
		slices.Sort(code)
		code = slices.Compact(code)
		if !slices.Equal(doc, code) {
			t.Errorf("%s: the doc table lists\n%v\nthe decoder knows\n%v", what, doc, code)
		}
	}
	same("top-level fields", docTop, chatFields.names())
	var message []string
	for _, fs := range []*fields[messageDecoder]{plainMessageFields, assistantMessageFields, toolMessageFields} {
		message = append(message, fs.names()...)
	}
	same("message fields", docMessage, message)
	if len(docTop) < 30 || len(docMessage) < 8 {
		t.Errorf("parsed too few fields from the doc table: %v %v", docTop, docMessage)
	}
}

// The Responses, embeddings and legacy completions sections document
// exactly the fields their decoders know.
func TestOtherDocTablesMatchFields(t *testing.T) {
	for header, names := range map[string][]string{
		"Responses field":   responsesFields.names(),
		"embeddings field":  embeddingsFields.names(),
		"completions field": completionFields.names(),
	} {
		doc, _ := docTable(t, header)
		doc = slices.Sorted(slices.Values(doc))
		code := slices.Sorted(slices.Values(names))
		if !slices.Equal(doc, code) {
			t.Errorf("%s: the doc table lists\n%v\nthe decoder knows\n%v", header, doc, code)
		}
	}
}

func TestNewFieldsRefusesDuplicates(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "stream_options.x is listed twice") {
			t.Errorf("recovered %v, want a panic naming the field", r)
		}
	}()
	newFields("stream_options", known[ChatRequest]("x"), optional("x", ignoredString[ChatRequest]))
}

// Every known top-level field reaches its decoder: a value of a type no
// field accepts gets a 400 naming that field, never the unknown-field
// error, and an absent optional field is not an error. The fields that
// take any object are given a value that is not one.
func TestEveryTopLevelFieldIsDecoded(t *testing.T) {
	for _, name := range chatFields.names() {
		key, _ := json.Marshal(name)
		if name == "chat_template_kwargs" || name == "prompt_cache_options" {
			if _, e := DecodeChatRequest([]byte(body(string(key)+`:{"x":[1]}`)), testModel); e != nil {
				t.Errorf("%s: an object is refused: %v", name, e)
			}
			if _, e := DecodeChatRequest([]byte(body(string(key)+`:[1]`)), testModel); e == nil || e.Param != name {
				t.Errorf("%s: an array: got %+v, want a 400 about %s", name, e, name)
			}
			continue
		}
		_, e := DecodeChatRequest([]byte(body(string(key)+`:{"x":[1]}`)), testModel)
		if name == "model" {
			if e == nil || e.Status != 400 || e.Param != "model" {
				t.Errorf("model: got %+v", e)
			}
			continue
		}
		// A key unknown inside the field's object (tool_choice.x) is the
		// field's own error; the field itself must never be unknown.
		if e == nil || e.Param == "" || !strings.HasPrefix(e.Param, name) || e.Code == "unknown_parameter" && e.Param == name {
			t.Errorf("%s: got %+v, want a 400 about %s", name, e, name)
		}
	}
}
