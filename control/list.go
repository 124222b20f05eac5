package control

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"

	"github.com/hearthd/hearth/store"
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
	sealed []byte // the cursor as issued, or nil: opened by scanPage
}

// A cursor is the creation-index key of the last item returned ("<seq>/<id>"),
// sealed for its list: encrypted and authenticated (AES-256-GCM, the
// list's prefix as additional data) with a key kept in the store. So a
// cursor this list never issued — made up, changed, another list's,
// server's or project's — is refused rather than silently followed, and a
// cursor shows nothing: the seq is a global revision, which would tell one
// customer how busy all the others are.
var cursorPattern = regexp.MustCompile(`^[0-9]{20}/[a-z]+_[0-9A-Za-z]{24}$`)

// parsePage reads limit and cursor.
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
		sealed, err := base64.RawURLEncoding.DecodeString(q.Get("cursor"))
		if err != nil || len(sealed) < cursorNonceLen+cursorTagLen || len(q["cursor"]) != 1 {
			return page{}, errBadCursor
		}
		p.sealed = sealed
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
	if p.sealed != nil {
		raw, err := s.cursorAEAD.Open(nil, p.sealed[:cursorNonceLen], p.sealed[cursorNonceLen:], []byte(prefix))
		if err != nil || !cursorPattern.Match(raw) {
			return listBody{}, errBadCursor
		}
		if c := prefix + string(raw); start == "" || c < start {
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
		nonce := make([]byte, cursorNonceLen, cursorNonceLen+len(last)+cursorTagLen)
		_, _ = rand.Read(nonce) // crypto/rand never fails
		c := base64.RawURLEncoding.EncodeToString(s.cursorAEAD.Seal(nonce, nonce, []byte(last), []byte(prefix)))
		out.NextCursor = &c
	}
	return out, nil
}

// errBadCursor answers a cursor this list did not issue: malformed,
// tampered with, or another list's (another server's, another project's).
var errBadCursor = invalid("cursor", "cursor is not a cursor returned by this list")

// The sealed cursor's parts around the ciphertext (AES-GCM's standard
// nonce and tag).
const (
	cursorNonceLen = 12
	cursorTagLen   = 16
)

// loadCursorKey reads the secret cursors are signed with, making it on
// first start. It lives in the store so cursors outlive a restart.
func (s *Server) loadCursorKey() error {
	var k []byte
	err := s.st.Get(keyCursorKey, &k)
	if err == nil && len(k) == 32 {
		return s.setCursorKey(k)
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
	return s.setCursorKey(k)
}

// setCursorKey makes the cipher cursors are sealed with.
func (s *Server) setCursorKey(k []byte) error {
	block, err := aes.NewCipher(k)
	if err != nil {
		return fmt.Errorf("cursor key: %w", err)
	}
	if s.cursorAEAD, err = cipher.NewGCM(block); err != nil {
		return fmt.Errorf("cursor key: %w", err)
	}
	return nil
}
