package deployapi

import (
	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
)

// Usage over time: beside the token counts (keys.RecordUsage, where each
// generation ends), a key's minute buckets count its errors and its
// requests' times to first token and reasoning tokens. A request counts
// one outcome with the time to first token and reasoning tokens when its
// completion ends (completion.observe), and one failure if it was answered
// with an error (noteFailure, when Handle returns) or its stream ended in
// one (the completion's outcome).

// keyUserValue names the request's authenticated key ID among the
// request's user values.
const keyUserValue = "hearth.key_id"

// noteKey remembers which key a request authenticated with.
func noteKey(ctx *fasthttp.RequestCtx, id string) { ctx.SetUserValue(keyUserValue, id) }

// noteFailure counts an error answer to an authenticated request as a
// failure of its key.
func (a *API) noteFailure(ctx *fasthttp.RequestCtx) {
	if ctx.Response.StatusCode() < 400 {
		return
	}
	if id, ok := ctx.UserValue(keyUserValue).(string); ok {
		a.keys.RecordOutcome(id, apikeys.Outcome{Failed: true})
	}
}

// outcome is how the completion went for its key's usage: its time to
// first token, its reasoning tokens, and, for a stream (whose status was
// already sent: noteFailure cannot tell), whether a generation failed.
func (c *completion) outcome() apikeys.Outcome {
	o := apikeys.Outcome{ReasoningTokens: int64(c.usage().Reasoning)}
	if !c.firstAt.IsZero() {
		o.TTFT = c.firstAt.Sub(c.start)
	}
	if c.isSSE && c.gctx.Err() == nil {
		for _, st := range c.choices {
			if st.finish == "" {
				o.Failed = true
			}
		}
	}
	return o
}
