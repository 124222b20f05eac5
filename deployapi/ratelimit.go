package deployapi

import (
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/openai"
)

// setRateLimitHeaders sends a limited key's state in OpenAI's headers, on
// every answer to it (as OpenAI does), so SDKs and clients can pace
// themselves: x-ratelimit-limit-*, x-ratelimit-remaining-* and
// x-ratelimit-reset-* ("1s", "6m0s": Go durations, OpenAI's format) for
// requests and tokens, each only when that limit is set.
func setRateLimitHeaders(h *fasthttp.ResponseHeader, q apikeys.Quota) {
	setWindow(h, "requests", q.Requests)
	setWindow(h, "tokens", q.Tokens)
}

func setWindow(h *fasthttp.ResponseHeader, what string, w apikeys.Window) {
	if w.Limit == 0 {
		return
	}
	var b [24]byte
	h.SetBytesV("x-ratelimit-limit-"+what, strconv.AppendInt(b[:0], w.Limit, 10))
	h.SetBytesV("x-ratelimit-remaining-"+what, strconv.AppendInt(b[:0], w.Remaining, 10))
	h.Set("x-ratelimit-reset-"+what, resetString(w.Reset))
}

// resetString formats a reset time the way OpenAI does: "0s", "20ms",
// "1.5s", "6m0s".
func resetString(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(10 * time.Millisecond).String()
}

// rateLimited answers a request over its key's limit: 429
// rate_limit_exceeded in OpenAI's shape, saying which limit, with
// Retry-After in whole seconds (at least 1).
func (a *API) rateLimited(ctx *fasthttp.RequestCtx, q apikeys.Quota) {
	what := "requests"
	if q.Requests.Limit == 0 || q.Requests.Remaining > 0 {
		what = "tokens"
	}
	w := q.Requests
	if what == "tokens" {
		w = q.Tokens
	}
	msg := "Rate limit reached for this API key: " + strconv.FormatInt(w.Limit, 10) + " " + what +
		" per minute. Please retry after " + resetString(q.RetryAfter) + "."
	a.writeError(ctx, openai.RateLimited(msg))
	secs := int64((q.RetryAfter + time.Second - 1) / time.Second)
	ctx.Response.Header.Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
}
