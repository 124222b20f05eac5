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
// management API. Whatever the input, the answer is never a 5xx; a refusal
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
	// One node and one server, so rules have somewhere to go.
	et, err := CreateEnrollmentToken(st, 1, time.Hour, time.Now())
	if err != nil {
		f.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/v1/nodes/enroll", bytes.NewReader([]byte(`{"hostname":"n","hardware":{"chip":"cpu","ram":8,"storage":50}}`)))
	req.Header.Set("Authorization", "Bearer "+et.Token)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusCreated {
		f.Fatalf("enroll: %d %s", rec.Code, rec.Body)
	}
	rec = do("POST", "/v1/servers", []byte(`{"name":"host","chip":"cpu","ram":8,"storage":50,"stack":"bare","billing":"monthly"}`))
	if rec.Code != http.StatusCreated {
		f.Fatalf("create server: %d %s", rec.Code, rec.Body)
	}
	var host struct{ ID string }
	_ = json.Unmarshal(rec.Body.Bytes(), &host)
	targets := []string{"/v1/servers", "/v1/ssh-keys", "/v1/servers/" + host.ID + "/firewall-rules"}
	codes := map[string]bool{CodeInvalidRequest: true, CodeConflict: true, CodeCapacityUnavailable: true,
		CodePayloadTooLarge: true, CodeNotFound: true}

	f.Fuzz(func(t *testing.T, target uint8, body []byte) {
		path := targets[int(target)%len(targets)]
		rec := do("POST", path, body)
		if rec.Code >= 500 {
			t.Fatalf("POST %s %q → %d %s", path, body, rec.Code, rec.Body)
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
		if rec.Code != http.StatusCreated {
			t.Fatalf("POST %s %q → %d", path, body, rec.Code)
		}
		var created struct{ ID string }
		if err := json.Unmarshal(rec.Body.Bytes(), &created); err != nil || created.ID == "" {
			t.Fatalf("POST %s → 201 without an id: %s", path, rec.Body)
		}
		back := do("GET", path+"/"+created.ID, nil)
		if back.Code != http.StatusOK || !bytes.Equal(back.Body.Bytes(), rec.Body.Bytes()) {
			t.Fatalf("created %s reads back as %d %s, was %s", created.ID, back.Code, back.Body, rec.Body)
		}
		// Keys and rules are removed again so later inputs are not refused
		// as duplicates or for the rule limit. (The one node is taken by
		// "host", so server creates stop at capacity after validation.)
		if path != targets[0] {
			if d := do("DELETE", path+"/"+created.ID, nil); d.Code != http.StatusNoContent {
				t.Fatalf("delete %s: %d %s", created.ID, d.Code, d.Body)
			}
		}
	})
}
