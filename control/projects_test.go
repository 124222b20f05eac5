package control_test

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

// admin sends one request to the server's admin socket handler.
func (e *env) admin(method, path string, body any) answer {
	e.t.Helper()
	var r *strings.Reader
	switch b := body.(type) {
	case nil:
		r = strings.NewReader("")
	case string:
		r = strings.NewReader(b)
	default:
		r = strings.NewReader(mustJSON(e.t, b))
	}
	rec := httptest.NewRecorder()
	e.srv.AdminHandler().ServeHTTP(rec, httptest.NewRequest(method, path, r))
	return answer{status: rec.Code, hdr: rec.Header(), body: rec.Body.Bytes()}
}

// project makes a project through the admin socket and a token for it.
func (e *env) project(name string, readOnly bool) (id, token string) {
	e.t.Helper()
	p := e.admin("POST", "/admin/projects", map[string]any{"name": name}).must(e.t, 201).obj(e.t)
	id = p["id"].(string)
	tok := e.admin("POST", "/admin/tokens", map[string]any{"project": name, "name": "t", "read_only": readOnly}).must(e.t, 201).obj(e.t)
	return id, tok["token"].(string)
}

// tokenFor makes another token for an existing project.
func (e *env) tokenFor(project string, readOnly bool) string {
	e.t.Helper()
	tok := e.admin("POST", "/admin/tokens", map[string]any{"project": project, "name": "t", "read_only": readOnly}).must(e.t, 201).obj(e.t)
	return tok["token"].(string)
}

// snapshot is every record of the state, by key.
// The audit log is left out: it records refused requests too
// (audit_test.go checks what it says of them).
func snapshot(t testing.TB, e *env) map[string]string {
	t.Helper()
	out := map[string]string{}
	if err := e.st.Scan("", "", false, func(k string, v []byte) (bool, error) {
		if !strings.HasPrefix(k, control.AuditPrefix) {
			out[k] = string(v)
		}
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func sameState(t testing.TB, before, after map[string]string, what string) {
	t.Helper()
	for k, v := range after {
		if before[k] != v {
			t.Errorf("%s changed the state: %s = %s (was %q)", what, k, v, before[k])
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			t.Errorf("%s changed the state: %s deleted", what, k)
		}
	}
}

// tenant is one project's token and records, for the isolation table.
type tenant struct {
	token                         string
	servers, sshKeys              []string
	rule, apiKey                  string
	serverCursor, sshKeyCursor    string
	idemRule, idemAPIKey          string // Idempotency-Keys the tenant used
	ruleBody, apiKeyBody, keyBody map[string]any
}

func newTenant(t *testing.T, e *env, token, label string) *tenant {
	tn := &tenant{token: token}
	as := func(method, path string, body any, hdr ...string) answer {
		return e.reqAs(token, method, path, body, hdr...)
	}
	for i := range 2 {
		pub, _ := newKey(t, "ed25519")
		tn.keyBody = map[string]any{"name": fmt.Sprintf("%s key %d", label, i), "public_key": pub}
		tn.sshKeys = append(tn.sshKeys, idOf(t, as("POST", "/v1/ssh-keys", tn.keyBody).must(t, 201)))
	}
	for i := range 2 {
		tn.servers = append(tn.servers, idOf(t, as("POST", "/v1/servers", serverBody(fmt.Sprintf("%s-%d", label, i),
			func(m map[string]any) { m["ssh_key_ids"] = tn.sshKeys })).must(t, 201)))
	}
	srv := tn.servers[0]
	tn.idemRule, tn.idemAPIKey = label+"-rule", label+"-key"
	tn.ruleBody = map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "443", "action": "allow"}
	tn.rule = idOf(t, as("POST", "/v1/servers/"+srv+"/firewall-rules", tn.ruleBody, "Idempotency-Key", tn.idemRule).must(t, 201))
	tn.apiKeyBody = map[string]any{"name": label + " app"}
	tn.apiKey = idOf(t, as("POST", "/v1/servers/"+srv+"/api-keys", tn.apiKeyBody, "Idempotency-Key", tn.idemAPIKey).must(t, 201))
	cursor := func(path string) string {
		var p struct {
			NextCursor *string `json:"next_cursor"`
		}
		as("GET", path+"?limit=1", nil).must(t, 200).decode(t, &p)
		if p.NextCursor == nil {
			t.Fatalf("%s: no cursor", path)
		}
		return *p.NextCursor
	}
	tn.serverCursor, tn.sshKeyCursor = cursor("/v1/servers"), cursor("/v1/ssh-keys")
	return tn
}

// unknownLike is an ID of the same kind as id that exists nowhere.
func unknownLike(id string) string {
	prefix, _, _ := strings.Cut(id, "_")
	return prefix + "_" + strings.Repeat("0", 24)
}

// TestIsolation tries every route of one project with the other's token,
// both ways: each answers exactly as for an unknown ID (status, code,
// param and message) and changes nothing in the state; lists, cursors
// included, show only the caller's own records; an Idempotency-Key one
// project used replays nothing to the other.
func TestIsolation(t *testing.T) {
	e, _ := newClockEnv(t, nil)
	for range 5 {
		e.enroll(hwM4)
	}
	_, tokB := e.project("acme", false)
	tenants := []*tenant{newTenant(t, e, e.token, "a"), newTenant(t, e, tokB, "b")}
	for i, owner := range tenants {
		other := tenants[1-i]
		t.Run(fmt.Sprintf("project %d by the other", i), func(t *testing.T) {
			isolationTable(t, e, owner, other)
			listsAreOwn(t, e, owner, other)
		})
	}
	t.Run("idempotency keys", func(t *testing.T) {
		a, b := tenants[0], tenants[1]
		// B sends A's SSH key creation with A's key: B's own new key, not
		// A's answer.
		pub, _ := newKey(t, "ed25519")
		body := map[string]any{"name": "shared", "public_key": pub}
		first := e.reqAs(a.token, "POST", "/v1/ssh-keys", body, "Idempotency-Key", "shared").must(t, 201)
		replay := e.reqAs(a.token, "POST", "/v1/ssh-keys", body, "Idempotency-Key", "shared").must(t, 201)
		if string(replay.body) != string(first.body) || replay.hdr.Get("Idempotent-Replayed") != "true" {
			// A's own replay works, so the key was remembered.
			t.Fatalf("owner's replay differs: %s / %s", first.body, replay.body)
		}
		theirs := e.reqAs(b.token, "POST", "/v1/ssh-keys", body, "Idempotency-Key", "shared").must(t, 201)
		if theirs.hdr.Get("Idempotent-Replayed") != "" || idOf(t, theirs) == idOf(t, first) {
			t.Fatalf("the other project got the owner's answer: %s", theirs.body)
		}
		e.reqAs(a.token, "GET", "/v1/ssh-keys/"+idOf(t, theirs), nil).wantErr(t, 404, control.CodeNotFound, "id")
	})
}

func isolationTable(t *testing.T, e *env, owner, other *tenant) {
	srv, rule, key, sk := owner.servers[0], owner.rule, owner.apiKey, owner.sshKeys[0]
	mine := other.servers[0]
	cases := []struct {
		method, path string
		body         any
		foreign      string // the owner's ID in the request, replaced by an unknown one for the reference answer
		status       int
		param        string
		hdr          []string
	}{
		{"GET", "/v1/servers/" + srv, nil, srv, 404, "id", nil},
		{"PATCH", "/v1/servers/" + srv, map[string]any{"name": "stolen"}, srv, 404, "id", nil},
		{"PATCH", "/v1/servers/" + srv, map[string]any{"model": "other:1b"}, srv, 404, "id", nil},
		{"DELETE", "/v1/servers/" + srv, nil, srv, 404, "id", nil},
		{"GET", "/v1/servers/" + srv + "/firewall-rules", nil, srv, 404, "server_id", nil},
		{"POST", "/v1/servers/" + srv + "/firewall-rules", owner.ruleBody, srv, 404, "server_id", nil},
		{"POST", "/v1/servers/" + srv + "/firewall-rules", owner.ruleBody, srv, 404, "server_id", []string{"Idempotency-Key", owner.idemRule}},
		{"GET", "/v1/servers/" + srv + "/firewall-rules/" + rule, nil, srv, 404, "server_id", nil},
		{"DELETE", "/v1/servers/" + srv + "/firewall-rules/" + rule, nil, srv, 404, "server_id", nil},
		{"GET", "/v1/servers/" + mine + "/firewall-rules/" + rule, nil, rule, 404, "rule_id", nil},
		{"DELETE", "/v1/servers/" + mine + "/firewall-rules/" + rule, nil, rule, 404, "rule_id", nil},
		{"GET", "/v1/servers/" + srv + "/api-keys", nil, srv, 404, "server_id", nil},
		{"POST", "/v1/servers/" + srv + "/api-keys", owner.apiKeyBody, srv, 404, "server_id", nil},
		{"POST", "/v1/servers/" + srv + "/api-keys", owner.apiKeyBody, srv, 404, "server_id", []string{"Idempotency-Key", owner.idemAPIKey}},
		{"GET", "/v1/servers/" + srv + "/api-keys/" + key, nil, srv, 404, "server_id", nil},
		{"DELETE", "/v1/servers/" + srv + "/api-keys/" + key, nil, srv, 404, "server_id", nil},
		{"GET", "/v1/servers/" + mine + "/api-keys/" + key, nil, key, 404, "key_id", nil},
		{"DELETE", "/v1/servers/" + mine + "/api-keys/" + key, nil, key, 404, "key_id", nil},
		{"GET", "/v1/ssh-keys/" + sk, nil, sk, 404, "id", nil},
		{"DELETE", "/v1/ssh-keys/" + sk, nil, sk, 404, "id", nil},
		// Another project's SSH key cannot be put on a server.
		{"POST", "/v1/servers", serverBody("intruder", func(m map[string]any) { m["ssh_key_ids"] = []string{sk} }), sk, 400, "ssh_key_ids", nil},
	}
	for _, c := range cases {
		name := c.method + " " + strings.ReplaceAll(c.path, c.foreign, "{foreign}")
		if c.hdr != nil {
			name += " replaying the owner's Idempotency-Key"
		}
		before := snapshot(t, e)
		got := e.reqAs(other.token, c.method, c.path, c.body, c.hdr...)
		sameState(t, before, snapshot(t, e), name)
		got.wantErr(t, c.status, codeFor(c.status), c.param)

		// The reference: the same request with an ID that exists nowhere.
		unknown := unknownLike(c.foreign)
		body := c.body
		if m, ok := body.(map[string]any); ok {
			body = strings.ReplaceAll(mustJSON(t, m), c.foreign, unknown)
		}
		ref := e.reqAs(other.token, c.method, strings.ReplaceAll(c.path, c.foreign, unknown), body, c.hdr...)
		gotMsg := strings.ReplaceAll(errMessage(t, got), c.foreign, unknown)
		if ref.status != got.status || gotMsg != errMessage(t, ref) {
			t.Errorf("%s: answered %d %q, an unknown ID %d %q", name, got.status, gotMsg, ref.status, errMessage(t, ref))
		}
	}
}

// listsAreOwn: the other project's lists show only its own records, and
// the owner's cursors are refused there exactly like cursors never issued
// (signed per list: see list.go).
func listsAreOwn(t *testing.T, e *env, owner, other *tenant) {
	for _, path := range []string{
		"/v1/servers?cursor=" + owner.serverCursor,
		"/v1/servers?status=provisioning&cursor=" + owner.serverCursor,
		"/v1/ssh-keys?cursor=" + owner.sshKeyCursor,
	} {
		before := snapshot(t, e)
		e.reqAs(other.token, "GET", path, nil).wantErr(t, 400, control.CodeInvalidRequest, "cursor")
		sameState(t, before, snapshot(t, e), "GET "+path)
	}
	for _, l := range []struct {
		path string
		own  []string
	}{
		{"/v1/servers", other.servers},
		{"/v1/ssh-keys", other.sshKeys},
	} {
		before := snapshot(t, e)
		var page struct{ Data []map[string]any }
		e.reqAs(other.token, "GET", l.path, nil).must(t, 200).decode(t, &page)
		sameState(t, before, snapshot(t, e), "GET "+l.path)
		for _, item := range page.Data {
			if !slices.Contains(l.own, item["id"].(string)) {
				t.Errorf("GET %s shows %s, not the caller's", l.path, item["id"])
			}
		}
		if !strings.Contains(l.path, "cursor") && len(page.Data) != len(l.own) {
			t.Errorf("GET %s: %d items, want the caller's %d", l.path, len(page.Data), len(l.own))
		}
	}
}

func codeFor(status int) string {
	if status == 400 {
		return control.CodeInvalidRequest
	}
	return control.CodeNotFound
}

func errMessage(t testing.TB, a answer) string {
	t.Helper()
	var eb struct {
		Error struct{ Message string } `json:"error"`
	}
	a.decode(t, &eb)
	return eb.Error.Message
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestNamesAndKeysPerProject: server names and SSH key fingerprints are
// unique within a project only; a node's desired state carries its own
// project's keys; capacity is shared; deployment URLs may name the
// project.
func TestNamesAndKeysPerProject(t *testing.T) {
	e, _ := newClockEnv(t, func(c *control.Config) { c.DeploymentURLTemplate = "https://{name}.{project}.deploy.test/api/v1" })
	na, nb := e.enroll(hwM4), e.enroll(hwM4)
	_, tokB := e.project("acme", false)
	pub, fp := newKey(t, "ed25519")
	ka := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": pub}).must(t, 201))
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": pub}).wantErr(t, 409, control.CodeConflict, "public_key")
	kb := idOf(t, e.reqAs(tokB, "POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": pub}).must(t, 201))
	if ka == kb {
		t.Fatal("one key ID in two projects")
	}
	sa := e.req("POST", "/v1/servers", serverBody("web", func(m map[string]any) { m["ssh_key_ids"] = []string{ka} })).must(t, 201).obj(t)
	e.req("POST", "/v1/servers", serverBody("web")).wantErr(t, 409, control.CodeConflict, "name")
	sb := e.reqAs(tokB, "POST", "/v1/servers", serverBody("web", func(m map[string]any) { m["ssh_key_ids"] = []string{kb} })).must(t, 201).obj(t)
	if sa["deployment_url"] != "https://web.default.deploy.test/api/v1" || sb["deployment_url"] != "https://web.acme.deploy.test/api/v1" {
		t.Fatalf("deployment URLs %v and %v", sa["deployment_url"], sb["deployment_url"])
	}
	// The pool is shared: both nodes are taken now.
	e.reqAs(tokB, "POST", "/v1/servers", serverBody("more")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	// Each node (which one took which server is up to the pool) is told
	// its own server's key only.
	want := map[any]struct {
		srv map[string]any
		key string
	}{sa["id"]: {sa, ka}, sb["id"]: {sb, kb}}
	for _, n := range []node{na, nb} {
		d := n.desired(t, 0)
		if d.Server == nil {
			t.Fatalf("node %s has no server", n.id)
		}
		w, ok := want[d.Server.ID]
		delete(want, d.Server.ID)
		if !ok || d.Server.DeploymentURL != w.srv["deployment_url"] || len(d.SSHKeys) != 1 || d.SSHKeys[0].ID != w.key || d.SSHKeys[0].Fingerprint != fp {
			t.Fatalf("desired state %+v, want server %v with key %s", d, w.srv["id"], w.key)
		}
	}
	// Deleting B's copy of the key leaves A's server alone.
	e.reqAs(tokB, "DELETE", "/v1/ssh-keys/"+kb, nil).must(t, 204)
	if ids := e.req("GET", "/v1/servers/"+sa["id"].(string), nil).must(t, 200).obj(t)["ssh_key_ids"].([]any); len(ids) != 1 || ids[0] != ka {
		t.Fatalf("A's server lost its key: %v", ids)
	}
	// A rename to a name the other project uses is fine.
	e.reqAs(tokB, "PATCH", "/v1/servers/"+sb["id"].(string), map[string]any{"name": "api"}).must(t, 200)
	e.req("PATCH", "/v1/servers/"+sa["id"].(string), map[string]any{"name": "api"}).must(t, 200)
}

// TestReadOnlyToken: a read-only token reads everything of its project;
// every other method is 403 forbidden before anything else is looked at.
func TestReadOnlyToken(t *testing.T) {
	e, _ := newClockEnv(t, nil)
	e.enroll(hwM4)
	pub, _ := newKey(t, "ed25519")
	kid := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": pub}).must(t, 201))
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("web")).must(t, 201))
	rid := idOf(t, e.req("POST", "/v1/servers/"+sid+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp", "action": "allow"}).must(t, 201))
	did := idOf(t, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "app"}).must(t, 201))
	ro := e.tokenFor(control.DefaultProject, true)
	for _, path := range []string{"/v1/servers", "/v1/servers/" + sid, "/v1/servers/" + sid + "/firewall-rules",
		"/v1/servers/" + sid + "/firewall-rules/" + rid, "/v1/servers/" + sid + "/api-keys", "/v1/servers/" + sid + "/api-keys/" + did,
		"/v1/ssh-keys", "/v1/ssh-keys/" + kid} {
		got := e.reqAs(ro, "GET", path, nil).must(t, 200)
		if want := e.req("GET", path, nil).must(t, 200); string(got.body) != string(want.body) {
			t.Errorf("GET %s read-only:\n%s\nread-write:\n%s", path, got.body, want.body)
		}
	}
	before := snapshot(t, e)
	for _, w := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/v1/servers", serverBody("new")},
		{"POST", "/v1/servers", "not even JSON"},
		{"PATCH", "/v1/servers/" + sid, map[string]any{"name": "renamed"}},
		{"DELETE", "/v1/servers/" + sid, nil},
		{"DELETE", "/v1/servers/" + unknownLike(sid), nil},
		{"POST", "/v1/servers/" + sid + "/firewall-rules", map[string]any{"direction": "inbound", "protocol": "udp", "action": "allow"}},
		{"DELETE", "/v1/servers/" + sid + "/firewall-rules/" + rid, nil},
		{"POST", "/v1/servers/" + sid + "/api-keys", map[string]any{"name": "more"}},
		{"DELETE", "/v1/servers/" + sid + "/api-keys/" + did, nil},
		{"POST", "/v1/ssh-keys", map[string]any{"name": "k2", "public_key": pub}},
		{"DELETE", "/v1/ssh-keys/" + kid, nil},
	} {
		e.reqAs(ro, w.method, w.path, w.body, "Idempotency-Key", "ro").wantErr(t, 403, control.CodeForbidden, "")
	}
	sameState(t, before, snapshot(t, e), "a read-only token's writes")
	// The read-write token of the same project still writes.
	e.req("DELETE", "/v1/servers/"+sid+"/api-keys/"+did, nil).must(t, 204)
}

// TestRateLimitHeaders: every answer to a token carries its bucket's
// RateLimit-Limit, -Remaining and -Reset (Unix seconds when it is full
// again), errors and the 429 (with Retry-After) included; the bucket is
// per token and refills with the clock.
func TestRateLimitHeaders(t *testing.T) {
	e, clk := newClockEnv(t, func(c *control.Config) { c.RateLimit, c.RateBurst = 2, 3 })
	t0 := clk.now().Unix()
	want := func(a answer, remaining, reset int64) {
		t.Helper()
		got := [3]string{a.hdr.Get("RateLimit-Limit"), a.hdr.Get("RateLimit-Remaining"), a.hdr.Get("RateLimit-Reset")}
		if exp := [3]string{"3", fmt.Sprint(remaining), fmt.Sprint(reset)}; got != exp {
			t.Fatalf("%d %s: RateLimit headers %q, want %q", a.status, a.body, got, exp)
		}
	}
	want(e.req("GET", "/v1/servers", nil).must(t, 200), 2, t0+1) // 1 of 3 spent: full in 0.5 s
	want(e.req("GET", "/v1/servers/srv_x", nil), 1, t0+1)        // a 404 counts and says so
	want(e.req("PUT", "/v1/servers", map[string]any{}), 0, t0+2) // a 405 too; empty: full in 1.5 s
	limited := e.req("GET", "/v1/ssh-keys", nil)
	limited.wantErr(t, 429, control.CodeRateLimited, "")
	want(limited, 0, t0+2)
	if limited.hdr.Get("Retry-After") != "1" { // one request back in 0.5 s
		t.Fatalf("Retry-After %q", limited.hdr.Get("Retry-After"))
	}
	// Another token of the project has its own bucket.
	other := e.tokenFor(control.DefaultProject, true)
	want(e.reqAs(other, "GET", "/v1/nope", nil).must(t, 404), 2, t0+1)
	want(e.reqAs(other, "POST", "/v1/ssh-keys", map[string]any{}), 1, t0+1) // 403 read-only
	// The bucket refills at 2 a second.
	clk.add(time.Second)
	want(e.req("POST", "/v1/ssh-keys", "{"), 1, t0+2) // a 400
	// No token, no bucket: a 401 has no RateLimit headers, nor the public
	// document or the node protocol.
	for _, a := range []answer{e.reqAs("", "GET", "/v1/servers", nil), e.reqAs("", "GET", "/v1/openapi.json", nil),
		e.reqAs("hcn_x", "GET", "/v1/nodes/self/desired", nil)} {
		if v := a.hdr.Get("RateLimit-Remaining"); v != "" {
			t.Errorf("%d %s carries RateLimit-Remaining %s", a.status, a.body, v)
		}
	}
}

// TestTokenAdmin: the admin socket makes projects and tokens, refuses an
// unknown project or token by name, lists tokens with their project, scope
// and last use but never a secret, and a revoked token is refused on its
// very next request, its Idempotency-Key answers gone with it.
func TestTokenAdmin(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	e.admin("POST", "/admin/projects", map[string]any{"name": "Acme Inc"}).wantErr(t, 400, control.CodeInvalidRequest, "")
	acme, tok := e.project("acme", false)
	e.admin("POST", "/admin/projects", map[string]any{"name": "acme"}).wantErr(t, 409, control.CodeConflict, "name")
	a := e.admin("POST", "/admin/tokens", map[string]any{"project": "nope", "name": "x"})
	a.wantErr(t, 404, control.CodeNotFound, "")
	if !strings.Contains(errMessage(t, a), `no project "nope"`) {
		t.Fatalf("unknown project: %s", a.body)
	}
	e.admin("POST", "/admin/tokens", map[string]any{"name": "x"}).wantErr(t, 400, control.CodeInvalidRequest, "")
	ro := e.admin("POST", "/admin/tokens", map[string]any{"project": acme, "name": "ci", "read_only": true}).must(t, 201).obj(t)
	if ro["project"] != acme || ro["project_name"] != "acme" || ro["scope"] != control.ScopeReadOnly || !strings.HasPrefix(ro["token"].(string), "hct_") {
		t.Fatalf("new token %v", ro)
	}
	var projects []control.Project
	e.admin("GET", "/admin/projects", nil).must(t, 200).decode(t, &projects)
	names := map[string]string{}
	for _, p := range projects {
		names[p.Name] = p.ID
	}
	if len(projects) != 2 || names["acme"] != acme || !strings.HasPrefix(names[control.DefaultProject], "prj_") {
		t.Fatalf("projects %+v", projects)
	}

	list := func(query string) []control.TokenInfo {
		t.Helper()
		a := e.admin("GET", "/admin/tokens"+query, nil).must(t, 200)
		for _, secret := range []string{e.token, tok, ro["token"].(string)} {
			if strings.Contains(string(a.body), secret) || strings.Contains(string(a.body), strings.TrimPrefix(secret, "hct_")[:20]) {
				t.Fatalf("token list shows a secret: %s", a.body)
			}
		}
		var out []control.TokenInfo
		a.decode(t, &out)
		return out
	}
	if all := list(""); len(all) != 3 {
		t.Fatalf("all tokens: %+v", all)
	}
	mine := list("?project=acme")
	if len(mine) != 2 || mine[0].ProjectName != "acme" || mine[0].LastUsedAt != nil {
		t.Fatalf("acme's tokens: %+v", mine)
	}
	// byID finds a token in a list; rw is the one made by e.project.
	byID := func(l []control.TokenInfo, id string) control.TokenInfo {
		t.Helper()
		for _, ti := range l {
			if ti.ID == id {
				return ti
			}
		}
		t.Fatalf("no token %s in %+v", id, l)
		return control.TokenInfo{}
	}
	rw := mine[0]
	if rw.ID == ro["id"] {
		rw = mine[1]
	}
	if r := byID(mine, ro["id"].(string)); r.Scope != control.ScopeReadOnly || r.Name != "ci" || rw.Scope != control.ScopeReadWrite {
		t.Fatalf("acme's tokens: %+v", mine)
	}
	e.admin("GET", "/admin/tokens?project=nope", nil).wantErr(t, 404, control.CodeNotFound, "")

	// Last use: shown at once, persisted by the sweep.
	e.reqAs(tok, "POST", "/v1/ssh-keys", map[string]any{"name": "k"}, "Idempotency-Key", "k1").wantErr(t, 400, control.CodeInvalidRequest, "public_key")
	pub, _ := newKey(t, "ed25519")
	e.reqAs(tok, "POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": pub}, "Idempotency-Key", "k1").must(t, 201)
	used := clk.now()
	clk.add(time.Minute)
	if got := byID(list("?project=acme"), rw.ID).LastUsedAt; got == nil || !got.Equal(used) {
		t.Fatalf("last used %v, want %v", got, used)
	}
	e.sweep()
	e.restart()
	if got := byID(list("?project=acme"), rw.ID).LastUsedAt; got == nil || !got.Equal(used) {
		t.Fatalf("last used after a restart %v, want %v", got, used)
	}

	// Revocation.
	e.reqAs(tok, "GET", "/v1/servers", nil).must(t, 200)
	e.admin("DELETE", "/admin/tokens/"+rw.ID, nil).must(t, 204)
	e.reqAs(tok, "GET", "/v1/servers", nil).wantErr(t, 401, control.CodeUnauthorized, "")
	a = e.admin("DELETE", "/admin/tokens/"+rw.ID, nil)
	a.wantErr(t, 404, control.CodeNotFound, "")
	if !strings.Contains(errMessage(t, a), "no API token") {
		t.Fatalf("revoking again: %s", a.body)
	}
	_ = e.st.Scan("ctl/idem/"+rw.ID+"/", "", false, func(k string, _ []byte) (bool, error) {
		t.Errorf("left after revocation: %s", k)
		return true, nil
	})
	e.sweep() // a use noted before the revocation does not bring the token back
	if left := list("?project=acme"); len(left) != 1 || left[0].ID != ro["id"] {
		t.Fatalf("after revocation: %+v", left)
	}
	// The project's other token and other projects are untouched.
	e.reqAs(ro["token"].(string), "GET", "/v1/ssh-keys", nil).must(t, 200)
	e.req("GET", "/v1/ssh-keys", nil).must(t, 200)
}
