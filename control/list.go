package control

import (
	"encoding/base64"
	"net/http"
	"regexp"
	"strconv"
)

const (
	defaultLimit = 20
	maxLimit     = 100
)

type listBody struct {
	Data       []any   `json:"data"`
	HasMore    bool    `json:"has_more"`
	NextCursor *string `json:"next_cursor"`
}

type page struct {
	limit  int
	cursor string // decoded: "<seq>/<id>", or ""
}

var cursorPattern = regexp.MustCompile(`^[0-9]{20}/[a-z]+_[0-9A-Za-z]{24}$`)

// parsePage reads limit and cursor. The cursor is opaque to clients: the
// base64url form of the creation-index key of the last item returned.
func parsePage(r *http.Request, allowed ...string) (page, *apiError) {
	q := r.URL.Query()
	known := map[string]bool{"limit": true, "cursor": true}
	for _, a := range allowed {
		known[a] = true
	}
	for k := range q {
		if !known[k] {
			return page{}, invalid(k, "unknown query parameter %q", k)
		}
	}
	p := page{limit: defaultLimit}
	if q.Has("limit") {
		n, err := strconv.Atoi(q.Get("limit"))
		if err != nil || n < 1 || n > maxLimit || len(q["limit"]) != 1 {
			return page{}, invalid("limit", "limit must be an integer from 1 to %d", maxLimit)
		}
		p.limit = n
	}
	if q.Has("cursor") {
		raw, err := base64.RawURLEncoding.DecodeString(q.Get("cursor"))
		if err != nil || !cursorPattern.Match(raw) || len(q["cursor"]) != 1 {
			return page{}, invalid("cursor", "cursor is not a cursor returned by this list")
		}
		p.cursor = string(raw)
	}
	return p, nil
}

// scanPage walks the creation index under prefix newest first, starting
// after the page's cursor, and collects up to limit items; load turns an
// index entry into an item or skips it.
func (s *Server) scanPage(prefix string, p page, load func(key string, val []byte) (any, bool, error)) (listBody, error) {
	out := listBody{Data: []any{}}
	start := ""
	if p.cursor != "" {
		start = prefix + p.cursor
	}
	var last string
	err := s.st.Scan(prefix, start, true, func(key string, val []byte) (bool, error) {
		item, ok, err := load(key, val)
		if err != nil || !ok {
			return err == nil, err
		}
		if len(out.Data) == p.limit {
			out.HasMore = true
			return false, nil
		}
		out.Data = append(out.Data, item)
		last = key[len(prefix):]
		return true, nil
	})
	if err != nil {
		return listBody{}, err
	}
	if out.HasMore {
		c := base64.RawURLEncoding.EncodeToString([]byte(last))
		out.NextCursor = &c
	}
	return out, nil
}
