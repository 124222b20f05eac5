package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/internal/ids"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// Deployment API keys: issued here per deployment server, enforced by its
// node. The secret has the very format of the node's own keys (hearthd
// keys, apikeys.Prefix followed by 32 base62 characters) so the node's
// parser and lookup take both.
const (
	prefixAPIKey    = "dk_"
	apiKeySecret    = "hearth_live_"
	apiKeySecretLen = 32 // ≈ 190 bits
	apiKeyHintLen   = 4

	// MaxAPIKeysPerServer bounds a server's keys (and so its desired
	// state); one more is a 409.
	MaxAPIKeysPerServer = 100
	// maxPerMinute bounds the per-key limits, well inside what a node can
	// count without overflow.
	maxPerMinute = 1_000_000_000
)

type createAPIKeyReq struct {
	Name              string  `json:"name"`
	ExpiresAt         *string `json:"expires_at"`
	RequestsPerMinute int     `json:"requests_per_minute"`
	TokensPerMinute   int     `json:"tokens_per_minute"`
}

// apiKeyJSON is a key as the API shows it: never the secret, with its usage
// as the node last reported it.
type apiKeyJSON struct {
	ID                string  `json:"id"`
	ServerID          string  `json:"server_id"`
	Name              string  `json:"name"`
	Hint              string  `json:"hint"`
	CreatedAt         string  `json:"created_at"`
	ExpiresAt         *string `json:"expires_at"`
	RequestsPerMinute int     `json:"requests_per_minute"`
	TokensPerMinute   int     `json:"tokens_per_minute"`
	Requests          uint64  `json:"requests"`
	PromptTokens      uint64  `json:"prompt_tokens"`
	CompletionTokens  uint64  `json:"completion_tokens"`
	LastUsedAt        *string `json:"last_used_at"`
}

// createdAPIKeyJSON is the create answer: the only one with the secret.
// An Idempotency-Key replay answers it with key null, since the secret is
// never stored.
type createdAPIKeyJSON struct {
	apiKeyJSON
	Key    *string     `json:"key"`
	Action *actionJSON `json:"action,omitempty"`
}

func apiKeyOut(k apiKeyRec, u nodeapi.KeyUsage) apiKeyJSON {
	out := apiKeyJSON{ID: k.ID, ServerID: k.ServerID, Name: k.Name, Hint: k.Hint, CreatedAt: formatTime(k.CreatedAt),
		RequestsPerMinute: k.RequestsPerMinute, TokensPerMinute: k.TokensPerMinute,
		Requests: u.Requests, PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens}
	if k.ExpiresAt != nil {
		at := formatTime(*k.ExpiresAt)
		out.ExpiresAt = &at
	}
	if u.LastUsedAt != nil {
		at := formatTime(*u.LastUsedAt)
		out.LastUsedAt = &at
	}
	return out
}

// usageOf is a key's last reported usage (zero if none yet).
func usageOf(rd store.KV, id string) (nodeapi.KeyUsage, error) {
	var u nodeapi.KeyUsage
	if err := rd.Get(pfxAPIKeyUsage+id, &u); err != nil && !errors.Is(err, store.ErrNotFound) {
		return u, fmt.Errorf("load usage of %s: %w", id, err)
	}
	return u, nil
}

func validateAPIKey(req *createAPIKeyReq, now time.Time) (*time.Time, *apiError) {
	if !validName(req.Name) {
		return nil, invalid("name", "name must be 1 to %d characters without control or invisible characters (such as bidi overrides or blank fillers) or surrounding spaces", maxKeyNameLen)
	}
	if req.RequestsPerMinute < 0 || req.RequestsPerMinute > maxPerMinute {
		return nil, invalid("requests_per_minute", "requests_per_minute must be an integer from 0 (unlimited) to %d", maxPerMinute)
	}
	if req.TokensPerMinute < 0 || req.TokensPerMinute > maxPerMinute {
		return nil, invalid("tokens_per_minute", "tokens_per_minute must be an integer from 0 (unlimited) to %d", maxPerMinute)
	}
	if req.ExpiresAt == nil {
		return nil, nil
	}
	at, err := time.Parse(time.RFC3339, *req.ExpiresAt)
	if err != nil {
		return nil, invalid("expires_at", "expires_at must be an RFC 3339 time such as 2030-01-02T15:04:05Z")
	}
	// Whole seconds: what the API shows is exactly what the node enforces.
	at = at.UTC().Truncate(time.Second)
	if !at.After(now) {
		return nil, invalid("expires_at", "expires_at must be in the future")
	}
	return &at, nil
}

func (s *Server) createAPIKey(r *http.Request, rc *reqCtx) (result, error) {
	srv, err := s.loadServerParam(r, rc)
	if err != nil {
		return result{}, err
	}
	var req createAPIKeyReq
	if e := s.decodeJSON(r, &req); e != nil {
		return result{}, e
	}
	expires, e := validateAPIKey(&req, rc.now)
	if e != nil {
		return result{}, e
	}
	switch {
	case srv.Stack != StackDeployment:
		return result{}, conflict("server_id", "server %s has the %s stack: API keys are for deployment servers", srv.ID, srv.Stack)
	case srv.Status == StatusDeleting:
		return result{}, conflict("server_id", "server %s is being deleted", srv.ID)
	}
	count := 0
	if err := s.st.Scan(pfxAPIKey+srv.ID+"/", "", false, func(string, []byte) (bool, error) {
		count++
		return true, nil
	}); err != nil {
		return result{}, err
	}
	if count >= MaxAPIKeysPerServer {
		return result{}, conflict("server_id", "server %s already has the maximum of %d API keys", srv.ID, MaxAPIKeysPerServer)
	}
	secret := ids.New(apiKeySecret, apiKeySecretLen)
	m := rc.mutation()
	rec := apiKeyRec{ID: newID(prefixAPIKey), Project: rc.project, ServerID: srv.ID, Name: req.Name, Hash: hashSecret(secret),
		Hint: apiKeySecret + "…" + secret[len(secret)-apiKeyHintLen:], ExpiresAt: expires,
		RequestsPerMinute: req.RequestsPerMinute, TokensPerMinute: req.TokensPerMinute,
		Seq: m.nextRev(), CreatedAt: rc.now}
	if err := m.put(rec.key(), rec); err != nil {
		return result{}, err
	}
	if err := m.put(rec.idKey(), rec.key()); err != nil {
		return result{}, err
	}
	if exp := rec.expKey(); exp != "" {
		if err := m.put(exp, rec.key()); err != nil {
			return result{}, err
		}
	}
	act, err := s.serverAction(rc, &srv, ActAPIKeyCreate, actionResource{Type: "api_key", ID: rec.ID})
	if err != nil {
		return result{}, err
	}
	shown := apiKeyOut(rec, nodeapi.KeyUsage{})
	return result{status: http.StatusCreated, body: createdAPIKeyJSON{apiKeyJSON: shown, Key: &secret, Action: act},
		replay: createdAPIKeyJSON{apiKeyJSON: shown, Action: act}}, nil
}

func (s *Server) listAPIKeys(r *http.Request, rc *reqCtx) (result, error) {
	srv, err := s.loadServerParam(r, rc)
	if err != nil {
		return result{}, err
	}
	p, e := parsePage(r)
	if e != nil {
		return result{}, e
	}
	body, err := s.scanPage(pfxAPIKey+srv.ID+"/", p, func(_ string, val []byte) (any, bool, error) {
		var rec apiKeyRec
		if err := json.Unmarshal(val, &rec); err != nil {
			return nil, false, err
		}
		u, err := usageOf(s.st, rec.ID)
		if err != nil {
			return nil, false, err
		}
		return apiKeyOut(rec, u), true, nil
	})
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: body}, nil
}

// loadAPIKey resolves {server_id} and {key_id}; a key of another server is
// not found here.
func (s *Server) loadAPIKey(r *http.Request, rc *reqCtx) (serverRec, apiKeyRec, error) {
	srv, err := s.loadServerParam(r, rc)
	if err != nil {
		return srv, apiKeyRec{}, err
	}
	id := r.PathValue("key_id")
	rec, err := loadOwned[apiKeyRec](s.st, id, prefixAPIKey, pfxAPIKeyID, srv.ID)
	if errors.Is(err, store.ErrNotFound) {
		return srv, rec, notFound("key_id", "no API key %q on server %s", id, srv.ID)
	}
	return srv, rec, err
}

func (s *Server) getAPIKey(r *http.Request, rc *reqCtx) (result, error) {
	_, rec, err := s.loadAPIKey(r, rc)
	if err != nil {
		return result{}, err
	}
	u, err := usageOf(s.st, rec.ID)
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: apiKeyOut(rec, u)}, nil
}

// deleteAPIKey revokes a key: it leaves the node's desired state at a new
// revision, which wakes the node's long-poll on commit.
func (s *Server) deleteAPIKey(r *http.Request, rc *reqCtx) (result, error) {
	srv, rec, err := s.loadAPIKey(r, rc)
	if err != nil {
		return result{}, err
	}
	removeAPIKey(rc.mutation(), rec)
	if _, err := s.serverAction(rc, &srv, ActAPIKeyDelete, actionResource{Type: "api_key", ID: rec.ID}); err != nil {
		return result{}, err
	}
	return result{status: http.StatusNoContent}, nil
}

// removeAPIKey stages the removal of a key with its indexes and usage.
func removeAPIKey(m *mutation, k apiKeyRec) {
	m.b.Delete(k.key())
	m.b.Delete(k.idKey())
	if exp := k.expKey(); exp != "" {
		m.b.Delete(exp)
	}
	m.b.Delete(pfxAPIKeyUsage + k.ID)
}

// desiredAPIKeys lists a server's keys for its node, oldest first, without
// those expired at now.
func desiredAPIKeys(rd store.KV, serverID string, now time.Time) ([]nodeapi.APIKey, error) {
	out := []nodeapi.APIKey{}
	err := store.ScanJSON(rd, pfxAPIKey+serverID+"/", func(_ string, k apiKeyRec) (bool, error) {
		if !k.expired(now) {
			out = append(out, nodeapi.APIKey{ID: k.ID, Name: k.Name, Hash: k.Hash, ExpiresAt: k.ExpiresAt,
				RequestsPerMinute: k.RequestsPerMinute, TokensPerMinute: k.TokensPerMinute})
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("load API keys of %s: %w", serverID, err)
	}
	return out, nil
}

// recordUsage stores the usage a node reports for its server's keys. Entries
// for keys the server does not have (deleted, or never its own) are
// ignored; unchanged ones are not rewritten.
func (s *Server) recordUsage(m *mutation, serverID string, usage []nodeapi.KeyUsage) error {
	for _, u := range usage {
		if !validID(u.ID, prefixAPIKey) {
			continue
		}
		switch own, err := m.r.Has(pfxAPIKeyID + serverID + "/" + u.ID); {
		case err != nil:
			return fmt.Errorf("look up API key %s: %w", u.ID, err)
		case !own:
			continue
		}
		prev, err := usageOf(m.r, u.ID)
		if err != nil {
			return err
		}
		if sameUsage(prev, u) {
			continue
		}
		if err := m.put(pfxAPIKeyUsage+u.ID, u); err != nil {
			return err
		}
	}
	return nil
}

func sameUsage(a, b nodeapi.KeyUsage) bool {
	if a.Requests != b.Requests || a.PromptTokens != b.PromptTokens || a.CompletionTokens != b.CompletionTokens {
		return false
	}
	if a.LastUsedAt == nil || b.LastUsedAt == nil {
		return a.LastUsedAt == nil && b.LastUsedAt == nil
	}
	return a.LastUsedAt.Equal(*b.LastUsedAt)
}

// keysExpiring reports, through rd (without the change lock), whether the
// expiry index's first entry is due: expireAPIKeys has work. An entry it
// cannot read is reported due, for expireAPIKeys to report.
func keysExpiring(rd store.KV, now time.Time) (bool, error) {
	due := false
	err := rd.Scan(pfxAPIKeyExp, "", false, func(key string, _ []byte) (bool, error) {
		at, err := expiryOf(key)
		due = err != nil || now.Unix() >= at
		return false, nil
	})
	return due, err
}

// expiryOf is the Unix time of an expiry index entry.
func expiryOf(key string) (int64, error) {
	if len(key) < len(pfxAPIKeyExp)+20 {
		return 0, fmt.Errorf("expiry index entry %q: too short", key)
	}
	at, err := strconv.ParseInt(key[len(pfxAPIKeyExp):len(pfxAPIKeyExp)+20], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("expiry index entry %q: %w", key, err)
	}
	return at, nil
}

// expireAPIKeys takes the keys that expired by now out of their nodes'
// desired state: it drops their expiry index entries and gives each node a
// new revision. The index is ordered by expiry, so this reads only the keys
// that expired since the last sweep.
func (s *Server) expireAPIKeys(m *mutation, now time.Time) (bool, error) {
	dirty := false
	err := s.st.Scan(pfxAPIKeyExp, "", false, func(key string, val []byte) (bool, error) {
		at, err := expiryOf(key)
		if err != nil {
			return false, err
		}
		if now.Unix() < at {
			return false, nil
		}
		m.b.Delete(key)
		dirty = true
		var recKey string
		if err := json.Unmarshal(val, &recKey); err != nil {
			return false, fmt.Errorf("expiry index entry %q: %w", key, err)
		}
		var k apiKeyRec
		var srv serverRec
		err = s.st.Get(recKey, &k)
		if err == nil {
			err = s.st.Get(keysOf(k.Project).server(k.ServerID), &srv)
		}
		if errors.Is(err, store.ErrNotFound) {
			return true, nil
		}
		if err != nil {
			return false, fmt.Errorf("expiry index entry %q: %w", key, err)
		}
		if srv.Status != StatusDeleting {
			m.logInfo("API key expired", "key", key[strings.LastIndexByte(key, '/')+1:], "server", srv.ID)
			return true, m.bump(srv.NodeID)
		}
		return true, nil
	})
	return dirty, err
}
