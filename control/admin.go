package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/hearthd/hearth/internal/adminsock"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// NewEnrollmentToken is a freshly made enrollment token. It may enroll Uses
// nodes until ExpiresAt.
type NewEnrollmentToken struct {
	ID        string    `json:"id"`
	Token     string    `json:"token"`
	Uses      int       `json:"uses"`
	ExpiresAt time.Time `json:"expires_at"`
}

// NodeInfo describes an enrolled node for operators.
type NodeInfo struct {
	ID       string            `json:"id"`
	Hostname string            `json:"hostname"`
	Hardware nodeapi.Hardware  `json:"hardware"`
	ServerID string            `json:"server_id,omitempty"`
	Revision uint64            `json:"revision"`
	Observed *nodeapi.Observed `json:"observed,omitempty"`
	LastSeen time.Time         `json:"last_seen"`
	// WipePending: the node's server is gone but the node has not yet
	// reported its wipe, so it is out of the pool.
	WipePending bool `json:"wipe_pending,omitempty"`
}

// CreateEnrollmentToken stores a new enrollment token good for uses
// enrollments within ttl.
func CreateEnrollmentToken(st store.KV, uses int, ttl time.Duration, now time.Time) (NewEnrollmentToken, error) {
	if uses < 1 {
		return NewEnrollmentToken{}, errors.New("an enrollment token needs at least one use")
	}
	if ttl <= 0 {
		return NewEnrollmentToken{}, errors.New("an enrollment token needs a positive lifetime")
	}
	id, tok := newID(prefixEnrollment), newSecret(secretEnrollment)
	h := hashSecret(tok)
	rec := enrollmentRec{ID: id, Hash: h, UsesLeft: uses, ExpiresAt: now.UTC().Add(ttl), CreatedAt: now.UTC()}
	if err := st.Put(pfxEnrollment+h, rec); err != nil {
		return NewEnrollmentToken{}, fmt.Errorf("store enrollment token: %w", err)
	}
	return NewEnrollmentToken{ID: id, Token: tok, Uses: uses, ExpiresAt: rec.ExpiresAt}, nil
}

// ListNodes returns every enrolled node.
func ListNodes(st store.KV) ([]NodeInfo, error) {
	out := []NodeInfo{}
	seen := map[string]seenRec{}
	err := store.ScanJSON(st, pfxNodeSeen, func(key string, sr seenRec) (bool, error) {
		seen[key[len(pfxNodeSeen):]] = sr
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	err = store.ScanJSON(st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		n.overlay(seen[n.ID])
		out = append(out, NodeInfo{ID: n.ID, Hostname: n.Hostname, Hardware: n.Hardware, ServerID: n.ServerID,
			Revision: n.Revision, Observed: n.Observed, LastSeen: n.LastSeen, WipePending: n.WipePending})
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// AdminProjectRequest and AdminEnrollmentRequest are admin socket request
// bodies; POST /admin/tokens takes a TokenSpec.
type AdminProjectRequest struct {
	Name string `json:"name"`
}

type AdminEnrollmentRequest struct {
	Uses       int     `json:"uses"`
	TTLSeconds float64 `json:"ttl_seconds"`
}

// AdminHandler serves the local admin socket while the server holds the
// store: projects, tokens, enrollment tokens and the node list. It has no
// authentication of its own; the socket's file mode (0600) is the access
// control. Changes take the server's change lock, like API requests.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/projects", func(w http.ResponseWriter, r *http.Request) {
		var req AdminProjectRequest
		if e := s.decodeJSON(r, &req); e != nil {
			writeError(w, e)
			return
		}
		var p Project
		err := s.locked(r.Context(), func(w store.KV) (err error) {
			p, err = CreateProject(w, req.Name, s.now())
			return err
		})
		if err == nil {
			s.projMu.Lock()
			s.projNames[p.ID] = p.Name
			s.projMu.Unlock()
		}
		s.adminAnswer(w, http.StatusCreated, p, err)
	})
	mux.HandleFunc("GET /admin/projects", func(w http.ResponseWriter, r *http.Request) {
		p, err := ListProjects(s.st)
		s.adminAnswer(w, http.StatusOK, p, err)
	})
	mux.HandleFunc("POST /admin/tokens", func(w http.ResponseWriter, r *http.Request) {
		var req TokenSpec
		if e := s.decodeJSON(r, &req); e != nil {
			writeError(w, e)
			return
		}
		var t NewAPIToken
		err := s.locked(r.Context(), func(w store.KV) (err error) {
			t, err = CreateToken(w, req, s.now())
			return err
		})
		s.adminAnswer(w, http.StatusCreated, t, err)
	})
	mux.HandleFunc("GET /admin/tokens", func(w http.ResponseWriter, r *http.Request) {
		tokens, err := ListTokens(s.st, r.URL.Query().Get("project"))
		if err == nil {
			s.withLastUse(tokens)
		}
		s.adminAnswer(w, http.StatusOK, tokens, err)
	})
	mux.HandleFunc("DELETE /admin/tokens/{id}", func(w http.ResponseWriter, r *http.Request) {
		err := s.locked(r.Context(), func(w store.KV) error { return RevokeToken(w, r.PathValue("id")) })
		if err == nil {
			s.forgetToken(r.PathValue("id"))
		}
		s.adminAnswer(w, http.StatusNoContent, nil, err)
	})
	mux.HandleFunc("POST /admin/enrollment-tokens", func(w http.ResponseWriter, r *http.Request) {
		var req AdminEnrollmentRequest
		if e := s.decodeJSON(r, &req); e != nil {
			writeError(w, e)
			return
		}
		var t NewEnrollmentToken
		err := s.locked(r.Context(), func(w store.KV) (err error) {
			t, err = CreateEnrollmentToken(w, req.Uses, time.Duration(req.TTLSeconds*float64(time.Second)), s.now())
			return err
		})
		if ae := storeFailure(err); ae != nil {
			writeError(w, ae)
			return
		}
		if err != nil {
			writeError(w, invalid("", "%v", err))
			return
		}
		writeJSON(w, http.StatusCreated, t)
	})
	mux.HandleFunc("GET /admin/audit-log", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		var since, until time.Time
		limit, err := parseLimit(q.Get("limit"))
		for _, p := range []struct {
			name string
			at   *time.Time
		}{{"since", &since}, {"until", &until}} {
			if v := q.Get(p.name); v != "" && err == nil {
				if *p.at, err = time.Parse(time.RFC3339Nano, v); err != nil {
					err = fmt.Errorf("%w: %s must be an RFC 3339 time", ErrInvalid, p.name)
				}
			}
		}
		var entries []AuditEntry
		if err == nil {
			entries, err = ListAudit(s.st, q.Get("project"), since, until, limit)
		}
		s.adminAnswer(w, http.StatusOK, entries, err)
	})
	mux.HandleFunc("GET /admin/nodes", func(w http.ResponseWriter, r *http.Request) {
		nodes, err := ListNodes(s.st)
		s.adminAnswer(w, http.StatusOK, nodes, err)
	})
	return s.frame(mux)
}

// adminAnswer writes an operator command's result, or its error with the
// status that names it.
func (s *Server) adminAnswer(w http.ResponseWriter, status int, v any, err error) {
	switch {
	case err == nil && status == http.StatusNoContent:
		w.WriteHeader(status)
	case err == nil:
		writeJSON(w, status, v)
	case errors.Is(err, ErrUnknownProject), errors.Is(err, ErrUnknownToken):
		writeError(w, notFound("", "%v", err))
	case errors.Is(err, ErrProjectExists):
		writeError(w, conflict("name", "%v", err))
	case errors.Is(err, ErrInvalid):
		writeError(w, invalid("", "%v", err))
	case storeFailure(err) != nil:
		writeError(w, storeFailure(err))
	default:
		s.log.Error("admin request failed", "request_id", w.Header().Get("X-Request-Id"), "err", err)
		writeError(w, &apiError{status: http.StatusInternalServerError, code: CodeInternal, message: "internal error"})
	}
}

// AdminError is the running server refusing an operator command; Message
// says why (the same text the command gives when the server is down).
type AdminError struct {
	Status  int
	Message string
}

func (e *AdminError) Error() string { return e.Message }

// ErrAdminUnavailable means no server is listening on the admin socket.
var ErrAdminUnavailable = errors.New("control plane admin socket not available")

// AdminCall sends one request to a running server's admin socket. It
// returns ErrAdminUnavailable (wrapped) when nothing listens there, so the
// caller can fall back to opening the store itself.
func AdminCall(ctx context.Context, socketPath, method, path string, in, out any) error {
	hc := adminsock.Client(socketPath)
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode admin request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://admin"+path, body)
	if err != nil {
		return fmt.Errorf("build admin request: %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		if errors.Is(err, adminsock.ErrNotRunning) {
			return fmt.Errorf("%w: %v", ErrAdminUnavailable, err)
		}
		return fmt.Errorf("admin request: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read admin response: %w", err)
	}
	if resp.StatusCode >= 300 {
		var eb nodeapi.ErrorBody
		_ = json.Unmarshal(raw, &eb)
		return &AdminError{Status: resp.StatusCode, Message: eb.Error.Message}
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("decode admin response: %w", err)
		}
	}
	return nil
}
