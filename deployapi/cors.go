package deployapi

import (
	"bytes"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/valyala/fasthttp"
	"golang.org/x/net/http/httpguts"

	"github.com/hearthd/hearth/openai"
)

// CORS lets browser pages of other origins call the deployment API (the
// OpenAI SDKs run in browsers with dangerouslyAllowBrowser), per the Fetch
// standard's CORS protocol. Written here rather than taken from a library:
// the well-kept ones (rs/cors, gorilla/handlers) wrap net/http handlers,
// and the API serves fasthttp.

// corsExposed are the response headers a page's script may read besides
// the safelisted ones: the request id, the rate limits OpenAI's SDKs pace
// themselves by, and Retry-After, which they retry by.
const corsExposed = "X-Request-Id, Retry-After, " +
	"x-ratelimit-limit-requests, x-ratelimit-remaining-requests, x-ratelimit-reset-requests, " +
	"x-ratelimit-limit-tokens, x-ratelimit-remaining-tokens, x-ratelimit-reset-tokens"

// corsMaxAge is how long a browser may cache a preflight's answer, in
// seconds: Chromium's ceiling (Firefox's is a day).
const corsMaxAge = "7200"

// corsHeaders are the request headers a preflight always allows: the key
// and the JSON body's type. Others a preflight asks for (the SDKs send
// their own, such as X-Stainless-*) are allowed too: they change nothing
// here.
var corsHeaders = []string{"authorization", "content-type"}

// CORSPolicy is which origins may call the API from a browser: none (the
// zero value), any ("*"), or those listed.
type CORSPolicy struct {
	any     bool
	origins []string // serialized origins, lower case
}

// ParseCORSOrigins parses the allowed origins: each "*" (any origin) or a
// serialized origin, scheme://host[:port] without a path.
func ParseCORSOrigins(list []string) (CORSPolicy, error) {
	var p CORSPolicy
	for _, o := range list {
		o = strings.TrimSpace(o)
		if o == "*" {
			p.any = true
			continue
		}
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(o, "/") {
			return CORSPolicy{}, fmt.Errorf("%q is not an origin (scheme://host[:port], no path) or *", o)
		}
		p.origins = append(p.origins, strings.ToLower(o))
	}
	return p, nil
}

// Enabled reports whether any origin is allowed.
func (p CORSPolicy) Enabled() bool { return p.any || len(p.origins) > 0 }

// allows reports whether origin may call the API.
func (p CORSPolicy) allows(origin []byte) bool {
	if p.any {
		return true
	}
	return slices.ContainsFunc(p.origins, func(o string) bool { return bytes.EqualFold(origin, []byte(o)) })
}

// cors adds the CORS response headers to the answer of a request from an
// allowed origin: who may read it and which of its headers. A request
// with no Origin, or from another origin, gets none, and the browser keeps
// the answer from the page.
func (a *API) cors(ctx *fasthttp.RequestCtx) {
	p := &a.cfg.CORS
	if !p.Enabled() {
		return
	}
	h := &ctx.Response.Header
	if !p.any {
		// The answer differs by origin: caches must keep them apart.
		h.Add("Vary", "Origin")
	}
	origin := ctx.Request.Header.Peek("Origin")
	if len(origin) == 0 || !p.allows(origin) {
		return
	}
	if p.any {
		// No credentials (cookies) are involved, so the wildcard is
		// honoured: the key travels in Authorization.
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.SetBytesV("Access-Control-Allow-Origin", origin)
	}
	h.Set("Access-Control-Expose-Headers", corsExposed)
}

// isPreflight tells a CORS preflight: OPTIONS with the method the page
// means to use.
func isPreflight(ctx *fasthttp.RequestCtx) bool {
	return ctx.IsOptions() && len(ctx.Request.Header.Peek("Access-Control-Request-Method")) > 0 &&
		len(ctx.Request.Header.Peek("Origin")) > 0
}

// preflight answers a CORS preflight for a route taking methods: 204 with
// the methods and headers allowed and how long to cache that, for an
// allowed origin; a 403 the browser reports as a CORS failure otherwise.
// It needs no key (a preflight carries none), and cors has run.
func (a *API) preflight(ctx *fasthttp.RequestCtx, methods string) {
	if !a.cfg.CORS.allows(ctx.Request.Header.Peek("Origin")) {
		a.writeError(ctx, &openai.Error{Status: fasthttp.StatusForbidden, Type: openai.TypeInvalidRequest,
			Code: "cors_origin_not_allowed",
			Message: "This origin may not call the deployment API from a browser; " +
				"the node's cors_allowed_origins lists the origins that may."})
		return
	}
	h := &ctx.Response.Header
	h.Set("Access-Control-Allow-Methods", methods)
	h.Set("Access-Control-Allow-Headers", allowedHeaders(ctx.Request.Header.Peek("Access-Control-Request-Headers")))
	h.Set("Access-Control-Max-Age", corsMaxAge)
	h.Del("Access-Control-Expose-Headers") // for the actual answer, not the preflight's
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// allowedHeaders is the Access-Control-Allow-Headers of a preflight that
// asked for requested: Authorization and Content-Type, and each requested
// header that is a valid field name. A wildcard would not do: it never
// covers Authorization.
func allowedHeaders(requested []byte) string {
	out := slices.Clone(corsHeaders)
	for f := range strings.SplitSeq(string(requested), ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if httpguts.ValidHeaderFieldName(f) && !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	return strings.Join(out, ", ")
}
