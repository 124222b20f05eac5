package openai

import (
	"encoding/json"

	"github.com/hearthd/hearth/llm"
)

// decodeResponseFormat maps response_format to req.Format. Its allowed
// keys depend on its type, so it is decoded by hand up to json_schema,
// which has a table.
func decodeResponseFormat(raw json.RawMessage, req *llm.Request) *Error {
	rf, e := asObject(raw, "response_format")
	if e != nil {
		return e
	}
	typ, e := requiredString(rf, "type", "response_format.type")
	if e != nil {
		return e
	}
	switch typ {
	case "text", "json_object":
		if k, ok := firstUnknownOf(rf, "type"); ok {
			return unknownField("response_format." + k)
		}
		if typ == "json_object" {
			req.Format = json.RawMessage(`"json"`)
		}
		return nil
	case "json_schema":
		if k, ok := firstUnknownOf(rf, "type", "json_schema"); ok {
			return unknownField("response_format." + k)
		}
		jsRaw, ok := rf.get("json_schema")
		if !ok {
			return missing("response_format.json_schema")
		}
		js, e := asObject(jsRaw, "response_format.json_schema")
		if e != nil {
			return e
		}
		return jsonSchemaFields.decode(req, js)
	default:
		return invalidValue("response_format.type", typ, "text", "json_object", "json_schema")
	}
}

var jsonSchemaFields = newFields("response_format.json_schema",
	optional("name", func(_ *llm.Request, raw json.RawMessage, param string) *Error {
		_, e := schemaName(raw, param)
		return e
	}),
	optional("description", ignoredString[llm.Request]),
	// The schema is always enforced by constrained decoding, so either
	// value of strict is honoured.
	optional("strict", acceptedBool[llm.Request]),
	required("schema", func(req *llm.Request, raw json.RawMessage, param string) (e *Error) {
		req.Format, e = schemaObject(raw, param, "response_format")
		return e
	}),
)

// schemaName decodes the name of a JSON schema output format.
func schemaName(raw json.RawMessage, param string) (string, *Error) {
	name, e := asString(raw, param)
	if e != nil {
		return "", e
	}
	if !validName(name) {
		return "", invalid(param, "invalid_value", "Invalid '"+param+"': must match ^[a-zA-Z0-9_-]{1,64}$.")
	}
	return name, nil
}
