package openai

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"strconv"

	"github.com/hearthd/hearth/llm"
)

// MaxEmbeddingInputs is the most texts one embeddings request may carry,
// OpenAI's own limit. The whole batch is one request to admission.
const MaxEmbeddingInputs = 2048

// EmbeddingsRequest is a validated POST /embeddings request.
type EmbeddingsRequest struct {
	Model string
	// Base64: encoding_format "base64", each vector as the base64 of its
	// little-endian float32 values.
	Base64  bool
	Runtime llm.EmbedRequest
}

// DecodeEmbeddingsRequest decodes and validates an embeddings request body
// for a deployment serving modelID (the mapping is in the package
// comment). The result shares no memory with body.
func DecodeEmbeddingsRequest(body []byte, modelID string) (*EmbeddingsRequest, *Error) {
	obj, e := decodeBody(body)
	if e != nil {
		return nil, e
	}
	d := &embeddingsDecoder{modelID: modelID}
	if e := embeddingsFields.decode(d, obj); e != nil {
		return nil, e
	}
	return &d.EmbeddingsRequest, nil
}

type embeddingsDecoder struct {
	EmbeddingsRequest
	modelID string
}

// embeddingsFields is the allow-list and decoders of an embeddings
// request, as chatFields is for chat.
var embeddingsFields = newFields("",
	required("model", func(d *embeddingsDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Model, e = decodeModel(raw, param, d.modelID)
		return e
	}),
	required("input", func(d *embeddingsDecoder, raw json.RawMessage, param string) (e *Error) {
		d.Runtime.Input, e = decodeEmbeddingInput(raw, param)
		return e
	}),
	optional("encoding_format", func(d *embeddingsDecoder, raw json.RawMessage, param string) *Error {
		s, e := asString(raw, param)
		if e != nil {
			return e
		}
		switch s {
		case "float":
			d.Base64 = false
		case "base64":
			d.Base64 = true
		default:
			return invalidValue(param, s, "float", "base64")
		}
		return nil
	}),
	optional("dimensions", func(d *embeddingsDecoder, raw json.RawMessage, param string) *Error {
		n, e := asInt(raw, param, 1, 1<<16)
		d.Runtime.Dimensions = int(n)
		return e
	}),
	optional("user", ignoredString[embeddingsDecoder]),
)

// decodeEmbeddingInput decodes input: a non-empty string, or an array of
// 1 to MaxEmbeddingInputs non-empty strings. Token arrays (arrays of
// integers) are refused: the runtime embeds text only.
func decodeEmbeddingInput(raw json.RawMessage, param string) ([]string, *Error) {
	switch kindOf(raw) {
	case "string":
		s := mustString(raw)
		if s == "" {
			return nil, emptyInput(param)
		}
		return []string{s}, nil
	case "array":
	default:
		return nil, typeError(param, "a string or an array of strings", raw)
	}
	items := mustArray(raw)
	switch {
	case len(items) == 0:
		return nil, invalid(param, "invalid_value", "'"+param+"' must not be an empty array.")
	case len(items) > MaxEmbeddingInputs:
		return nil, arrayTooLong(param, MaxEmbeddingInputs, len(items))
	}
	out := make([]string, len(items))
	for i, it := range items {
		p := param + "[" + strconv.Itoa(i) + "]"
		switch kindOf(it) {
		case "string":
		case "integer", "array":
			return nil, invalid(param, "unsupported_value", tokenArraysMessage)
		default:
			return nil, typeError(p, "a string", it)
		}
		if out[i] = mustString(it); out[i] == "" {
			return nil, emptyInput(p)
		}
	}
	return out, nil
}

// tokenArraysMessage answers token arrays, and names the fix for the
// client that sends them without being asked: LangChain's
// OpenAIEmbeddings tokenizes with tiktoken first unless told not to.
const tokenArraysMessage = "Token arrays are not supported by this deployment's model runtime; send 'input' as text. " +
	"LangChain's OpenAIEmbeddings sends token arrays by default: create it with check_embedding_ctx_length=False."

func emptyInput(param string) *Error {
	return invalid(param, "invalid_value", "'"+param+"' must not be an empty string.")
}

// AppendEmbeddings appends the embeddings answer:
// {"object":"list","data":[{"object":"embedding","index":i,"embedding":…}],
// "model":…,"usage":{"prompt_tokens":…,"total_tokens":…}}, each vector as
// an array of numbers or, with b64, as a base64 string of little-endian
// float32 values (OpenAI's encoding_format "base64").
func AppendEmbeddings(dst []byte, model string, vectors [][]float32, b64 bool, promptTokens int) []byte {
	dst = append(dst, `{"object":"list","data":[`...)
	var raw []byte
	for i, v := range vectors {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"object":"embedding","index":`...)
		dst = appendInt(dst, int64(i))
		dst = append(dst, `,"embedding":`...)
		if b64 {
			raw = raw[:0]
			for _, f := range v {
				raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(f))
			}
			dst = append(dst, '"')
			dst = base64.StdEncoding.AppendEncode(dst, raw)
			dst = append(dst, '"')
		} else {
			dst = append(dst, '[')
			for j, f := range v {
				if j > 0 {
					dst = append(dst, ',')
				}
				dst = appendFloat32(dst, f)
			}
			dst = append(dst, ']')
		}
		dst = append(dst, '}')
	}
	dst = append(dst, `],"model":`...)
	dst = appendString(dst, model)
	dst = append(dst, `,"usage":{"prompt_tokens":`...)
	dst = appendInt(dst, int64(promptTokens))
	dst = append(dst, `,"total_tokens":`...)
	dst = appendInt(dst, int64(promptTokens))
	return append(dst, "}}"...)
}

// appendFloat32 appends f in the shortest form that reads back as the same
// float32. JSON has no NaN or infinity; a runtime never sends them (Ollama
// refuses such a vector), and they are written as 0 rather than as
// invalid JSON.
func appendFloat32(dst []byte, f float32) []byte {
	if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
		return append(dst, '0')
	}
	return strconv.AppendFloat(dst, float64(f), 'g', -1, 32)
}
