package ollama

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/llm"
)

// Schemas the real runtime refuses as such (it answers 500) are the
// client's error: an InvalidRequestError marked Schema, not
// ErrUnavailable (which the API would answer 503, and SDKs retry). These
// are refusals the runtime survives; hearthd refuses them, and those it
// does not survive, before they reach it (llm/schemacheck).
func TestRealSchemaRefusalIsInvalidRequest(t *testing.T) {
	ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		b := realBackend(t, inst)
		for _, format := range []string{`{"$ref":"#"}`, `{"type":"object","properties":{"a":{"type":"integer","minimum":1e300}}}`,
			`{"type":"string","pattern":"^ab"}`, `{"description":"anything"}`} {
			max := 4
			_, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("hi"), Format: json.RawMessage(format),
				Options: llm.Options{MaxTokens: &max}})
			var ire *llm.InvalidRequestError
			if !errors.As(err, &ire) || !ire.Schema || errors.Is(err, llm.ErrUnavailable) {
				t.Errorf("%s: %v", format, err)
			}
		}
	})
}
