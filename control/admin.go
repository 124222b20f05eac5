package control

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// NewAPIToken is a freshly made management API token. Token is shown once;
// only its hash is stored.
type NewAPIToken struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	Token string `json:"token"`
}

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
}

// CreateAPIToken stores a new management API token. It works on the store
// directly, so the CLI can use it while the server is down; a running
// server does the same through its admin socket.
func CreateAPIToken(st *store.Store, name string, now time.Time) (NewAPIToken, error) {
	if !validName(name) {
		return NewAPIToken{}, fmt.Errorf("token name must be 1 to %d characters without control characters", maxKeyNameLen)
	}
	id, err := newID(prefixAPIToken)
	if err != nil {
		return NewAPIToken{}, err
	}
	tok, err := newSecret(secretAPIToken)
	if err != nil {
		return NewAPIToken{}, err
	}
	h := hashSecret(tok)
	if err := st.Put(pfxAPIToken+h, tokenRec{ID: id, Name: name, Hash: h, CreatedAt: now.UTC()}); err != nil {
		return NewAPIToken{}, fmt.Errorf("store API token: %w", err)
	}
	return NewAPIToken{ID: id, Name: name, Token: tok}, nil
}

// CreateEnrollmentToken stores a new enrollment token good for uses
// enrollments within ttl.
func CreateEnrollmentToken(st *store.Store, uses int, ttl time.Duration, now time.Time) (NewEnrollmentToken, error) {
	if uses < 1 {
		return NewEnrollmentToken{}, errors.New("an enrollment token needs at least one use")
	}
	if ttl <= 0 {
		return NewEnrollmentToken{}, errors.New("an enrollment token needs a positive lifetime")
	}
	id, err := newID(prefixEnrollment)
	if err != nil {
		return NewEnrollmentToken{}, err
	}
	tok, err := newSecret(secretEnrollment)
	if err != nil {
		return NewEnrollmentToken{}, err
	}
	h := hashSecret(tok)
	rec := enrollmentRec{ID: id, Hash: h, UsesLeft: uses, ExpiresAt: now.UTC().Add(ttl), CreatedAt: now.UTC()}
	if err := st.Put(pfxEnrollment+h, rec); err != nil {
		return NewEnrollmentToken{}, fmt.Errorf("store enrollment token: %w", err)
	}
	return NewEnrollmentToken{ID: id, Token: tok, Uses: uses, ExpiresAt: rec.ExpiresAt}, nil
}

// ListNodes returns every enrolled node.
func ListNodes(st *store.Store) ([]NodeInfo, error) {
	out := []NodeInfo{}
	err := store.ScanJSON(st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		out = append(out, NodeInfo{ID: n.ID, Hostname: n.Hostname, Hardware: n.Hardware, ServerID: n.ServerID,
			Revision: n.Revision, Observed: n.Observed, LastSeen: n.LastSeen})
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// AdminTokenRequest and AdminEnrollmentRequest are the admin socket's
// request bodies.
type AdminTokenRequest struct {
	Name string `json:"name"`
}

type AdminEnrollmentRequest struct {
	Uses       int     `json:"uses"`
	TTLSeconds float64 `json:"ttl_seconds"`
}

// AdminHandler serves the local admin socket: token creation and the node
// list while the server holds the store. It has no authentication of its
// own; the socket's file mode (0600) is the access control.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /admin/tokens", func(w http.ResponseWriter, r *http.Request) {
		var req AdminTokenRequest
		if e := decodeJSON(r, &req); e != nil {
			writeError(w, e)
			return
		}
		t, err := CreateAPIToken(s.st, req.Name, s.now())
		if err != nil {
			writeError(w, invalid("name", "%v", err))
			return
		}
		writeJSON(w, http.StatusCreated, t)
	})
	mux.HandleFunc("POST /admin/enrollment-tokens", func(w http.ResponseWriter, r *http.Request) {
		var req AdminEnrollmentRequest
		if e := decodeJSON(r, &req); e != nil {
			writeError(w, e)
			return
		}
		t, err := CreateEnrollmentToken(s.st, req.Uses, time.Duration(req.TTLSeconds*float64(time.Second)), s.now())
		if err != nil {
			writeError(w, invalid("", "%v", err))
			return
		}
		writeJSON(w, http.StatusCreated, t)
	})
	mux.HandleFunc("GET /admin/nodes", func(w http.ResponseWriter, r *http.Request) {
		nodes, err := ListNodes(s.st)
		if err != nil {
			s.nodeInternal(w, err)
			return
		}
		writeJSON(w, http.StatusOK, nodes)
	})
	return s.frame(mux)
}

// ListenAdmin listens on a unix socket at path readable only by its owner,
// replacing a stale socket file.
func ListenAdmin(path string) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale admin socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on admin socket %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restrict admin socket: %w", err)
	}
	return ln, nil
}

// ErrAdminUnavailable means no server is listening on the admin socket.
var ErrAdminUnavailable = errors.New("control plane admin socket not available")

// AdminCall sends one request to a running server's admin socket. It
// returns ErrAdminUnavailable (wrapped) when nothing listens there, so the
// caller can fall back to opening the store itself.
func AdminCall(ctx context.Context, socketPath, method, path string, in, out any) error {
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socketPath)
		},
	}}
	defer hc.CloseIdleConnections()
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
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
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
		return fmt.Errorf("admin request refused (%d): %s", resp.StatusCode, eb.Error.Message)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return fmt.Errorf("decode admin response: %w", err)
		}
	}
	return nil
}
