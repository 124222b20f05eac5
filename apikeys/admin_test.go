package apikeys

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hearthd/hearth/internal/adminsock"
)

// startAdmin serves k's admin API on a real unix socket in a fresh
// directory and returns the socket's path.
func startAdmin(t *testing.T, k *Keyring) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "run", "admin.sock")
	ln, err := adminsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeAdmin(ctx, ln, k, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeAdmin: %v", err)
		}
	})
	return path
}

// rawClient speaks HTTP to the admin socket without AdminClient, to check
// the wire format itself.
func rawClient(path string) *http.Client { return adminsock.Client(path) }

func TestAdminRoundTrip(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	path := startAdmin(t, k)

	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("admin socket mode %v, want a socket with 0600", fi.Mode())
	}
	if di, err := os.Stat(filepath.Dir(path)); err != nil || di.Mode().Perm() != 0o700 {
		t.Fatalf("socket directory: %v, %v; want mode 0700", di.Mode(), err)
	}

	ctx := t.Context()
	c := NewAdminClient(path)
	secret, key, err := c.Create(ctx, "from the cli")
	if err != nil {
		t.Fatal(err)
	}
	if !secretRE.MatchString(secret) || !idRE.MatchString(key.ID) || key.Name != "from the cli" {
		t.Fatalf("Create = %q, %+v", secret, key)
	}
	// The daemon's keyring accepts the new key at once.
	if got, err := k.Authenticate(bearer(secret)); err != nil || got.ID != key.ID {
		t.Fatalf("daemon Authenticate = %+v, %v", got, err)
	}
	k.RecordUsage(key.ID, 3, 30, 300)

	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].ID != key.ID || list[0].Hint != key.Hint ||
		list[0].Usage != (Usage{3, 30, 300}) {
		t.Fatalf("List = %+v", list)
	}

	if err := c.Revoke(ctx, key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Authenticate(bearer(secret)); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after admin revoke: %v, want ErrRevoked", err)
	}
	if err := c.Revoke(ctx, key.ID); err != nil {
		t.Fatalf("revoking twice: %v", err)
	}
	if err := c.Revoke(ctx, "key_missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke unknown: %v, want ErrNotFound", err)
	}
	if _, _, err := c.Create(ctx, ""); err == nil || !strings.Contains(err.Error(), "1-64 printable") {
		t.Fatalf("create with empty name: %v", err)
	}
}

func TestAdminWireFormat(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	hc := rawClient(startAdmin(t, k))

	do := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, "http://admin"+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if ct := resp.Header.Get("Content-Type"); len(b) > 0 && ct != "application/json" {
			t.Errorf("%s %s: content type %q", method, path, ct)
		}
		return resp.StatusCode, b
	}

	code, body := do("POST", "/keys", `{"name":"wire"}`)
	if code != http.StatusCreated {
		t.Fatalf("POST /keys = %d %s", code, body)
	}
	var created map[string]any
	if err := json.Unmarshal(body, &created); err != nil {
		t.Fatal(err)
	}
	secret, _ := created["secret"].(string)
	if !secretRE.MatchString(secret) || created["name"] != "wire" || created["id"] == nil ||
		created["hint"] == nil || created["created_at"] == nil {
		t.Fatalf("POST /keys answer %s", body)
	}
	if _, ok := created["sha256"]; ok {
		t.Fatalf("POST /keys exposes the hash: %s", body)
	}

	code, body = do("GET", "/keys", "")
	if code != http.StatusOK {
		t.Fatalf("GET /keys = %d %s", code, body)
	}
	if bytes.Contains(body, []byte(secret[len(Prefix):])) || bytes.Contains(body, []byte(`"secret"`)) ||
		bytes.Contains(body, []byte("sha256")) {
		t.Fatalf("GET /keys shows a secret or hash: %s", body)
	}
	var list struct {
		Keys []Key `json:"keys"`
	}
	if err := json.Unmarshal(body, &list); err != nil || len(list.Keys) != 1 {
		t.Fatalf("GET /keys = %s (%v)", body, err)
	}

	wantError := func(code, want int, body []byte) {
		t.Helper()
		var e struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		if code != want || json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
			t.Fatalf("got %d %s, want %d with an error message", code, body, want)
		}
	}
	code, body = do("POST", "/keys", `{"name":""}`)
	wantError(code, http.StatusBadRequest, body)
	code, body = do("POST", "/keys", `{"name":`)
	wantError(code, http.StatusBadRequest, body)
	code, body = do("POST", "/keys", `{"name":"x","admin":true}`)
	wantError(code, http.StatusBadRequest, body)
	code, body = do("DELETE", "/keys/key_nope", "")
	wantError(code, http.StatusNotFound, body)

	code, body = do("DELETE", "/keys/"+list.Keys[0].ID, "")
	if code != http.StatusNoContent || len(body) != 0 {
		t.Fatalf("DELETE = %d %q, want 204 and no body", code, body)
	}
	if n := len(k.List()); n != 1 {
		t.Fatalf("rejected requests created keys: %d keys, want 1", n)
	}
}

// A managed key shows in the list with its source and cannot be revoked on
// the box: it changes only with the desired state.
func TestAdminManagedKeys(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	secret, m := issued(t, "dk_admin")
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	c := NewAdminClient(startAdmin(t, k))
	keys, err := c.List(t.Context())
	if err != nil || len(keys) != 1 || keys[0].ID != "dk_admin" || keys[0].Source != SourceManaged {
		t.Fatalf("list %+v %v", keys, err)
	}
	if err := c.Revoke(t.Context(), "dk_admin"); err == nil || !strings.Contains(err.Error(), "409") {
		t.Fatalf("revoke of a managed key: %v", err)
	}
	if _, err := k.Authenticate(bearer(secret)); err != nil {
		t.Fatalf("the managed key after a refused revoke: %v", err)
	}
}
