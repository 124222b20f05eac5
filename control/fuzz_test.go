package control

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/vfs"

	"github.com/hearthd/hearth/store"
)

// FuzzCreateRequests feeds arbitrary bodies to every create endpoint of the
// management API, and to the server PATCH. Whatever the input, the answer is never a 5xx; a refusal
// has the documented error shape and code; and what is accepted reads back
// identically.
func FuzzCreateRequests(f *testing.F) {
	seeds := []struct {
		target uint8
		body   string
	}{
		{0, `{"name":"web","chip":"cpu","ram":8,"storage":50,"stack":"bare","billing":"monthly"}`},
		{0, `{"name":"web","chip":"cpu","ram":8,"storage":50,"stack":"deployment","model":"llama3.2:1b","billing":"monthly","ssh_key_ids":["sk_x"]}`},
		{0, `{"name":"a;rm -rf /","ram":-1}`},
		{1, `{"name":"laptop","public_key":"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL me@x"}`},
		{1, `{"name":"x\n","public_key":"ssh-rsa AAAA\nssh-ed25519 AAAA"}`},
		{2, `{"direction":"inbound","protocol":"tcp","port_range":"22","source":"10.0.0.0/8","action":"allow"}`},
		{2, `{"direction":"outbound","protocol":"udp","port_range":"53-54","destination":"2001:db8::/32","action":"deny","description":"dns"}`},
		{2, `{"direction":"inbound","protocol":"tcp","port_range":"22; flush ruleset","action":"allow"}`},
		{2, `[1,2,3]`},
		{2, `{"port_range":99999999999999999999}`},
		{3, `{"name":"ci","expires_at":"2099-01-02T03:04:05Z","requests_per_minute":60,"tokens_per_minute":1000}`},
		{3, `{"name":"ci","expires_at":"2000-01-01T00:00:00Z"}`},
		{3, `{"name":"ci","requests_per_minute":-1,"expires_at":"soon"}`},
		{4, `{"model":"llama3.2:3b"}`},
		{4, `{"name":"host-2","model":null}`},
		{4, `{"name":"host","ram":64}`},
	}
	for _, s := range seeds {
		f.Add(s.target, []byte(s.body))
	}

	st, err := store.Open("fuzz", store.Options{FS: vfs.NewMem()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	srv, err := New(Config{Store: st, RateLimit: 1e9, RateBurst: 1e9})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	tok, err := CreateAPIToken(st, "fuzz", time.Now())
	if err != nil {
		f.Fatal(err)
	}
	do := func(method, path string, body []byte) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	// Two nodes and two servers, so rules and API keys have somewhere to go.
	et, err := CreateEnrollmentToken(st, 2, time.Hour, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	for range 2 {
		req := httptest.NewRequest("POST", "/v1/nodes/enroll", bytes.NewReader([]byte(`{"hostname":"n","hardware":{"chip":"cpu","ram":8,"storage":50}}`)))
		req.Header.Set("Authorization", "Bearer "+et.Token)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			f.Fatalf("enroll: %d %s", rec.Code, rec.Body)
		}
	}
	var host, deployment struct{ ID string }
	for body, into := range map[string]any{
		`{"name":"host","chip":"cpu","ram":8,"storage":50,"stack":"bare","billing":"monthly"}`:                        &host,
		`{"name":"deploy","chip":"cpu","ram":8,"storage":50,"stack":"deployment","model":"tiny","billing":"monthly"}`: &deployment,
	} {
		rec := do("POST", "/v1/servers", []byte(body))
		if rec.Code != http.StatusCreated {
			f.Fatalf("create server: %d %s", rec.Code, rec.Body)
		}
		_ = json.Unmarshal(rec.Body.Bytes(), into)
	}
	targets := []struct{ method, path string }{{"POST", "/v1/servers"}, {"POST", "/v1/ssh-keys"},
		{"POST", "/v1/servers/" + host.ID + "/firewall-rules"}, {"POST", "/v1/servers/" + deployment.ID + "/api-keys"},
		{"PATCH", "/v1/servers/" + deployment.ID}}
	codes := map[string]bool{CodeInvalidRequest: true, CodeConflict: true, CodeCapacityUnavailable: true,
		CodePayloadTooLarge: true, CodeNotFound: true}

	f.Fuzz(func(t *testing.T, target uint8, body []byte) {
		tg := targets[int(target)%len(targets)]
		path := tg.path
		rec := do(tg.method, path, body)
		if rec.Code >= 500 {
			t.Fatalf("%s %s %q → %d %s", tg.method, path, body, rec.Code, rec.Body)
		}
		if rec.Code >= 400 {
			var eb struct {
				Error struct {
					Code      string `json:"code"`
					Message   string `json:"message"`
					RequestID string `json:"request_id"`
				} `json:"error"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil || !codes[eb.Error.Code] ||
				eb.Error.Message == "" || eb.Error.RequestID == "" {
				t.Fatalf("POST %s %q → %d with a malformed error %s", path, body, rec.Code, rec.Body)
			}
			return
		}
		if tg.method == "PATCH" {
			// The answer names the action the change started; a read
			// does not.
			var patched map[string]any
			_ = json.Unmarshal(rec.Body.Bytes(), &patched)
			delete(patched, "action")
			want, _ := json.Marshal(patched)
			back := do("GET", path, nil)
			var got map[string]any
			_ = json.Unmarshal(back.Body.Bytes(), &got)
			if gotJSON, _ := json.Marshal(got); rec.Code != http.StatusOK || !bytes.Equal(gotJSON, want) {
				t.Fatalf("PATCH %q → %d %s; reads back as %s", body, rec.Code, rec.Body, back.Body)
			}
			return
		}
		if rec.Code != http.StatusCreated {
			t.Fatalf("POST %s %q → %d", path, body, rec.Code)
		}
		var created map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &created); err != nil || created["id"] == nil {
			t.Fatalf("POST %s → 201 without an id: %s", path, rec.Body)
		}
		id, _ := created["id"].(string)
		// Only the create answer shows an API key's secret, and the
		// action the create started.
		delete(created, "key")
		delete(created, "started_action")
		if _, ok := created["action"].(map[string]any); ok { // a rule's is allow or deny
			delete(created, "action")
		}
		want, _ := json.Marshal(created)
		back := do("GET", path+"/"+id, nil)
		var got map[string]any
		_ = json.Unmarshal(back.Body.Bytes(), &got)
		if gotJSON, _ := json.Marshal(got); back.Code != http.StatusOK || !bytes.Equal(gotJSON, want) {
			t.Fatalf("created %s reads back as %d %s, was %s", id, back.Code, back.Body, rec.Body)
		}
		// Keys and rules are removed again so later inputs are not refused
		// as duplicates or for the limits. (Both nodes are taken, so server
		// creates stop at capacity after validation.)
		if path != targets[0].path {
			if d := do("DELETE", path+"/"+id, nil); d.Code != http.StatusNoContent {
				t.Fatalf("delete %s: %d %s", id, d.Code, d.Body)
			}
		}
	})
}
