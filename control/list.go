package control

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/hearthd/hearth/store"
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
	mac    []byte // the cursor's signature
}

var cursorPattern = regexp.MustCompile(`^[0-9]{20}/[a-z]+_[0-9A-Za-z]{24}$`)

// parsePage reads limit and cursor. The cursor is opaque to clients: the
// base64url form of the creation-index key of the last item returned, a
// dot, and its signature for that list (checked by scanPage), so a cursor
// this list never issued is refused rather than silently followed.
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
		key, sig, _ := strings.Cut(q.Get("cursor"), ".")
		raw, err := base64.RawURLEncoding.DecodeString(key)
		mac, err2 := base64.RawURLEncoding.DecodeString(sig)
		if err != nil || err2 != nil || len(mac) != cursorMACLen || !cursorPattern.Match(raw) || len(q["cursor"]) != 1 {
			return page{}, errBadCursor
		}
		p.cursor, p.mac = string(raw), mac
	}
	return p, nil
}

// scanPage walks the creation index under prefix newest first, starting
// after the page's cursor, and collects up to limit items; load turns an
// index entry into an item or skips it.
func (s *Server) scanPage(prefix string, p page, load func(key string, val []byte) (any, bool, error)) (listBody, error) {
	return s.scanPageIn(prefix, p, "", "", load)
}

// scanPageIn is scanPage within the keys [from, until) (either "": no
// bound).
func (s *Server) scanPageIn(prefix string, p page, from, until string, load func(key string, val []byte) (any, bool, error)) (listBody, error) {
	out := listBody{Data: []any{}}
	start := until
	if p.cursor != "" {
		if !hmac.Equal(s.cursorMAC(prefix, p.cursor), p.mac) {
			return listBody{}, errBadCursor
		}
		if c := prefix + p.cursor; start == "" || c < start {
			start = c
		}
	}
	var last string
	err := s.st.Scan(prefix, start, true, func(key string, val []byte) (bool, error) {
		if from != "" && key < from {
			return false, nil
		}
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
		c := base64.RawURLEncoding.EncodeToString([]byte(last)) + "." +
			base64.RawURLEncoding.EncodeToString(s.cursorMAC(prefix, last))
		out.NextCursor = &c
	}
	return out, nil
}

// errBadCursor answers a cursor this list did not issue: malformed,
// tampered with, or another list's (another server's, another project's).
var errBadCursor = invalid("cursor", "cursor is not a cursor returned by this list")

const cursorMACLen = 16

// cursorMAC signs a cursor for the list under prefix.
func (s *Server) cursorMAC(prefix, cursor string) []byte {
	m := hmac.New(sha256.New, s.cursorKey)
	m.Write([]byte(prefix))
	m.Write([]byte{0})
	m.Write([]byte(cursor))
	return m.Sum(nil)[:cursorMACLen]
}

// loadCursorKey reads the secret cursors are signed with, making it on
// first start. It lives in the store so cursors outlive a restart.
func (s *Server) loadCursorKey() error {
	var k []byte
	err := s.st.Get(keyCursorKey, &k)
	if err == nil && len(k) == 32 {
		s.cursorKey = k
		return nil
	}
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("load cursor key: %w", err)
	}
	k = make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return fmt.Errorf("make cursor key: %w", err)
	}
	m := s.begin()
	if err := m.put(keyCursorKey, k); err != nil {
		m.discard()
		return err
	}
	if err := m.commit(); err != nil {
		return fmt.Errorf("store cursor key: %w", err)
	}
	s.cursorKey = k
	return nil
}
