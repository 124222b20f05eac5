package ollama

import (
	"errors"
	"strings"

	"github.com/hearthd/hearth/llm"
)

// schemaMessages are what Ollama says when it cannot turn a request's
// format into a grammar or sample with it: its server ("invalid JSON
// schema in format", "invalid format: …"), the runner of its llama.cpp
// engine (0.9.6: "Failed to create new sequence: unable to create
// sampling context") and of its own engine ("failed to load model
// vocabulary required for format").
var schemaMessages = []string{
	"invalid JSON schema in format",
	"invalid format:",
	"unable to create sampling context",
	"vocabulary required for format",
}

func schemaRefused(msg string) bool {
	for _, m := range schemaMessages {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// refusedSchema is the runtime's refusal of a request's format, in msg.
func refusedSchema(msg string) error {
	return &llm.InvalidRequestError{Msg: "The model runtime cannot constrain its output with this JSON schema (it says: " + clipMsg(msg) + ").", Schema: true}
}

// schemaRefusal turns a generation's failure to start that is the
// runtime's refusal of its format into that refusal: Ollama 0.9.6 reports
// it as the first line of a 200 answer rather than as an error status
// (statusError).
func schemaRefusal(err error) error {
	var se *streamError
	if errors.As(err, &se) && schemaRefused(se.msg) {
		return refusedSchema(se.msg)
	}
	return err
}
