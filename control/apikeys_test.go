package control_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/nodeapi"
)

type apiKeyView struct {
	ID                string  `json:"id"`
	ServerID          string  `json:"server_id"`
	Name              string  `json:"name"`
	Key               *string `json:"key"`
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

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// waitForChange starts a long-poll after rev and returns its result
// channel once the poll really waits, so the change that follows must wake
// it.
func (e *env) waitForChange(t *testing.T, n node, after uint64) <-chan nodeapi.Desired {
	t.Helper()
	ch := make(chan nodeapi.Desired, 1)
	waiting := control.LongPollsWaiting(e.srv)
	go func() {
		d, _, err := n.client.Desired(context.Background(), after, 10*time.Second)
		if err != nil {
			t.Errorf("long-poll: %v", err)
		}
		ch <- d
	}()
	testutil.WaitFor(t, 10*time.Second, "the poll to wait", func() bool { return control.LongPollsWaiting(e.srv) > waiting })
	return ch
}

// TestAPIKeys: create, get, list and delete a server's deployment API keys;
// only hashes are stored and sent, and each change reaches a waiting node
// at once.
func TestAPIKeys(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("keys")).must(t, 201))
	d := converge(t, n, "192.0.2.70")
	base := "/v1/servers/" + sid + "/api-keys"

	woken := e.waitForChange(t, n, d.Revision)
	start := time.Now()
	expires := time.Now().UTC().Add(48 * time.Hour).Truncate(time.Second)
	a := e.req("POST", base, map[string]any{"name": "prod", "expires_at": expires.Format(time.RFC3339Nano),
		"requests_per_minute": 60, "tokens_per_minute": 10000}).must(t, 201)
	d2 := <-woken
	if el := time.Since(start); el > time.Second {
		t.Fatalf("the key reached the node after %v", el)
	}
	var k apiKeyView
	a.decode(t, &k)
	if !regexp.MustCompile(`^dk_[0-9A-Za-z]{24}$`).MatchString(k.ID) || k.Key == nil ||
		!regexp.MustCompile(`^hearth_live_[0-9A-Za-z]{32}$`).MatchString(*k.Key) || k.ServerID != sid || k.Name != "prod" ||
		k.Hint != "hearth_live_…"+(*k.Key)[len(*k.Key)-4:] || str(k.ExpiresAt) != expires.Format(time.RFC3339) ||
		k.RequestsPerMinute != 60 || k.TokensPerMinute != 10000 || k.Requests != 0 || k.LastUsedAt != nil {
		t.Fatalf("created key %s", a.body)
	}
	secret := *k.Key
	if len(d2.APIKeys) != 1 {
		t.Fatalf("desired keys %+v", d2.APIKeys)
	}
	dk := d2.APIKeys[0]
	if dk.ID != k.ID || dk.Name != "prod" || dk.Hash != sha256Hex(secret) || dk.ExpiresAt == nil || !dk.ExpiresAt.Equal(expires) ||
		dk.RequestsPerMinute != 60 || dk.TokensPerMinute != 10000 {
		t.Fatalf("desired key %+v", dk)
	}
	// The secret is nowhere in the state, and never in another answer.
	_ = e.st.Scan("", "", false, func(key string, val []byte) (bool, error) {
		if strings.Contains(key, secret) || strings.Contains(string(val), secret) {
			t.Errorf("secret stored under %q", key)
		}
		return true, nil
	})
	got := e.req("GET", base+"/"+k.ID, nil).must(t, 200)
	if strings.Contains(string(got.body), secret) || strings.Contains(string(got.body), `"key"`) {
		t.Fatalf("GET shows the secret: %s", got.body)
	}
	// The same name again is allowed (rotation); no expiry, no limits.
	b := e.req("POST", base, map[string]any{"name": "prod"}).must(t, 201)
	var k2 apiKeyView
	b.decode(t, &k2)
	if k2.ExpiresAt != nil || k2.RequestsPerMinute != 0 || *k2.Key == secret {
		t.Fatalf("second key %s", b.body)
	}
	var list struct {
		Data []apiKeyView
	}
	l := e.req("GET", base, nil).must(t, 200)
	l.decode(t, &list)
	if len(list.Data) != 2 || list.Data[0].ID != k2.ID || list.Data[1].ID != k.ID || strings.Contains(string(l.body), "hearth_live_"+(*k2.Key)[12:]) {
		t.Fatalf("list %s", l.body)
	}
	// The desired state over HTTP matches the document.
	desired := e.reqAs(n.credential, "GET", "/v1/nodes/self/desired", nil).must(t, 200).obj(t)
	if keys, _ := desired["api_keys"].([]any); len(keys) != 2 {
		t.Fatalf("desired api_keys %v", desired["api_keys"])
	}

	// Delete wakes the node at once; deleting again is a 404.
	d3 := n.desired(t, d2.Revision)
	woken = e.waitForChange(t, n, d3.Revision)
	start = time.Now()
	e.req("DELETE", base+"/"+k.ID, nil).must(t, 204)
	d4 := <-woken
	if el := time.Since(start); el > time.Second {
		t.Fatalf("the revocation reached the node after %v", el)
	}
	if len(d4.APIKeys) != 1 || d4.APIKeys[0].ID != k2.ID {
		t.Fatalf("desired after delete %+v", d4.APIKeys)
	}
	e.req("DELETE", base+"/"+k.ID, nil).wantErr(t, 404, control.CodeNotFound, "key_id")
	e.req("GET", base+"/"+k.ID, nil).wantErr(t, 404, control.CodeNotFound, "key_id")

	// Keys show in enforcement until the node applies them.
	v := e.enforcementOf(t, sid)
	if v.Enforcement.APIKeys.Status != "pending" || v.Status != "running" {
		t.Fatalf("enforcement %+v", v.Enforcement.APIKeys)
	}
	n.report(t, applied(d4, ""))
	if v = e.enforcementOf(t, sid); v.Enforcement.APIKeys.Status != "applied" ||
		rev(v.Enforcement.APIKeys.AppliedRevision) != int64(v.Enforcement.DesiredRevision) {
		t.Fatalf("enforcement %+v", v.Enforcement.APIKeys)
	}

	// Idempotency: a replay names the same key but never shows the secret
	// again (it is not stored).
	first := e.req("POST", base, map[string]any{"name": "idem"}, "Idempotency-Key", "k-1").must(t, 201)
	again := e.req("POST", base, map[string]any{"name": "idem"}, "Idempotency-Key", "k-1").must(t, 201)
	var f, r apiKeyView
	first.decode(t, &f)
	again.decode(t, &r)
	if f.Key == nil || r.Key != nil || r.ID != f.ID || again.hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay:\n%s\n%s", first.body, again.body)
	}
	if f.Key != nil && strings.Contains(string(again.body), *f.Key) {
		t.Fatal("replay shows the secret")
	}
}

// TestAPIKeyUsage: the usage a node reports shows on its keys; reports
// about keys the server does not own are ignored.
func TestAPIKeyUsage(t *testing.T) {
	e := newEnv(t, nil)
	n1 := e.enroll(hwM4)
	s1 := idOf(t, e.req("POST", "/v1/servers", serverBody("usage-1")).must(t, 201))
	n2 := e.enroll(hwM4)
	s2 := idOf(t, e.req("POST", "/v1/servers", serverBody("usage-2")).must(t, 201))
	k1 := idOf(t, e.req("POST", "/v1/servers/"+s1+"/api-keys", map[string]any{"name": "a"}).must(t, 201))
	k2 := idOf(t, e.req("POST", "/v1/servers/"+s2+"/api-keys", map[string]any{"name": "b"}).must(t, 201))
	d1 := converge(t, n1, "192.0.2.80")
	used := time.Date(2026, 11, 22, 4, 15, 5, 0, time.UTC)
	o := applied(d1, "")
	o.Usage = []nodeapi.KeyUsage{
		{ID: k1, Requests: 12, PromptTokens: 340, CompletionTokens: 560, LastUsedAt: &used},
		{ID: k2, Requests: 999},                          // another server's key
		{ID: "dk_AAAAAAAAAAAAAAAAAAAAAAAA", Requests: 5}, // no such key
		{ID: "key_local", Requests: 7},                   // a local key of the node
	}
	n1.report(t, o)
	var k apiKeyView
	e.req("GET", "/v1/servers/"+s1+"/api-keys/"+k1, nil).must(t, 200).decode(t, &k)
	if k.Requests != 12 || k.PromptTokens != 340 || k.CompletionTokens != 560 || str(k.LastUsedAt) != "2026-11-22T04:15:05Z" {
		t.Fatalf("usage %+v", k)
	}
	var list struct{ Data []apiKeyView }
	e.req("GET", "/v1/servers/"+s1+"/api-keys", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].Requests != 12 {
		t.Fatalf("list %+v", list.Data)
	}
	e.req("GET", "/v1/servers/"+s2+"/api-keys/"+k2, nil).must(t, 200).decode(t, &k)
	if k.Requests != 0 || k.LastUsedAt != nil {
		t.Fatalf("another node's report counted: %+v", k)
	}
	// Later reports replace the values; the node record does not keep them.
	o.Usage = []nodeapi.KeyUsage{{ID: k1, Requests: 13, PromptTokens: 350, CompletionTokens: 570, LastUsedAt: &used}}
	n1.report(t, o)
	e.req("GET", "/v1/servers/"+s1+"/api-keys/"+k1, nil).must(t, 200).decode(t, &k)
	if k.Requests != 13 {
		t.Fatalf("usage not updated: %+v", k)
	}
	nodes, _ := control.ListNodes(e.st)
	for _, nd := range nodes {
		if nd.Observed != nil && len(nd.Observed.Usage) != 0 {
			t.Fatalf("usage kept in the node record %+v", nd.Observed)
		}
	}
	_ = n2
}

// TestAPIKeyExpiry: an expired key leaves the desired state with a new
// revision at the next sweep, and stays listed with its expiry.
func TestAPIKeyExpiry(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("expiry")).must(t, 201))
	base := "/v1/servers/" + sid + "/api-keys"
	soon := clk.now().Add(time.Hour)
	short := idOf(t, e.req("POST", base, map[string]any{"name": "short", "expires_at": soon.Format(time.RFC3339)}).must(t, 201))
	later := idOf(t, e.req("POST", base, map[string]any{"name": "later", "expires_at": soon.Add(time.Hour).Format(time.RFC3339)}).must(t, 201))
	forever := idOf(t, e.req("POST", base, map[string]any{"name": "forever", "expires_at": nil}).must(t, 201))
	d := converge(t, n, "192.0.2.90")
	if len(d.APIKeys) != 3 {
		t.Fatalf("desired %+v", d.APIKeys)
	}
	clk.add(time.Hour - time.Second)
	n.report(t, applied(d, ""))
	e.sweep()
	if _, changed, _ := n.client.Desired(context.Background(), d.Revision, 10*time.Millisecond); changed {
		t.Fatal("new revision before any key expired")
	}
	woken := e.waitForChange(t, n, d.Revision)
	clk.add(time.Second)
	e.sweep()
	d2 := <-woken
	if len(d2.APIKeys) != 2 || d2.APIKeys[0].ID != later || d2.APIKeys[1].ID != forever {
		t.Fatalf("desired after expiry %+v", d2.APIKeys)
	}
	var k apiKeyView
	e.req("GET", base+"/"+short, nil).must(t, 200).decode(t, &k)
	if str(k.ExpiresAt) != soon.Format(time.RFC3339) {
		t.Fatalf("expired key %+v", k)
	}
	// A sweep with nothing newly expired gives no revision.
	n.report(t, applied(d2, ""))
	e.sweep()
	if _, changed, _ := n.client.Desired(context.Background(), d2.Revision, 10*time.Millisecond); changed {
		t.Fatal("new revision without a change")
	}
	// Deleting an expired key still works.
	e.req("DELETE", base+"/"+short, nil).must(t, 204)
	clk.add(time.Hour)
	e.sweep()
	d3 := n.desired(t, d2.Revision)
	if len(d3.APIKeys) != 1 || d3.APIKeys[0].ID != forever {
		t.Fatalf("desired after the second expiry %+v", d3.APIKeys)
	}
}

// TestDeleteServerWipesAPIKeys: the wipe carries no keys, and the wipe
// report removes the keys and their usage with the server.
func TestDeleteServerWipesAPIKeys(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("wipe-keys")).must(t, 201))
	var kids []string
	for i := range 3 {
		kids = append(kids, idOf(t, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": fmt.Sprint("k", i),
			"expires_at": time.Now().Add(time.Hour).Format(time.RFC3339)}).must(t, 201)))
	}
	d := converge(t, n, "192.0.2.100")
	o := applied(d, "")
	o.Usage = []nodeapi.KeyUsage{{ID: kids[0], Requests: 1}}
	n.report(t, o)
	e.req("DELETE", "/v1/servers/"+sid, nil).must(t, 204)
	// Keys cannot be added to a server being deleted; existing ones still read.
	e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "late"}).wantErr(t, 409, control.CodeConflict, "server_id")
	e.req("GET", "/v1/servers/"+sid+"/api-keys/"+kids[0], nil).must(t, 200)
	wd := n.desired(t, d.Revision)
	if !wd.Wipe || wd.APIKeys == nil || len(wd.APIKeys) != 0 {
		t.Fatalf("wipe %+v", wd)
	}
	n.report(t, applied(wd, ""))
	for _, pfx := range []string{"ctl/dk/", "ctl/dkid/", "ctl/dkexp/", "ctl/dkuse/"} {
		_ = e.st.Scan(pfx, "", false, func(k string, _ []byte) (bool, error) {
			t.Errorf("left after the wipe: %s", k)
			return true, nil
		})
	}
	// The next tenant of the node starts with no keys.
	next := idOf(t, e.req("POST", "/v1/servers", serverBody("next")).must(t, 201))
	nd := n.desired(t, wd.Revision)
	if nd.Server == nil || nd.Server.ID != next || len(nd.APIKeys) != 0 || nd.Wipe {
		t.Fatalf("next tenant %+v", nd)
	}
}

// TestAPIKeyBadInput: every refusal is a 4xx in the error envelope and
// changes nothing.
func TestAPIKeyBadInput(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("bad-keys")).must(t, 201))
	e.enroll(hwM4)
	other := idOf(t, e.req("POST", "/v1/servers", serverBody("other-keys")).must(t, 201))
	e.enroll(hwM4)
	bare := idOf(t, e.req("POST", "/v1/servers", serverBody("bare-keys", func(m map[string]any) {
		m["stack"] = "bare"
		delete(m, "model")
	})).must(t, 201))
	otherKey := idOf(t, e.req("POST", "/v1/servers/"+other+"/api-keys", map[string]any{"name": "theirs"}).must(t, 201))
	d := converge(t, n, "192.0.2.110")
	base := "/v1/servers/" + sid + "/api-keys"
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	cases := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   string
		param  string
	}{
		{"unknown server", "POST", "/v1/servers/srv_AAAAAAAAAAAAAAAAAAAAAAAA/api-keys", map[string]any{"name": "x"}, 404, control.CodeNotFound, "server_id"},
		{"malformed server", "POST", "/v1/servers/nope/api-keys", map[string]any{"name": "x"}, 404, control.CodeNotFound, "server_id"},
		{"list unknown server", "GET", "/v1/servers/srv_AAAAAAAAAAAAAAAAAAAAAAAA/api-keys", nil, 404, control.CodeNotFound, "server_id"},
		{"another server's key", "GET", base + "/" + otherKey, nil, 404, control.CodeNotFound, "key_id"},
		{"delete another server's key", "DELETE", base + "/" + otherKey, nil, 404, control.CodeNotFound, "key_id"},
		{"unknown key", "GET", base + "/dk_AAAAAAAAAAAAAAAAAAAAAAAA", nil, 404, control.CodeNotFound, "key_id"},
		{"malformed key", "DELETE", base + "/fw_x", nil, 404, control.CodeNotFound, "key_id"},
		{"missing name", "POST", base, map[string]any{}, 400, control.CodeInvalidRequest, "name"},
		{"empty name", "POST", base, map[string]any{"name": ""}, 400, control.CodeInvalidRequest, "name"},
		{"control character", "POST", base, map[string]any{"name": "a\nb"}, 400, control.CodeInvalidRequest, "name"},
		{"long name", "POST", base, map[string]any{"name": strings.Repeat("n", 101)}, 400, control.CodeInvalidRequest, "name"},
		{"numeric name", "POST", base, map[string]any{"name": 5}, 400, control.CodeInvalidRequest, "name"},
		{"malformed expires_at", "POST", base, map[string]any{"name": "x", "expires_at": "tomorrow"}, 400, control.CodeInvalidRequest, "expires_at"},
		{"date only", "POST", base, map[string]any{"name": "x", "expires_at": "2099-01-01"}, 400, control.CodeInvalidRequest, "expires_at"},
		{"no zone", "POST", base, map[string]any{"name": "x", "expires_at": "2099-01-01T00:00:00"}, 400, control.CodeInvalidRequest, "expires_at"},
		{"numeric expires_at", "POST", base, map[string]any{"name": "x", "expires_at": 4102444800}, 400, control.CodeInvalidRequest, "expires_at"},
		{"past expires_at", "POST", base, map[string]any{"name": "x", "expires_at": past}, 400, control.CodeInvalidRequest, "expires_at"},
		{"negative rpm", "POST", base, map[string]any{"name": "x", "requests_per_minute": -1}, 400, control.CodeInvalidRequest, "requests_per_minute"},
		{"fractional rpm", "POST", base, map[string]any{"name": "x", "requests_per_minute": 1.5}, 400, control.CodeInvalidRequest, "requests_per_minute"},
		{"string rpm", "POST", base, map[string]any{"name": "x", "requests_per_minute": "10"}, 400, control.CodeInvalidRequest, "requests_per_minute"},
		{"huge tpm", "POST", base, `{"name":"x","tokens_per_minute":1e30}`, 400, control.CodeInvalidRequest, "tokens_per_minute"},
		{"over the cap", "POST", base, map[string]any{"name": "x", "tokens_per_minute": 1_000_000_001}, 400, control.CodeInvalidRequest, "tokens_per_minute"},
		{"negative tpm", "POST", base, map[string]any{"name": "x", "tokens_per_minute": -5}, 400, control.CodeInvalidRequest, "tokens_per_minute"},
		{"unknown field", "POST", base, map[string]any{"name": "x", "key": "hearth_live_mine"}, 400, control.CodeInvalidRequest, "key"},
		{"malformed", "POST", base, `{"name":`, 400, control.CodeInvalidRequest, ""},
		{"bad limit", "GET", base + "?limit=0", nil, 400, control.CodeInvalidRequest, "limit"},
		{"bad cursor", "GET", base + "?cursor=zzz", nil, 400, control.CodeInvalidRequest, "cursor"},
		{"unknown query", "GET", base + "?status=x", nil, 400, control.CodeInvalidRequest, "status"},
		{"bare server", "POST", "/v1/servers/" + bare + "/api-keys", map[string]any{"name": "x"}, 409, control.CodeConflict, "server_id"},
		{"method", "PUT", base, map[string]any{"name": "x"}, 405, control.CodeMethodNotAllowed, ""},
		{"patch a key", "PATCH", base + "/" + otherKey, map[string]any{"name": "x"}, 405, control.CodeMethodNotAllowed, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.req(c.method, c.path, c.body).wantErr(t, c.status, c.code, c.param)
		})
	}
	var list struct{ Data []any }
	e.req("GET", base, nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 0 {
		t.Fatalf("a refused request made a key: %v", list.Data)
	}
	e.req("GET", "/v1/servers/"+bare+"/api-keys", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 0 {
		t.Fatalf("bare server keys %v", list.Data)
	}
	if _, changed, _ := n.client.Desired(context.Background(), d.Revision, 10*time.Millisecond); changed {
		t.Fatal("a refused request gave the node a new revision")
	}
	// The other server's key is untouched.
	e.req("GET", "/v1/servers/"+other+"/api-keys/"+otherKey, nil).must(t, 200)

	// At most MaxAPIKeysPerServer keys, then 409.
	for i := range control.MaxAPIKeysPerServer {
		e.req("POST", base, map[string]any{"name": fmt.Sprint("k", i)}).must(t, 201)
	}
	e.req("POST", base, map[string]any{"name": "one too many"}).wantErr(t, 409, control.CodeConflict, "server_id")
	// Pagination walks them all, newest first, and a cursor of another
	// list is refused.
	seen := 0
	cursor := ""
	for {
		var p struct {
			Data       []apiKeyView
			HasMore    bool    `json:"has_more"`
			NextCursor *string `json:"next_cursor"`
		}
		q := base + "?limit=30"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		e.req("GET", q, nil).must(t, 200).decode(t, &p)
		seen += len(p.Data)
		if !p.HasMore {
			break
		}
		cursor = *p.NextCursor
	}
	if seen != control.MaxAPIKeysPerServer {
		t.Fatalf("walked %d keys", seen)
	}
	var p struct {
		NextCursor *string `json:"next_cursor"`
	}
	e.req("GET", "/v1/servers?limit=1", nil).must(t, 200).decode(t, &p)
	e.req("GET", base+"?cursor="+*p.NextCursor, nil).wantErr(t, 400, control.CodeInvalidRequest, "cursor")
}
