package control_test

import (
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
)

type auditView struct {
	ID          string   `json:"id"`
	Time        string   `json:"time"`
	TokenID     string   `json:"token_id"`
	TokenName   string   `json:"token_name"`
	Method      string   `json:"method"`
	Path        string   `json:"path"`
	Status      int      `json:"status"`
	RequestID   string   `json:"request_id"`
	SourceIP    string   `json:"source_ip"`
	ResourceIDs []string `json:"resource_ids"`
	ActionIDs   []string `json:"action_ids"`
}

type auditPage struct {
	Data       []auditView `json:"data"`
	HasMore    bool        `json:"has_more"`
	NextCursor *string     `json:"next_cursor"`
}

func (e *env) auditLog(t *testing.T, token string, q url.Values) auditPage {
	t.Helper()
	var p auditPage
	e.reqAs(token, "GET", "/v1/audit-log?"+q.Encode(), nil).must(t, 200).decode(t, &p)
	return p
}

// TestAuditLog: every mutating request a token was let in for leaves an
// entry — who, what, when, from where, the answer — whatever the answer;
// reads and requests without a valid token leave none. Read-only tokens
// may read the log; another project's log is not shown.
func TestAuditLog(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	created := e.req("POST", "/v1/servers", serverBody("audited"), "Idempotency-Key", "once").must(t, 201)
	sid := idOf(t, created)
	createAct := created.hdr.Get("X-Action-Id")
	e.req("POST", "/v1/servers", serverBody("audited"), "Idempotency-Key", "once").must(t, 201) // replayed
	e.req("POST", "/v1/servers", serverBody("Bad Name")).wantErr(t, 400, "invalid_request", "name")
	e.req("GET", "/v1/servers/"+sid, nil).must(t, 200)
	e.reqAs("hct_nope", "DELETE", "/v1/servers/"+sid, nil).wantErr(t, 401, "unauthorized", "")
	rule := e.req("POST", "/v1/servers/"+sid+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "icmp",
		"action": "allow"}).must(t, 201)
	fw := idOf(t, rule)
	_, roTok := e.project("readers", true)
	ro := e.tokenFor("default", true)
	e.reqAs(ro, "DELETE", "/v1/servers/"+sid, nil).wantErr(t, 403, "forbidden", "")
	del := e.req("DELETE", "/v1/servers/"+sid+"/firewall-rules/"+fw, nil).must(t, 204)

	log := e.auditLog(t, ro, url.Values{}) // a read-only token reads it
	type row struct {
		method, path string
		status       int
	}
	var got []row
	for _, a := range log.Data {
		got = append(got, row{a.Method, a.Path, a.Status})
	}
	want := []row{
		{"DELETE", "/v1/servers/" + sid + "/firewall-rules/" + fw, 204},
		{"DELETE", "/v1/servers/" + sid, 403},
		{"POST", "/v1/servers/" + sid + "/firewall-rules", 201},
		{"POST", "/v1/servers", 400},
		{"POST", "/v1/servers", 201},
		{"POST", "/v1/servers", 201},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("log\n got %+v\nwant %+v", got, want)
	}
	first, last := log.Data[len(log.Data)-1], log.Data[0]
	if first.TokenName != "test" || first.SourceIP != "127.0.0.1" || first.RequestID != created.hdr.Get("X-Request-Id") ||
		!slices.Equal(first.ResourceIDs, []string{sid}) || !slices.Equal(first.ActionIDs, []string{createAct}) {
		t.Fatalf("the create's entry %+v", first)
	}
	if !slices.Equal(last.ResourceIDs, []string{sid, fw}) || !slices.Equal(last.ActionIDs, del.hdr.Values("X-Action-Id")) {
		t.Fatalf("the rule deletion's entry %+v", last)
	}
	if log.Data[1].TokenID == first.TokenID || log.Data[1].TokenID == "" {
		t.Fatalf("the read-only token's entry %+v", log.Data[1])
	}
	for i := 1; i < len(log.Data); i++ {
		if log.Data[i-1].Time < log.Data[i].Time && len(log.Data[i-1].Time) == len(log.Data[i].Time) {
			t.Fatalf("not newest first: %s before %s", log.Data[i-1].Time, log.Data[i].Time)
		}
	}

	// Filters: a resource, a token, a window; pages.
	byRule := e.auditLog(t, e.token, url.Values{"resource_id": {fw}})
	if len(byRule.Data) != 2 {
		t.Fatalf("entries of %s: %+v", fw, byRule.Data)
	}
	byRO := e.auditLog(t, e.token, url.Values{"token_id": {log.Data[1].TokenID}})
	if len(byRO.Data) != 1 || byRO.Data[0].Status != 403 {
		t.Fatalf("entries of the read-only token: %+v", byRO.Data)
	}
	bySrvAndTok := e.auditLog(t, e.token, url.Values{"resource_id": {sid}, "token_id": {first.TokenID}})
	if len(bySrvAndTok.Data) != 4 {
		t.Fatalf("entries of %s by %s: %+v", sid, first.TokenID, bySrvAndTok.Data)
	}
	future := e.auditLog(t, e.token, url.Values{"start": {time.Now().Add(time.Hour).Format(time.RFC3339)}})
	past := e.auditLog(t, e.token, url.Values{"end": {time.Now().Add(time.Hour).Format(time.RFC3339)}})
	if len(future.Data) != 0 || len(past.Data) != len(want) {
		t.Fatalf("windows: %d after an hour from now, %d before", len(future.Data), len(past.Data))
	}
	var paged []string
	q := url.Values{"limit": {"4"}}
	for {
		p := e.auditLog(t, e.token, q)
		for _, a := range p.Data {
			paged = append(paged, a.ID)
		}
		if p.NextCursor == nil {
			break
		}
		q.Set("cursor", *p.NextCursor)
	}
	var ids []string
	for _, a := range log.Data {
		ids = append(ids, a.ID)
	}
	if !slices.Equal(paged, ids) {
		t.Fatalf("pages %v, want %v", paged, ids)
	}
	if other := e.auditLog(t, roTok, url.Values{}); len(other.Data) != 0 {
		t.Fatalf("another project sees %+v", other.Data)
	}
	for param, v := range map[string]string{"start": "yesterday", "end": "soon", "token_id": "me", "resource_id": "x y", "limit": "0"} {
		e.req("GET", "/v1/audit-log?"+url.Values{param: {v}}.Encode(), nil).wantErr(t, 400, "invalid_request", param)
	}

	// Operators see every project's, newest first.
	var all []control.AuditEntry
	e.admin("GET", "/admin/audit-log?limit=3", nil).must(t, 200).decode(t, &all)
	if len(all) != 3 || all[0].ID != log.Data[0].ID {
		t.Fatalf("operator's view %+v", all)
	}
	listed, err := control.ListAudit(e.st, "default", time.Time{}, time.Time{}, 100)
	if err != nil || len(listed) != len(want) {
		t.Fatalf("ListAudit: %d entries, %v", len(listed), err)
	}
	if _, err := control.ListAudit(e.st, "nope", time.Time{}, time.Time{}, 10); err == nil {
		t.Fatal("an unknown project listed")
	}
}

// TestAuditSkipsRateLimited: a request refused by the token's bucket
// leaves no entry (a flood would write one per request).
func TestAuditSkipsRateLimited(t *testing.T) {
	e := newEnv(t, func(c *control.Config) { c.RateLimit, c.RateBurst = 0.001, 2 })
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "x", "public_key": "nope"}).wantErr(t, 400, "invalid_request", "public_key")
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "x", "public_key": "nope"}).wantErr(t, 400, "invalid_request", "public_key")
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "x", "public_key": "nope"}).wantErr(t, 429, "rate_limited", "")
	entries, err := control.ListAudit(e.st, "", time.Time{}, time.Time{}, 10)
	if err != nil || len(entries) != 2 {
		t.Fatalf("%d entries (%v), want the 2 let in", len(entries), err)
	}
}

// TestAuditKeepsNoSecret: no entry holds a secret: not the token's, not
// an API key's, not one pasted into a path where an ID belongs.
func TestAuditKeepsNoSecret(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("secretive")).must(t, 201))
	var k struct {
		Key string `json:"key"`
	}
	e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "k"}).must(t, 201).decode(t, &k)
	e.req("DELETE", "/v1/servers/"+sid+"/api-keys/"+k.Key, nil).wantErr(t, 404, "not_found", "key_id")
	e.req("DELETE", "/v1/servers/"+e.token, nil).wantErr(t, 404, "not_found", "id")
	raw := e.req("GET", "/v1/audit-log", nil).must(t, 200)
	var log auditPage
	raw.decode(t, &log)
	if len(log.Data) != 4 || log.Data[0].Path != "/v1/servers/hct_…" || log.Data[1].Path != "/v1/servers/"+sid+"/api-keys/hearth_live_…" {
		t.Fatalf("log %+v", log.Data)
	}
	for _, secret := range []string{k.Key, e.token, e.token[len("hct_"):]} {
		if strings.Contains(string(raw.body), secret) {
			t.Fatalf("the audit log shows a secret: %s", raw.body)
		}
		_ = e.st.Scan("ctl/aud/", "", false, func(key string, val []byte) (bool, error) {
			if strings.Contains(key, secret) || strings.Contains(string(val), secret) {
				t.Errorf("a secret in the audit log's record %s", key)
			}
			return true, nil
		})
	}
}
