package openai

import (
	"math"
	"strconv"

	"github.com/hearthd/hearth/llm"
)

// appendLogprobs appends a choice's logprobs object in OpenAI's shape:
// {"content":[{"token","logprob","bytes","top_logprobs":[…]}],"refusal":null}.
func appendLogprobs(dst []byte, lp []llm.TokenLogprob) []byte {
	dst = append(dst, `{"content":`...)
	dst = appendLogprobList(dst, lp)
	return append(dst, `,"refusal":null}`...)
}

// appendLogprobList appends the tokens' logprobs as an array of
// {"token","logprob","bytes","top_logprobs":[…]}: chat's logprobs.content,
// the Responses API's output_text logprobs.
func appendLogprobList(dst []byte, lp []llm.TokenLogprob) []byte {
	dst = append(dst, '[')
	for i := range lp {
		if i > 0 {
			dst = append(dst, ',')
		}
		t := &lp[i]
		dst = appendTokenLogprob(dst, t.Token, t.Logprob, t.Bytes)
		dst = append(dst, `,"top_logprobs":[`...)
		for j := range t.TopLogprobs {
			if j > 0 {
				dst = append(dst, ',')
			}
			a := &t.TopLogprobs[j]
			dst = appendTokenLogprob(dst, a.Token, a.Logprob, a.Bytes)
			dst = append(dst, '}')
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, ']')
}

// appendTokenLogprob appends `{"token":…,"logprob":…,"bytes":[…]`, open.
func appendTokenLogprob(dst []byte, token string, logprob float64, b []byte) []byte {
	dst = append(dst, `{"token":`...)
	dst = appendString(dst, token)
	dst = append(dst, `,"logprob":`...)
	dst = appendLogprob(dst, logprob)
	dst = append(dst, `,"bytes":`...)
	if b == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, c := range b {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(c), 10)
	}
	return append(dst, ']')
}

// appendLogprob appends a log probability; JSON has no -Inf, so a token
// the model rules out gets OpenAI's floor, -9999.0.
func appendLogprob(dst []byte, v float64) []byte {
	if math.IsInf(v, 0) || math.IsNaN(v) || v < -9999 {
		v = -9999
	}
	return strconv.AppendFloat(dst, v, 'g', -1, 64)
}

// AppendContentLogprobs is AppendContent for a request that asked for
// logprobs: the chunk carries those of its text's tokens.
func (c *ChunkEncoder) AppendContentLogprobs(dst []byte, text string, lp []llm.TokenLogprob) []byte {
	dst = append(dst, c.choice...)
	dst = append(dst, `{"content":`...)
	dst = appendString(dst, text)
	dst = append(dst, `},"logprobs":`...)
	dst = appendLogprobs(dst, lp)
	dst = append(dst, `,"finish_reason":null`...)
	return append(dst, c.end...)
}
