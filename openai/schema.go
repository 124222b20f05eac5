package openai

import (
	"encoding/json"

	"github.com/hearthd/hearth/llm/schemacheck"
)

// CheckSchema refuses a JSON schema the model runtime cannot constrain its
// output with (schemacheck's rules: a schema it cannot take would crash or
// hang it): a 400 naming param, the parameter that carried it, and saying
// where in the schema and why.
func CheckSchema(schema json.RawMessage, param string) *Error {
	if err := schemacheck.Check(schema); err != nil {
		return invalid(param, "invalid_json_schema", "Invalid JSON schema in '"+param+"': "+err.Error()+
			". The model runtime cannot constrain its output with it.")
	}
	return nil
}

// schemaObject decodes a JSON schema the runtime samples with: an object
// it can take (CheckSchema), refused naming named (the parameter a client
// knows the schema by, e.g. response_format) rather than its own member.
func schemaObject(raw []byte, param, named string) (json.RawMessage, *Error) {
	s, e := rawObject(raw, param)
	if e != nil {
		return nil, e
	}
	if e := CheckSchema(s, named); e != nil {
		return nil, e
	}
	return s, nil
}
