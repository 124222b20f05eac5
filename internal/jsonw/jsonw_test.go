package jsonw

import (
	"encoding/json"
	"testing"
)

func TestAppendStringDecodesAsEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"b\s/`, "\x00\x1f\b\f\n\r\t", "<&>", "é日本😀", "\u2028\u2029", "bad \xff\xfe utf8 \xe6\x97"} {
		var fromUs, fromStd string
		if err := json.Unmarshal(AppendString(nil, s), &fromUs); err != nil {
			t.Fatalf("%q: our output %s is not JSON: %v", s, AppendString(nil, s), err)
		}
		std, _ := json.Marshal(s)
		if err := json.Unmarshal(std, &fromStd); err != nil {
			t.Fatal(err)
		}
		if fromUs != fromStd {
			t.Errorf("%q decodes as %q, encoding/json's as %q", s, fromUs, fromStd)
		}
		if got := string(AppendString(nil, []byte(s))); got != string(AppendString(nil, s)) {
			t.Errorf("%q: bytes and string differ", s)
		}
	}
}
