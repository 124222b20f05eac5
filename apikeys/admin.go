package apikeys

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/hearthd/hearth/internal/adminsock"
)

// The admin API is served on a unix socket only root can open; it is how the
// hearthd keys CLI reaches the running daemon, which holds the state lock.
//
//	POST   /keys       {"name": "…"}  → 201 {key…, "secret": "hearth_live_…"}
//	GET    /keys                      → 200 {"keys": [key…]}
//	DELETE /keys/{id}                 → 204, 404 for an unknown id, 409 for a managed key
//
// Errors are {"error": {"message": "…"}}.

// CreatedKey is the answer to POST /keys: the key and, this once, its secret.
type CreatedKey struct {
	Key
	Secret string `json:"secret"`
}

type createRequest struct {
	Name string `json:"name"`
}

type listResponse struct {
	Keys []Key `json:"keys"`
}

type errorBody struct {
	Error struct {
		Message string `json:"message"`
	} `json:"error"`
}

// AdminHandler serves the admin API for k.
func AdminHandler(k *Keyring) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /keys", func(w http.ResponseWriter, r *http.Request) {
		var req createRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid request body: %v", err))
			return
		}
		secret, key, err := k.Create(req.Name)
		switch {
		case errors.Is(err, ErrInvalidName):
			writeError(w, http.StatusBadRequest, err.Error())
			return
		case err != nil:
			writeError(w, http.StatusInternalServerError, err.Error())
			return
		}
		writeJSON(w, http.StatusCreated, CreatedKey{Key: key, Secret: secret})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, listResponse{Keys: k.List()})
	})
	mux.HandleFunc("DELETE /keys/{id}", func(w http.ResponseWriter, r *http.Request) {
		err := k.Revoke(r.PathValue("id"))
		switch {
		case errors.Is(err, ErrNotFound):
			writeError(w, http.StatusNotFound, "no key with id "+r.PathValue("id"))
		case errors.Is(err, ErrManaged):
			writeError(w, http.StatusConflict, err.Error())
		case err != nil:
			writeError(w, http.StatusInternalServerError, err.Error())
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "encode response: "+err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store") // a create answer holds a secret
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	var e errorBody
	e.Error.Message = msg
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// ServeAdmin serves AdminHandler(k) on ln until ctx is done.
func ServeAdmin(ctx context.Context, ln net.Listener, k *Keyring, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	srv := &http.Server{
		Handler:           AdminHandler(k),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	err := srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("serve admin socket: %w", err)
}

// AdminClient talks to a running daemon's admin socket.
type AdminClient struct {
	hc *http.Client
}

// NewAdminClient returns a client for the admin socket at socketPath.
func NewAdminClient(socketPath string) *AdminClient {
	hc := adminsock.Client(socketPath)
	hc.Timeout = 30 * time.Second
	return &AdminClient{hc: hc}
}

// Create asks the daemon for a new key and returns its secret.
func (c *AdminClient) Create(ctx context.Context, name string) (string, Key, error) {
	body, err := json.Marshal(createRequest{Name: name})
	if err != nil {
		return "", Key{}, fmt.Errorf("encode request: %w", err)
	}
	var ck CreatedKey
	if err := c.do(ctx, http.MethodPost, "/keys", body, http.StatusCreated, &ck); err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	return ck.Secret, ck.Key, nil
}

// List returns every key with its usage totals.
func (c *AdminClient) List(ctx context.Context) ([]Key, error) {
	var lr listResponse
	if err := c.do(ctx, http.MethodGet, "/keys", nil, http.StatusOK, &lr); err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return lr.Keys, nil
}

// Revoke revokes a key; an unknown id is ErrNotFound.
func (c *AdminClient) Revoke(ctx context.Context, id string) error {
	if err := c.do(ctx, http.MethodDelete, "/keys/"+url.PathEscape(id), nil, http.StatusNoContent, nil); err != nil {
		return fmt.Errorf("revoke key %s: %w", id, err)
	}
	return nil
}

// do sends one request and decodes a want-status answer into out.
func (c *AdminClient) do(ctx context.Context, method, path string, body []byte, want int, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://hearthd"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != want {
		var e errorBody
		msg := string(bytes.TrimSpace(b))
		if json.Unmarshal(b, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		if resp.StatusCode == http.StatusNotFound {
			return fmt.Errorf("%w: %s", ErrNotFound, msg)
		}
		return fmt.Errorf("daemon answered %s: %s", resp.Status, msg)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}
