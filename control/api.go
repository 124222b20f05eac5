package control

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	// project is the token's project: every record the request reads or
	// writes is looked up in its key space, pk.
	project string
	pk      projectKeys
	now     time.Time
	m       *mutation
	// audit describes a mutating request for its audit log entry (nil
	// for a read); resources are the IDs the request made or touched
	// beyond its path's, actions the actions it started.
	audit     *auditInfo
	resources []string
	actions   []string
}

// started notes an action the request started, and its resources.
func (rc *reqCtx) started(a actionRec) {
	rc.actions = append(rc.actions, a.ID)
	for _, r := range a.Resources {
		rc.resources = append(rc.resources, r.ID)
	}
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
	// replay, if set, is what an Idempotency-Key replay answers instead of
	// body: an answer that shows a secret once must not be stored.
	replay any
}

type apiFunc func(r *http.Request, rc *reqCtx) (result, error)

const maxIdempotencyKeyLen = 255

var errIdempotencyConflict = &apiError{status: http.StatusConflict, code: CodeIdempotencyConflict, param: "Idempotency-Key",
	message: "this Idempotency-Key was already used with a different request"}

// api frames a management API handler: authentication, rate limiting,
// serialisation of changes, Idempotency-Key handling, and the commit of the
// handler's change before the answer is written, so nothing answered 2xx
// can be lost.
func (s *Server) api(h apiFunc) http.HandlerFunc { return s.apiWarm(h, nil) }

// warmFunc reads, before a change takes the lock, records its handler
// will read under it (body is the request body, which the handler reads
// again). On a shared database a read under the lock of a record the
// replica's cache holds costs nothing, and one it does not costs a round
// trip that every other change waits for; read here, in the request's own
// time, the record is in the cache when the handler asks, still checked
// strongly then (the cache answers only what it proves current). Errors
// are ignored: the handler reads again and reports them.
type warmFunc func(rc *reqCtx, body []byte)

// apiWarm is api with warm run before the change lock is taken, on a
// shared database only (elsewhere a read costs no round trip).
func (s *Server) apiWarm(h apiFunc, warm warmFunc) http.HandlerFunc {
	return s.apiFrame(h, warm, false)
}

// apiFold is apiWarm for a POST whose changes are folded (fold.go): the
// changes waiting for the lock together take it once and commit once.
func (s *Server) apiFold(h apiFunc, warm warmFunc) http.HandlerFunc { return s.apiFrame(h, warm, true) }

func (s *Server) apiFrame(h apiFunc, warm warmFunc, fold bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		write := r.Method != http.MethodGet && r.Method != http.MethodHead
		// A change's token is checked strongly under the lock (below).
		lag := write && s.shared != nil
		tok, ok := s.gate(w, r, lag)
		if !ok {
			return
		}
		rc := &reqCtx{s: s, requestID: w.Header().Get("X-Request-Id"), tokenID: tok.ID,
			project: tok.Project, pk: keysOf(tok.Project)}
		if write {
			// Deferred before the change lock's release: the entry of a
			// request its change did not carry is written after it.
			sw := &statusWriter{ResponseWriter: w}
			w, rc.audit = sw, newAuditInfo(r, tok)
			defer s.auditAfter(r, rc, sw)
		}
		if tok.Scope != ScopeReadWrite && write {
			writeError(w, &apiError{status: http.StatusForbidden, code: CodeForbidden,
				message: "this API token is read-only: it may only read (GET) its project"})
			return
		}

		unlock := func() error { return nil }
		idemKey, reqHash, ierr := readIdempotency(r)
		if ierr != nil {
			writeError(w, ierr)
			return
		}
		if write {
			if s.shared != nil {
				if idemKey != "" {
					_, _ = s.st.Has(pfxIdempotency + tok.ID + "/" + idemKey)
				}
				if warm != nil {
					warm(rc, peekBody(r))
				}
			}
			if fold && r.Method == http.MethodPost {
				j := &changeJob{r: r, rc: rc, tok: tok, lag: lag, idemKey: idemKey, reqHash: reqHash, h: h,
					done: make(chan struct{})}
				s.queueChange(context.WithoutCancel(r.Context()), j)
				j.answer(w)
				return
			}
			var err error
			if unlock, err = s.lock(r.Context()); err != nil {
				s.internal(w, rc, err)
				return
			}
			defer unlock() //nolint:errcheck // a no-op once the success path below has called it
			if lag {
				// The token as of the lock: one revoked before it no
				// longer changes anything.
				cur, aerr := s.authenticate(r, false)
				if aerr == nil && (cur.ID != tok.ID || cur.Project != tok.Project || cur.Scope != tok.Scope) {
					aerr = errUnauthorized
				}
				if aerr != nil {
					writeError(w, aerr)
					return
				}
			}
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
				writeError(w, errIdempotencyConflict)
				return
			default:
				w.Header().Set("Idempotent-Replayed", "true")
				rc.replayed(prev.Body)
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
		out, err := s.finish(r, rc, res, idemStoreKey, reqHash, idemKey != "")
		if err != nil {
			s.internal(w, rc, err)
			return
		}
		// The change is acknowledged only once durable.
		if err := unlock(); err != nil {
			s.internal(w, rc, err)
			return
		}
		rc.setActionHeader(w)
		writeRaw(w, res.status, out)
	}
}

// finish encodes a successful answer and commits the request's change,
// with the answer to replay for its Idempotency-Key if it has one. Only
// successful answers are remembered: a request refused for validation or
// capacity may be retried with the same key. On error nothing is committed.
func (s *Server) finish(r *http.Request, rc *reqCtx, res result, idemStoreKey, reqHash string, remember bool) ([]byte, error) {
	out, _, err := s.stageAnswer(r, rc, res, idemStoreKey, reqHash, remember)
	if err != nil {
		if rc.m != nil {
			rc.m.discard()
		}
		return nil, err
	}
	if rc.m != nil {
		if err := rc.m.commit(); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// stageAnswer encodes a successful answer and stages, in the request's
// change, the answer to replay for its Idempotency-Key (kept) if it has
// one, and the request's audit log entry.
func (s *Server) stageAnswer(r *http.Request, rc *reqCtx, res result, idemStoreKey, reqHash string, remember bool) (out, kept []byte, err error) {
	if err := s.stageAudit(r, rc, res.status); err != nil {
		return nil, nil, err
	}
	out, err = encodeBody(res.body)
	if err == nil && remember && res.status < 300 {
		kept = out
		if res.replay != nil {
			kept, err = encodeBody(res.replay)
		}
		if err == nil {
			err = rc.mutation().put(idemStoreKey, idempotencyRec{
				RequestHash: reqHash, Status: res.status, Body: kept, ExpiresAt: rc.now.Add(s.cfg.IdempotencyTTL),
			})
		}
	}
	return out, kept, err
}

// encodeBody is an answer's JSON; nil for none (204).
func encodeBody(body any) ([]byte, error) {
	if body == nil {
		return nil, nil
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode answer: %w", err)
	}
	return b, nil
}

// readIdempotency reads a POST's or PATCH's whole body, before the caller
// takes the lock so that a slow client cannot stall every other change, and
// returns a POST's Idempotency-Key, if any, with the hash of the request the
// key stands for. PATCH takes no key: it is idempotent.
func readIdempotency(r *http.Request) (key, hash string, _ *apiError) {
	if r.Method != http.MethodPost && r.Method != http.MethodPatch {
		return "", "", nil
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return "", "", decodeError(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	if r.Method == http.MethodPatch {
		return "", "", nil
	}
	key = r.Header.Get("Idempotency-Key")
	if key == "" && len(r.Header.Values("Idempotency-Key")) == 0 {
		return "", "", nil
	}
	if e := checkIdempotencyKey(key); e != nil {
		return "", "", e
	}
	sum := sha256.Sum256([]byte(r.Method + " " + r.URL.Path + "\n" + string(body)))
	return key, hex.EncodeToString(sum[:]), nil
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
	if ae := storeFailure(err); ae != nil {
		writeError(w, ae)
		return
	}
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

// authenticate finds the request's API token. With lag it may take a
// record the cache held a moment ago (store.Lagging), if that one is
// valid: a change reads it again, strongly, under the change lock (api),
// where the cache answers it at no cost. A token not found that way is
// read strongly, so one just created through another replica works at
// once.
func (s *Server) authenticate(r *http.Request, lag bool) (tokenRec, *apiError) {
	cred := bearer(r)
	if !strings.HasPrefix(cred, secretAPIToken) {
		return tokenRec{}, errUnauthorized
	}
	h := hashSecret(cred)
	var tok tokenRec
	if lag {
		if err := store.Lagging(s.st).Get(pfxAPIToken+h, &tok); err == nil && hashesEqual(tok.Hash, h) && tok.Project != "" {
			return tok, nil
		}
		tok = tokenRec{}
	}
	if err := s.st.Get(pfxAPIToken+h, &tok); err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.log.Error("look up API token", "err", err)
			if ae := storeFailure(err); ae != nil {
				return tokenRec{}, ae
			}
		}
		return tokenRec{}, errUnauthorized
	}
	if !hashesEqual(tok.Hash, h) || tok.Project == "" {
		return tokenRec{}, errUnauthorized
	}
	return tok, nil
}

// gate lets a management request in: a valid token, with a request left in
// its bucket. Every answer it lets through, and its 429, carries the
// bucket's RateLimit-* headers; on refusal it has written the answer.
func (s *Server) gate(w http.ResponseWriter, r *http.Request, lag bool) (tokenRec, bool) {
	tok, aerr := s.authenticate(r, lag)
	if aerr != nil {
		writeError(w, aerr)
		return tok, false
	}
	now := s.cfg.Now()
	s.noteTokenUse(tok.ID, now)
	q := s.admit(tok.ID, now)
	h := w.Header()
	h.Set("RateLimit-Limit", strconv.Itoa(s.cfg.RateBurst))
	h.Set("RateLimit-Remaining", strconv.Itoa(q.remaining))
	h.Set("RateLimit-Reset", strconv.FormatInt(q.reset, 10))
	if q.wait > 0 {
		h.Set("Retry-After", strconv.Itoa(int(math.Ceil(q.wait.Seconds()))))
		writeError(w, &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited,
			message: "too many requests for this API token; retry after the Retry-After delay"})
		return tok, false
	}
	return tok, true
}

// quota is a token's bucket after a request: wait > 0 if the request was
// refused (how long until it would be admitted), the requests left, and
// the Unix time (seconds, rounded up) at which the bucket is full again.
type quota struct {
	wait      time.Duration
	remaining int
	reset     int64
}

// admit takes one request from the token's bucket at now.
func (s *Server) admit(tokenID string, now time.Time) quota {
	return s.admitIn(tokenID, now, s.cfg.RateLimit, s.cfg.RateBurst)
}

// admitIn takes one request at now from the bucket named key, made with
// limit and burst on first use.
func (s *Server) admitIn(key string, now time.Time, limit float64, burst int) quota {
	s.limMu.Lock()
	lim, ok := s.limiters[key]
	if !ok {
		lim = rate.NewLimiter(rate.Limit(limit), burst)
		s.limiters[key] = lim
	}
	s.limMu.Unlock()
	var q quota
	res := lim.ReserveN(now, 1)
	if d := res.DelayFrom(now); d > 0 {
		res.CancelAt(now)
		q.wait = d
	}
	left := max(lim.TokensAt(now), 0)
	q.remaining = int(left)
	empty := float64(burst) - left
	q.reset = int64(math.Ceil(float64(now.UnixNano())/1e9 + empty/limit))
	return q
}

// creditPerChange is what one change of a node's desired state costs the
// node: the report that it applied it, a second report should the runtime
// change with it, and the long-poll that waits for the next change (the
// one that delivered this change was taken before it).
const creditPerChange = 3

// creditNode credits a node the requests a change of its desired state
// will cost it, up to its bucket's size (changes the node takes in one
// answer leave credit over).
func (s *Server) creditNode(nodeID string) {
	s.limMu.Lock()
	s.nodeCredit[nodeID] = min(s.nodeCredit[nodeID]+creditPerChange, max(s.cfg.NodeRateBurst, creditPerChange))
	s.limMu.Unlock()
}

// admitNode takes one request of a node: from its credit if it has any,
// else from its bucket. The credit comes from changes made for the node
// (creditNode), so its tenant's burst of changes, however fast, never
// empties the bucket that keeps a misbehaving node in check: each change
// pays for what it makes the node do, and nothing else is free.
func (s *Server) admitNode(nodeID string, now time.Time) quota {
	s.limMu.Lock()
	if c := s.nodeCredit[nodeID]; c > 0 {
		if c == 1 {
			delete(s.nodeCredit, nodeID)
		} else {
			s.nodeCredit[nodeID] = c - 1
		}
		s.limMu.Unlock()
		return quota{}
	}
	s.limMu.Unlock()
	return s.admitIn("node/"+nodeID, now, s.cfg.NodeRateLimit, s.cfg.NodeRateBurst)
}

// noteTokenUse remembers a token's last use in memory; the sweep persists
// it, so a request costs no write.
func (s *Server) noteTokenUse(id string, at time.Time) {
	s.tokMu.Lock()
	s.tokUsed[id] = at.UTC()
	s.tokMu.Unlock()
}

// withLastUse fills in the last uses not yet persisted.
func (s *Server) withLastUse(tokens []TokenInfo) {
	s.tokMu.Lock()
	defer s.tokMu.Unlock()
	for i, t := range tokens {
		if at, ok := s.tokUsed[t.ID]; ok && (t.LastUsedAt == nil || at.After(*t.LastUsedAt)) {
			tokens[i].LastUsedAt = &at
		}
	}
}

// forgetToken drops a revoked token's bucket and unpersisted last use.
func (s *Server) forgetToken(id string) {
	s.limMu.Lock()
	delete(s.limiters, id)
	s.limMu.Unlock()
	s.tokMu.Lock()
	delete(s.tokUsed, id)
	s.tokMu.Unlock()
}

// peekBody reads r's body and puts it back for the handler to read again,
// with the same error (a body over the limit) after it.
func peekBody(r *http.Request) []byte {
	body, err := io.ReadAll(r.Body)
	if err == nil {
		err = io.EOF
	}
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
	return body
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// setActionHeader names the actions the request started in its answer.
func (rc *reqCtx) setActionHeader(w http.ResponseWriter) {
	for _, id := range rc.actions {
		w.Header().Add(actionHeader, id)
	}
}
