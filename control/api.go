package control

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/hearthd/hearth/store"
)

// reqCtx is what a management API handler knows about its request.
type reqCtx struct {
	s         *Server
	requestID string
	tokenID   string
	now       time.Time
	m         *mutation
}

// mutation returns the request's change, starting it on first use. The
// framing in api commits it after a successful handler and discards it
// otherwise. Only mutating requests (which hold s.mu) may call it.
func (rc *reqCtx) mutation() *mutation {
	if rc.m == nil {
		rc.m = rc.s.begin()
	}
	return rc.m
}

type result struct {
	status int
	body   any // nil for 204
}

type apiFunc func(r *http.Request, rc *reqCtx) (result, error)

const maxIdempotencyKeyLen = 255

// api frames a management API handler: authentication, rate limiting,
// serialisation of changes, Idempotency-Key handling, and the commit of the
// handler's change before the answer is written, so nothing answered 2xx
// can be lost.
func (s *Server) api(h apiFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, aerr := s.authenticate(r)
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		if wait, ok := s.admit(tok.ID); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
			writeError(w, &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited,
				message: "too many requests for this API token; retry after the Retry-After delay"})
			return
		}
		rc := &reqCtx{s: s, requestID: w.Header().Get("X-Request-Id"), tokenID: tok.ID}

		var idemKey, reqHash string
		if r.Method == http.MethodPost {
			// Read the whole body before taking the lock so a slow client
			// cannot stall every other change.
			body, err := io.ReadAll(r.Body)
			if err != nil {
				writeError(w, decodeError(err))
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if idemKey = r.Header.Get("Idempotency-Key"); idemKey != "" || len(r.Header.Values("Idempotency-Key")) > 0 {
				if e := checkIdempotencyKey(idemKey); e != nil {
					writeError(w, e)
					return
				}
				sum := sha256.Sum256([]byte(r.Method + " " + r.URL.Path + "\n" + string(body)))
				reqHash = hex.EncodeToString(sum[:])
			}
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.mu.Lock()
			defer s.mu.Unlock()
		}
		rc.now = s.now()

		idemStoreKey := pfxIdempotency + tok.ID + "/" + idemKey
		if idemKey != "" {
			var prev idempotencyRec
			err := s.st.Get(idemStoreKey, &prev)
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				s.internal(w, rc, err)
				return
			case !prev.ExpiresAt.After(rc.now):
				// Expired but not yet purged: treat as new.
			case prev.RequestHash != reqHash:
				writeError(w, &apiError{status: http.StatusConflict, code: CodeIdempotencyConflict, param: "Idempotency-Key",
					message: "this Idempotency-Key was already used with a different request"})
				return
			default:
				w.Header().Set("Idempotent-Replayed", "true")
				writeRaw(w, prev.Status, prev.Body)
				return
			}
		}

		res, err := h(r, rc)
		if err != nil {
			if rc.m != nil {
				rc.m.discard()
			}
			var ae *apiError
			if errors.As(err, &ae) {
				writeError(w, ae)
				return
			}
			s.internal(w, rc, err)
			return
		}
		var out []byte
		if res.body != nil {
			if out, err = json.Marshal(res.body); err != nil {
				if rc.m != nil {
					rc.m.discard()
				}
				s.internal(w, rc, err)
				return
			}
		}
		// Only successful answers are remembered: a request refused for
		// validation or capacity may be retried with the same key.
		if idemKey != "" && res.status < 300 {
			if err := rc.mutation().put(idemStoreKey, idempotencyRec{
				RequestHash: reqHash, Status: res.status, Body: out, ExpiresAt: rc.now.Add(s.cfg.IdempotencyTTL),
			}); err != nil {
				rc.m.discard()
				s.internal(w, rc, err)
				return
			}
		}
		if rc.m != nil {
			if err := rc.m.commit(); err != nil {
				s.internal(w, rc, err)
				return
			}
		}
		writeRaw(w, res.status, out)
	}
}

func checkIdempotencyKey(k string) *apiError {
	if k == "" || len(k) > maxIdempotencyKeyLen {
		return invalid("Idempotency-Key", "Idempotency-Key must be 1 to %d characters", maxIdempotencyKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return invalid("Idempotency-Key", "Idempotency-Key must be printable ASCII without spaces")
		}
	}
	return nil
}

func (s *Server) internal(w http.ResponseWriter, rc *reqCtx, err error) {
	s.log.Error("management API request failed", "request_id", rc.requestID, "err", err)
	writeError(w, &apiError{status: http.StatusInternalServerError, code: CodeInternal,
		message: "internal error; the request ID identifies it in the control plane's log"})
}

// bearer extracts the bearer credential, or "".
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(cred)
}

var errUnauthorized = &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized,
	message: "missing or invalid API token; send Authorization: Bearer <token>"}

func (s *Server) authenticate(r *http.Request) (tokenRec, *apiError) {
	cred := bearer(r)
	if !strings.HasPrefix(cred, secretAPIToken) {
		return tokenRec{}, errUnauthorized
	}
	h := hashSecret(cred)
	var tok tokenRec
	if err := s.st.Get(pfxAPIToken+h, &tok); err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.log.Error("look up API token", "err", err)
		}
		return tokenRec{}, errUnauthorized
	}
	if !hashesEqual(tok.Hash, h) {
		return tokenRec{}, errUnauthorized
	}
	return tok, nil
}

// admit takes one request from the token's bucket, or reports how long
// until one is available.
func (s *Server) admit(tokenID string) (time.Duration, bool) {
	s.limMu.Lock()
	lim, ok := s.limiters[tokenID]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(s.cfg.RateLimit), s.cfg.RateBurst)
		s.limiters[tokenID] = lim
	}
	s.limMu.Unlock()
	now := time.Now()
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		return d, false
	}
	return 0, true
}
