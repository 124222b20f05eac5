package control_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/nodeapi"
)

var hwM4 = nodeapi.Hardware{Chip: "m4", RAM: 64, Storage: 1000}

func TestAuth(t *testing.T) {
	e := newEnv(t, nil)
	paths := []struct{ method, path string }{
		{"GET", "/v1/servers"}, {"POST", "/v1/servers"}, {"GET", "/v1/servers/srv_x"}, {"DELETE", "/v1/servers/srv_x"},
		{"GET", "/v1/ssh-keys"}, {"POST", "/v1/ssh-keys"}, {"DELETE", "/v1/ssh-keys/sk_x"},
		{"GET", "/v1/servers/srv_x/firewall-rules"}, {"POST", "/v1/servers/srv_x/firewall-rules"},
		{"DELETE", "/v1/servers/srv_x/firewall-rules/fw_x"}, {"PATCH", "/v1/servers/srv_x"},
		{"GET", "/v1/servers/srv_x/api-keys"}, {"POST", "/v1/servers/srv_x/api-keys"},
		{"GET", "/v1/servers/srv_x/api-keys/dk_x"}, {"DELETE", "/v1/servers/srv_x/api-keys/dk_x"},
	}
	other := "hct_" + strings.Repeat("A", 40)
	for _, p := range paths {
		for _, tok := range []string{"", "garbage", other, e.token + "x"} {
			e.reqAs(tok, p.method, p.path, nil).wantErr(t, 401, control.CodeUnauthorized, "")
		}
	}
	// Lower-case scheme is accepted (RFC 7235: schemes are case-insensitive).
	a := e.reqAs("", "GET", "/v1/servers", nil, "Authorization", "bearer "+e.token)
	a.must(t, 200)
	// The document itself is public.
	doc := e.reqAs("", "GET", "/v1/openapi.json", nil).must(t, 200)
	if !strings.Contains(string(doc.body), `"openapi": "3.1.0"`) {
		t.Fatalf("openapi.json body: %.100s", doc.body)
	}
}

func TestTokensAreStoredHashed(t *testing.T) {
	e := newEnv(t, nil)
	found := false
	err := e.st.Scan("", "", false, func(key string, val []byte) (bool, error) {
		if strings.Contains(key, e.token) || strings.Contains(string(val), e.token) {
			t.Errorf("token stored in clear under %q", key)
		}
		found = true
		return true, nil
	})
	if err != nil || !found {
		t.Fatalf("scan: %v (found %v)", err, found)
	}
}

func TestIDsAndRequestIDs(t *testing.T) {
	e := newEnv(t, nil)
	pub, _ := newKey(t, "ed25519")
	a := e.req("POST", "/v1/ssh-keys", map[string]any{"name": "laptop", "public_key": pub}).must(t, 201)
	if !regexp.MustCompile(`^sk_[0-9A-Za-z]{24}$`).MatchString(idOf(t, a)) {
		t.Fatalf("ssh key id %q", idOf(t, a))
	}
	seen := map[string]bool{}
	for range 5 {
		rid := e.req("GET", "/v1/servers", nil).hdr.Get("X-Request-Id")
		if seen[rid] || !strings.HasPrefix(rid, "req_") {
			t.Fatalf("request id %q repeated or malformed", rid)
		}
		seen[rid] = true
	}
}

func TestRoutingErrors(t *testing.T) {
	e := newEnv(t, nil)
	a := e.req("PUT", "/v1/servers", map[string]any{})
	a.wantErr(t, 405, control.CodeMethodNotAllowed, "")
	if a.hdr.Get("Allow") != "GET, POST" {
		t.Fatalf("Allow %q", a.hdr.Get("Allow"))
	}
	e.req("PATCH", "/v1/ssh-keys/sk_x", nil).wantErr(t, 405, control.CodeMethodNotAllowed, "")
	a = e.req("PUT", "/v1/servers/srv_x", map[string]any{})
	a.wantErr(t, 405, control.CodeMethodNotAllowed, "")
	if a.hdr.Get("Allow") != "DELETE, GET, PATCH" {
		t.Fatalf("Allow %q", a.hdr.Get("Allow"))
	}
	e.req("GET", "/v1/nope", nil).wantErr(t, 404, control.CodeNotFound, "")
	e.req("GET", "/", nil).wantErr(t, 404, control.CodeNotFound, "")
}

func TestServerValidation(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	del := func(k string) func(map[string]any) { return func(m map[string]any) { delete(m, k) } }
	cases := []struct {
		name  string
		body  any
		param string
	}{
		{"uppercase name", serverBody("Web"), "name"},
		{"leading dash", serverBody("-web"), "name"},
		{"trailing dash", serverBody("web-"), "name"},
		{"long name", serverBody(strings.Repeat("a", 64)), "name"},
		{"empty name", serverBody(""), "name"},
		{"underscore", serverBody("a_b"), "name"},
		{"missing chip", serverBody("a", del("chip")), "chip"},
		{"zero ram", serverBody("a", set("ram", 0)), "ram"},
		{"negative ram", serverBody("a", set("ram", -4)), "ram"},
		{"string ram", serverBody("a", set("ram", "32")), "ram"},
		{"fractional ram", serverBody("a", set("ram", 1.5)), "ram"},
		{"huge ram", `{"name":"a","chip":"m4","ram":1e400}`, "ram"},
		{"null storage", serverBody("a", set("storage", nil)), "storage"},
		{"bool storage", serverBody("a", set("storage", true)), "storage"},
		{"unknown stack", serverBody("a", set("stack", "k8s")), "stack"},
		{"deployment without model", serverBody("a", del("model")), "model"},
		{"bare with model", serverBody("a", set("stack", "bare")), "model"},
		{"bad model", serverBody("a", set("model", "rm -rf")), "model"},
		{"hourly billing", serverBody("a", set("billing", "hourly")), "billing"},
		{"missing billing", serverBody("a", del("billing")), "billing"},
		{"unknown field", serverBody("a", set("colour", "red")), "colour"},
		{"field name case", serverBody("a", del("name"), set("Name", "a")), "Name"},
		{"ssh_key_ids not array", serverBody("a", set("ssh_key_ids", "sk_1")), "ssh_key_ids"},
		{"ssh_key_ids of numbers", serverBody("a", set("ssh_key_ids", []int{1})), "ssh_key_ids"},
		{"unknown ssh key", serverBody("a", set("ssh_key_ids", []string{"sk_AAAAAAAAAAAAAAAAAAAAAAAA"})), "ssh_key_ids"},
		{"malformed", `{"name": "a",`, ""},
		{"not json", `hello`, ""},
		{"array", `[]`, ""},
		{"string", `"x"`, ""},
		{"empty", ``, ""},
		{"two objects", `{} {}`, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := e.req("POST", "/v1/servers", c.body)
			a.wantErr(t, 400, control.CodeInvalidRequest, c.param)
		})
	}
	// Nothing above took the node.
	e.req("POST", "/v1/servers", serverBody("ok")).must(t, 201)
}

func TestBodyLimit(t *testing.T) {
	e := newEnv(t, nil)
	big := `{"name":"` + strings.Repeat("a", 2<<20) + `"}`
	e.req("POST", "/v1/servers", big).wantErr(t, 413, control.CodePayloadTooLarge, "")
	e.req("POST", "/v1/ssh-keys", big, "Idempotency-Key", "k1").wantErr(t, 413, control.CodePayloadTooLarge, "")
}

func TestCapacity(t *testing.T) {
	e := newEnv(t, nil)
	e.req("POST", "/v1/servers", serverBody("a")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	small := e.enroll(nodeapi.Hardware{Chip: "m4", RAM: 32, Storage: 500})
	big := e.enroll(nodeapi.Hardware{Chip: "m4", RAM: 128, Storage: 4000})
	e.enroll(nodeapi.Hardware{Chip: "x86", RAM: 512, Storage: 9000})
	// Too big for every m4 node.
	e.req("POST", "/v1/servers", serverBody("a", func(m map[string]any) { m["ram"] = 129 })).
		wantErr(t, 409, control.CodeCapacityUnavailable, "")
	e.req("POST", "/v1/servers", serverBody("a", func(m map[string]any) { m["chip"] = "m5" })).
		wantErr(t, 409, control.CodeCapacityUnavailable, "")
	// Best fit: a small request takes the small node, leaving the big one.
	s1 := idOf(t, e.req("POST", "/v1/servers", serverBody("a", func(m map[string]any) { m["ram"] = 16 })).must(t, 201))
	d, _, err := small.client.Desired(context.Background(), 0, time.Second)
	if err != nil || d.Server == nil || d.Server.ID != s1 {
		t.Fatalf("small node desired %+v, %v; want server %s", d, err, s1)
	}
	s2 := idOf(t, e.req("POST", "/v1/servers", serverBody("b", func(m map[string]any) { m["ram"] = 16 })).must(t, 201))
	d, _, err = big.client.Desired(context.Background(), 0, time.Second)
	if err != nil || d.Server == nil || d.Server.ID != s2 {
		t.Fatalf("big node desired %+v, %v; want server %s", d, err, s2)
	}
	e.req("POST", "/v1/servers", serverBody("c")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	// The same name twice is a conflict, whatever the capacity.
	e.req("POST", "/v1/servers", serverBody("a")).wantErr(t, 409, control.CodeConflict, "name")
}

func TestConcurrentCreatesShareNoNode(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	const n = 16
	var wg sync.WaitGroup
	statuses := make([]int, n)
	codes := make([]string, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			a := e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("race-%d", i)))
			statuses[i] = a.status
			if a.status != 201 {
				codes[i], _ = a.err(t)
			}
		}()
	}
	close(start)
	wg.Wait()
	created := 0
	for i := range n {
		switch {
		case statuses[i] == 201:
			created++
		case statuses[i] == 409 && codes[i] == control.CodeCapacityUnavailable:
		default:
			t.Errorf("request %d: %d %s", i, statuses[i], codes[i])
		}
	}
	if created != 1 {
		t.Fatalf("%d creates succeeded, want exactly 1", created)
	}
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 {
		t.Fatalf("%d servers listed, want 1", len(list.Data))
	}
}

// converge plays the node: take the desired state and report it applied
// and healthy.
func converge(t *testing.T, n node, ip string) nodeapi.Desired {
	t.Helper()
	d, changed, err := n.client.Desired(context.Background(), 0, time.Second)
	if err != nil || !changed {
		t.Fatalf("desired: %v (changed %v)", err, changed)
	}
	err = n.client.ReportObserved(context.Background(), applied(d, ip))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestServerLifecycle(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	pub, _ := newKey(t, "ed25519")
	kid := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "me", "public_key": pub}).must(t, 201))
	a := e.req("POST", "/v1/servers", serverBody("web-1", func(m map[string]any) { m["ssh_key_ids"] = []string{kid} })).must(t, 201)
	srv := a.obj(t)
	id := srv["id"].(string)
	if !regexp.MustCompile(`^srv_[0-9A-Za-z]{24}$`).MatchString(id) {
		t.Fatalf("server id %q", id)
	}
	if srv["status"] != "provisioning" || srv["ip"] != nil || srv["model"] != "llama3.2:1b" ||
		srv["deployment_url"] != "https://web-1.deploy.test/api/v1" || srv["billing"] != "monthly" {
		t.Fatalf("created server %s", a.body)
	}
	if _, err := time.Parse(time.RFC3339, srv["created_at"].(string)); err != nil || !strings.HasSuffix(srv["created_at"].(string), "Z") {
		t.Fatalf("created_at %v", srv["created_at"])
	}

	// A report that has not applied everything leaves it provisioning.
	d, _, err := n.client.Desired(context.Background(), 0, time.Second)
	if err != nil || d.Server == nil || d.Server.ID != id || d.Model != "llama3.2:1b" || len(d.SSHKeys) != 1 || d.SSHKeys[0].ID != kid || d.Wipe {
		t.Fatalf("desired %+v, %v", d, err)
	}
	report := applied(d, "203.0.113.45")
	report.SSHKeysRevision, report.SSHKeysError = d.Revision-1, "disk full"
	if err := n.client.ReportObserved(context.Background(), report); err != nil {
		t.Fatal(err)
	}
	got := e.req("GET", "/v1/servers/"+id, nil).must(t, 200).obj(t)
	if got["status"] != "provisioning" || got["ip"] != "203.0.113.45" {
		t.Fatalf("after partial report: %v", got)
	}
	report.SSHKeysRevision, report.SSHKeysError, report.RuntimeHealthy = d.Revision, "", false
	_ = n.client.ReportObserved(context.Background(), report)
	if s := e.req("GET", "/v1/servers/"+id, nil).obj(t)["status"]; s != "provisioning" {
		t.Fatalf("unhealthy runtime gave status %v", s)
	}
	report.RuntimeHealthy = true
	_ = n.client.ReportObserved(context.Background(), report)
	if s := e.req("GET", "/v1/servers/"+id, nil).obj(t)["status"]; s != "running" {
		t.Fatalf("status %v, want running", s)
	}

	// Lists mask the address; GET shows it.
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 || list.Data[0]["ip"] != "203.0.x.x" {
		t.Fatalf("list %+v", list.Data)
	}
	report.IP = "2001:db8:1:2:aaaa:bbbb:cccc:dddd"
	_ = n.client.ReportObserved(context.Background(), report)
	e.req("GET", "/v1/servers", nil).must(t, 200).decode(t, &list)
	if list.Data[0]["ip"] != "2001:db8:1:2:x:x:x:x" {
		t.Fatalf("masked IPv6 %v", list.Data[0]["ip"])
	}
	if ip := e.req("GET", "/v1/servers/"+id, nil).obj(t)["ip"]; ip != "2001:db8:1:2:aaaa:bbbb:cccc:dddd" {
		t.Fatalf("GET ip %v", ip)
	}

	// Delete: 204, visible as deleting, a second delete is 404.
	del := e.req("DELETE", "/v1/servers/"+id, nil).must(t, 204)
	if len(del.body) != 0 {
		t.Fatalf("DELETE body %q", del.body)
	}
	if s := e.req("GET", "/v1/servers/"+id, nil).obj(t)["status"]; s != "deleting" {
		t.Fatalf("status %v, want deleting", s)
	}
	e.req("DELETE", "/v1/servers/"+id, nil).wantErr(t, 404, control.CodeNotFound, "id")
	// The node is still taken until it confirms the wipe.
	e.req("POST", "/v1/servers", serverBody("web-2")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	wd, changed, err := n.client.Desired(context.Background(), d.Revision, time.Second)
	if err != nil || !changed || !wd.Wipe {
		t.Fatalf("wipe desired %+v changed %v err %v", wd, changed, err)
	}
	// A report that is not the wipe changes nothing.
	_ = n.client.ReportObserved(context.Background(), nodeapi.Observed{Revision: wd.Revision, RuntimeHealthy: true})
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200)
	_ = n.client.ReportObserved(context.Background(), applied(wd, ""))
	e.req("GET", "/v1/servers/"+id, nil).wantErr(t, 404, control.CodeNotFound, "id")
	e.req("DELETE", "/v1/servers/"+id, nil).wantErr(t, 404, control.CodeNotFound, "id")
	// Back in the pool, with an empty desired state; the name is free again.
	empty, _, err := n.client.Desired(context.Background(), wd.Revision, time.Second)
	if err != nil || empty.Server != nil || empty.Wipe || len(empty.SSHKeys) != 0 {
		t.Fatalf("desired after wipe %+v %v", empty, err)
	}
	e.req("POST", "/v1/servers", serverBody("web-1")).must(t, 201)
}

func TestProvisionTimeout(t *testing.T) {
	e := newEnv(t, func(c *control.Config) { c.ProvisionTimeout = 150 * time.Millisecond })
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("slow")).must(t, 201))
	testutil.WaitFor(t, 10*time.Second, "the server to fail provisioning", func() bool {
		s := e.req("GET", "/v1/servers/"+id, nil).obj(t)["status"]
		if s != "failed" && s != "provisioning" {
			t.Fatalf("status %v", s)
		}
		return s == "failed"
	})
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers?status=failed", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 {
		t.Fatalf("failed list %v", list.Data)
	}
	// A node that converges late still brings the server up.
	converge(t, n, "198.51.100.7")
	if s := e.req("GET", "/v1/servers/"+id, nil).obj(t)["status"]; s != "running" {
		t.Fatalf("status %v after late convergence", s)
	}
}

func TestSSHKeys(t *testing.T) {
	e := newEnv(t, nil)
	for _, kt := range []struct {
		typ   string
		extra []string
	}{{"ed25519", nil}, {"rsa", []string{"-b", "3072"}}, {"ecdsa", []string{"-b", "384"}}} {
		pub, fp := newKey(t, kt.typ, kt.extra...)
		a := e.req("POST", "/v1/ssh-keys", map[string]any{"name": kt.typ + " key", "public_key": pub}).must(t, 201)
		k := a.obj(t)
		if k["fingerprint"] != fp {
			t.Fatalf("%s fingerprint %v, ssh-keygen -lf says %s", kt.typ, k["fingerprint"], fp)
		}
		// The same key again, even with another comment, is a conflict naming the first.
		f := strings.Fields(pub)
		dup := e.req("POST", "/v1/ssh-keys", map[string]any{"name": "again", "public_key": f[0] + " " + f[1] + " other"})
		dup.wantErr(t, 409, control.CodeConflict, "public_key")
		if !strings.Contains(string(dup.body), k["id"].(string)) {
			t.Fatalf("conflict does not name %v: %s", k["id"], dup.body)
		}
		got := e.req("GET", "/v1/ssh-keys/"+k["id"].(string), nil).must(t, 200).obj(t)
		if got["fingerprint"] != fp || got["name"] != kt.typ+" key" {
			t.Fatalf("GET key %v", got)
		}
	}
	for name, body := range map[string]any{
		"public_key": map[string]any{"name": "x", "public_key": "ssh-ed25519 AAAAnotakey"},
		"name":       map[string]any{"name": "", "public_key": "ssh-ed25519 AAAA"},
		"id":         map[string]any{"id": "sk_1", "name": "x", "public_key": "x"},
	} {
		e.req("POST", "/v1/ssh-keys", body).wantErr(t, 400, control.CodeInvalidRequest, name)
	}
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/ssh-keys", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 3 || list.Data[0]["type"] != "ecdsa-sha2-nistp384" {
		t.Fatalf("list %v", list.Data)
	}
	id := list.Data[0]["id"].(string)
	e.req("DELETE", "/v1/ssh-keys/"+id, nil).must(t, 204)
	e.req("DELETE", "/v1/ssh-keys/"+id, nil).wantErr(t, 404, control.CodeNotFound, "id")
	e.req("GET", "/v1/ssh-keys/"+id, nil).wantErr(t, 404, control.CodeNotFound, "id")
}

func TestDeletingKeyRemovesItFromServers(t *testing.T) {
	e := newEnv(t, nil)
	n1, n2 := e.enroll(hwM4), e.enroll(hwM4)
	pubA, _ := newKey(t, "ed25519")
	pubB, _ := newKey(t, "ed25519")
	ka := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "a", "public_key": pubA}).must(t, 201))
	kb := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "b", "public_key": pubB}).must(t, 201))
	s1 := idOf(t, e.req("POST", "/v1/servers", serverBody("one", func(m map[string]any) { m["ssh_key_ids"] = []string{ka, kb} })).must(t, 201))
	s2 := idOf(t, e.req("POST", "/v1/servers", serverBody("two", func(m map[string]any) { m["ssh_key_ids"] = []string{kb} })).must(t, 201))
	revs := map[string]uint64{}
	for _, n := range []node{n1, n2} {
		d := converge(t, n, "192.0.2.1")
		revs[n.id] = d.Revision
	}
	// Both nodes wait for a change; deleting kb must wake both.
	type res struct {
		d   nodeapi.Desired
		err error
	}
	ch := make(chan res, 2)
	for _, n := range []node{n1, n2} {
		go func() {
			d, _, err := n.client.Desired(context.Background(), revs[n.id], 10*time.Second)
			ch <- res{d, err}
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "both polls to wait", func() bool { return control.LongPollsWaiting(e.srv) == 2 })
	start := time.Now()
	e.req("DELETE", "/v1/ssh-keys/"+kb, nil).must(t, 204)
	for range 2 {
		r := <-ch
		if r.err != nil {
			t.Fatal(r.err)
		}
		for _, k := range r.d.SSHKeys {
			if k.ID == kb {
				t.Fatalf("deleted key still desired on %s", r.d.Server.ID)
			}
		}
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("change reached the nodes after %v, want < 1s", el)
	}
	if ids := e.req("GET", "/v1/servers/"+s1, nil).obj(t)["ssh_key_ids"].([]any); len(ids) != 1 || ids[0] != ka {
		t.Fatalf("server one keys %v", ids)
	}
	if ids := e.req("GET", "/v1/servers/"+s2, nil).obj(t)["ssh_key_ids"].([]any); len(ids) != 0 {
		t.Fatalf("server two keys %v", ids)
	}
}

func TestFirewallRules(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("fw")).must(t, 201))
	d0 := converge(t, n, "192.0.2.9")
	base := "/v1/servers/" + sid + "/firewall-rules"

	// A change reaches a waiting node in under a second.
	type res struct {
		d   nodeapi.Desired
		err error
	}
	ch := make(chan res, 1)
	go func() {
		d, _, err := n.client.Desired(context.Background(), d0.Revision, 10*time.Second)
		ch <- res{d, err}
	}()
	testutil.WaitFor(t, 10*time.Second, "the poll to wait", func() bool { return control.LongPollsWaiting(e.srv) == 1 })
	start := time.Now()
	a := e.req("POST", base, map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "22",
		"source": "10.1.2.3", "action": "allow", "description": "ssh"}).must(t, 201)
	r := <-ch
	if el := time.Since(start); el > time.Second {
		t.Fatalf("rule reached the node after %v", el)
	}
	rule := a.obj(t)
	if !regexp.MustCompile(`^fw_[0-9A-Za-z]{24}$`).MatchString(rule["id"].(string)) || rule["server_id"] != sid ||
		rule["source"] != "10.1.2.3/32" || rule["destination"] != nil || rule["port_range"] != "22" {
		t.Fatalf("rule %s", a.body)
	}
	if r.err != nil || len(r.d.FirewallRules) != 1 || r.d.FirewallRules[0].Source != "10.1.2.3/32" || r.d.FirewallRules[0].ID != rule["id"] {
		t.Fatalf("desired rules %+v %v", r.d.FirewallRules, r.err)
	}
	// Later changes do not take a running server back to provisioning.
	if s := e.req("GET", "/v1/servers/"+sid, nil).obj(t)["status"]; s != "running" {
		t.Fatalf("status %v", s)
	}

	for _, c := range []struct {
		body  map[string]any
		param string
	}{
		{map[string]any{"direction": "sideways", "protocol": "tcp", "action": "allow"}, "direction"},
		{map[string]any{"direction": "inbound", "protocol": "sctp", "action": "allow"}, "protocol"},
		{map[string]any{"direction": "inbound", "protocol": "tcp", "action": "allow", "port_range": "0"}, "port_range"},
		{map[string]any{"direction": "inbound", "protocol": "tcp", "action": "allow", "source": "10.0.0.300"}, "source"},
		{map[string]any{"direction": "inbound", "protocol": "tcp", "action": "maybe"}, "action"},
		{map[string]any{"direction": "inbound", "protocol": "tcp", "action": "allow", "port_range": 22}, "port_range"},
		{map[string]any{"direction": "inbound", "protocol": "tcp", "action": "allow", "id": "fw_mine"}, "id"},
	} {
		e.req("POST", base, c.body).wantErr(t, 400, control.CodeInvalidRequest, c.param)
	}
	// Unknown servers are 404, whatever the body.
	e.req("POST", "/v1/servers/srv_AAAAAAAAAAAAAAAAAAAAAAAA/firewall-rules", map[string]any{"direction": "inbound"}).
		wantErr(t, 404, control.CodeNotFound, "server_id")
	e.req("GET", "/v1/servers/nope/firewall-rules", nil).wantErr(t, 404, control.CodeNotFound, "server_id")
	// An identical rule is a conflict.
	e.req("POST", base, map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "22",
		"source": "10.1.2.3/32", "action": "allow"}).wantErr(t, 409, control.CodeConflict, "")

	// Up to 100 rules, then 409.
	for i := 2; i <= control.MaxRulesPerServer; i++ {
		e.req("POST", base, map[string]any{"direction": "inbound", "protocol": "udp", "port_range": strconv.Itoa(1000 + i),
			"action": "allow"}).must(t, 201)
	}
	e.req("POST", base, map[string]any{"direction": "inbound", "protocol": "udp", "port_range": "9999", "action": "allow"}).
		wantErr(t, 409, control.CodeConflict, "server_id")

	rid := rule["id"].(string)
	e.req("GET", base+"/"+rid, nil).must(t, 200)
	e.req("DELETE", base+"/"+rid, nil).must(t, 204)
	e.req("DELETE", base+"/"+rid, nil).wantErr(t, 404, control.CodeNotFound, "rule_id")
	e.req("DELETE", base+"/fw_AAAAAAAAAAAAAAAAAAAAAAAA", nil).wantErr(t, 404, control.CodeNotFound, "rule_id")
	d, _, err := n.client.Desired(context.Background(), r.d.Revision, time.Second)
	if err != nil || len(d.FirewallRules) != control.MaxRulesPerServer-1 {
		t.Fatalf("desired has %d rules, %v", len(d.FirewallRules), err)
	}
	for _, fr := range d.FirewallRules {
		if fr.ID == rid {
			t.Fatal("deleted rule still desired")
		}
	}
	// A rule's ID under another server is not found there.
	e.enroll(hwM4)
	other := idOf(t, e.req("POST", "/v1/servers", serverBody("other")).must(t, 201))
	some := e.req("GET", base+"?limit=1", nil).must(t, 200)
	var page struct{ Data []map[string]any }
	some.decode(t, &page)
	e.req("GET", "/v1/servers/"+other+"/firewall-rules/"+page.Data[0]["id"].(string), nil).wantErr(t, 404, control.CodeNotFound, "rule_id")
}

func TestIdempotency(t *testing.T) {
	now := time.Now()
	var clockMu sync.Mutex
	e := newEnv(t, func(c *control.Config) {
		c.Now = func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now }
	})
	e.enroll(hwM4)
	e.enroll(hwM4)
	body := serverBody("idem")
	first := e.req("POST", "/v1/servers", body, "Idempotency-Key", "abc").must(t, 201)
	again := e.req("POST", "/v1/servers", body, "Idempotency-Key", "abc").must(t, 201)
	if string(first.body) != string(again.body) || again.hdr.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay differs:\n%s\n%s", first.body, again.body)
	}
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers", nil).decode(t, &list)
	if len(list.Data) != 1 {
		t.Fatalf("%d servers after replay, want 1", len(list.Data))
	}
	e.req("POST", "/v1/servers", serverBody("other"), "Idempotency-Key", "abc").
		wantErr(t, 409, control.CodeIdempotencyConflict, "Idempotency-Key")
	// Keys are per token.
	tok2, err := control.CreateAPIToken(e.st, "second", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e.reqAs(tok2.Token, "POST", "/v1/servers", serverBody("idem"), "Idempotency-Key", "abc").
		wantErr(t, 409, control.CodeConflict, "name")
	// Failures are not remembered: fix the request, retry with the same key.
	pub, _ := newKey(t, "ed25519")
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "", "public_key": pub}, "Idempotency-Key", "k2").
		wantErr(t, 400, control.CodeInvalidRequest, "name")
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "ok", "public_key": pub}, "Idempotency-Key", "k2").must(t, 201)
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "ok", "public_key": pub}, "Idempotency-Key", "k2").must(t, 201)
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "ok", "public_key": pub}, "Idempotency-Key", "bad key").
		wantErr(t, 400, control.CodeInvalidRequest, "Idempotency-Key")
	// Replays survive a restart.
	e.restart()
	again = e.req("POST", "/v1/servers", body, "Idempotency-Key", "abc").must(t, 201)
	if string(first.body) != string(again.body) {
		t.Fatal("replay after restart differs")
	}
	// After 24 h the key is purged and the request is new again (here: a
	// name conflict, proving it was executed).
	clockMu.Lock()
	now = now.Add(24*time.Hour + time.Minute)
	clockMu.Unlock()
	if err := e.srv.Sweep(); err != nil {
		t.Fatal(err)
	}
	left := 0
	_ = e.st.Scan("ctl/idem/", "", false, func(string, []byte) (bool, error) { left++; return true, nil })
	if left != 0 {
		t.Fatalf("%d idempotency records left after expiry", left)
	}
	e.req("POST", "/v1/servers", body, "Idempotency-Key", "abc").wantErr(t, 409, control.CodeConflict, "name")
}

func TestPagination(t *testing.T) {
	e := newEnv(t, nil)
	const total = 23
	want := map[string]bool{}
	var order []string
	for i := range total {
		pub, _ := newKey(t, "ed25519")
		id := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": fmt.Sprintf("k%d", i), "public_key": pub}).must(t, 201))
		want[id] = true
		order = append(order, id)
	}
	var def struct {
		Data []map[string]any
	}
	e.req("GET", "/v1/ssh-keys", nil).must(t, 200).decode(t, &def)
	if len(def.Data) != 20 {
		t.Fatalf("default page %d, want 20", len(def.Data))
	}
	var got []string
	cursor := ""
	pages := 0
	for {
		q := "/v1/ssh-keys?limit=5"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		// Adding a key mid-walk does not disturb it (it is newer than the cursor).
		if pages == 2 {
			pub, _ := newKey(t, "ed25519")
			e.req("POST", "/v1/ssh-keys", map[string]any{"name": "late", "public_key": pub}).must(t, 201)
		}
		var p struct {
			Data       []map[string]any
			HasMore    bool    `json:"has_more"`
			NextCursor *string `json:"next_cursor"`
		}
		e.req("GET", q, nil).must(t, 200).decode(t, &p)
		pages++
		for _, k := range p.Data {
			got = append(got, k["id"].(string))
		}
		if !p.HasMore {
			if p.NextCursor != nil {
				t.Fatal("next_cursor on the last page")
			}
			break
		}
		cursor = *p.NextCursor
	}
	if len(got) != total {
		t.Fatalf("walk saw %d keys, want %d", len(got), total)
	}
	for i, id := range got {
		if id != order[total-1-i] {
			t.Fatalf("item %d is %s, want %s (newest first)", i, id, order[total-1-i])
		}
	}
	for _, bad := range []string{"limit=0", "limit=101", "limit=-1", "limit=abc", "limit=1.5", "limit=", "cursor=zzz", "cursor=" + "AAAA", "limit=5&limit=6", "colour=red"} {
		a := e.req("GET", "/v1/ssh-keys?"+bad, nil)
		param := strings.SplitN(bad, "=", 2)[0]
		a.wantErr(t, 400, control.CodeInvalidRequest, param)
	}
	// A cursor from one list is not valid for another.
	var p struct {
		NextCursor *string `json:"next_cursor"`
	}
	e.req("GET", "/v1/ssh-keys?limit=1", nil).decode(t, &p)
	e.req("GET", "/v1/servers?cursor="+*p.NextCursor, nil).wantErr(t, 400, control.CodeInvalidRequest, "cursor")
	e.req("GET", "/v1/servers?status=sleeping", nil).wantErr(t, 400, control.CodeInvalidRequest, "status")
	e.req("GET", "/v1/servers?limit=100&status=running", nil).must(t, 200)
}

func TestServerPaginationWithStatus(t *testing.T) {
	e := newEnv(t, nil)
	var nodes []node
	for range 7 {
		nodes = append(nodes, e.enroll(hwM4))
	}
	for i := range 7 {
		e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("s%d", i))).must(t, 201)
	}
	// Nodes 0, 2, 4, 6 converge.
	for i := 0; i < 7; i += 2 {
		converge(t, nodes[i], "192.0.2.1")
	}
	seen := map[string]bool{}
	cursor := ""
	for {
		var p struct {
			Data       []map[string]any
			HasMore    bool    `json:"has_more"`
			NextCursor *string `json:"next_cursor"`
		}
		q := "/v1/servers?status=running&limit=3"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		e.req("GET", q, nil).must(t, 200).decode(t, &p)
		for _, s := range p.Data {
			if s["status"] != "running" || seen[s["id"].(string)] {
				t.Fatalf("unexpected %v", s)
			}
			seen[s["id"].(string)] = true
		}
		if !p.HasMore {
			break
		}
		cursor = *p.NextCursor
	}
	if len(seen) != 4 {
		t.Fatalf("%d running servers, want 4", len(seen))
	}
}

func TestRateLimit(t *testing.T) {
	e := newEnv(t, func(c *control.Config) { c.RateLimit = 0.5; c.RateBurst = 3 })
	for range 3 {
		e.req("GET", "/v1/servers", nil).must(t, 200)
	}
	a := e.req("GET", "/v1/servers", nil)
	a.wantErr(t, 429, control.CodeRateLimited, "")
	ra, err := strconv.Atoi(a.hdr.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 2 {
		t.Fatalf("Retry-After %q", a.hdr.Get("Retry-After"))
	}
	// Another token has its own bucket.
	tok2, err := control.CreateAPIToken(e.st, "second", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e.reqAs(tok2.Token, "GET", "/v1/servers", nil).must(t, 200)
}

func TestRestartKeepsEverything(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	pub, fp := newKey(t, "ed25519")
	kid := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "k", "public_key": pub}).must(t, 201))
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("persist", func(m map[string]any) { m["ssh_key_ids"] = []string{kid} })).must(t, 201))
	rid := idOf(t, e.req("POST", "/v1/servers/"+sid+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "443", "action": "allow"}).must(t, 201))
	d := converge(t, n, "192.0.2.44")
	before := e.req("GET", "/v1/servers/"+sid, nil).must(t, 200)

	e.restart()

	after := e.req("GET", "/v1/servers/"+sid, nil).must(t, 200)
	if string(before.body) != string(after.body) {
		t.Fatalf("server changed across restart:\n%s\n%s", before.body, after.body)
	}
	if k := e.req("GET", "/v1/ssh-keys/"+kid, nil).must(t, 200).obj(t); k["fingerprint"] != fp {
		t.Fatalf("key %v", k)
	}
	e.req("GET", "/v1/servers/"+sid+"/firewall-rules/"+rid, nil).must(t, 200)
	// The node's credential still works, and revisions keep increasing.
	c := nodeapi.NewClient(e.ts.URL, e.ts.Client())
	c.SetCredential(n.credential)
	d2, changed, err := c.Desired(context.Background(), d.Revision, 100*time.Millisecond)
	if err != nil || changed {
		t.Fatalf("desired after restart: %+v changed %v err %v", d2, changed, err)
	}
	e.req("DELETE", "/v1/servers/"+sid+"/firewall-rules/"+rid, nil).must(t, 204)
	d3, changed, err := c.Desired(context.Background(), d.Revision, time.Second)
	if err != nil || !changed || d3.Revision <= d.Revision || len(d3.FirewallRules) != 0 {
		t.Fatalf("desired after change: %+v %v %v", d3, changed, err)
	}
	// The node stays assigned: no second server fits.
	e.req("POST", "/v1/servers", serverBody("second")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
}

func TestEnrollment(t *testing.T) {
	e := newEnv(t, nil)
	c := nodeapi.NewClient(e.ts.URL, e.ts.Client())
	req := nodeapi.EnrollRequest{Hostname: "n1", Hardware: hwM4}
	if _, err := c.Enroll(context.Background(), "hce_bogus", req); !nodeapi.IsUnauthorized(err) {
		t.Fatalf("bogus token: %v", err)
	}
	once, err := control.CreateEnrollmentToken(e.st, 1, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	bad := req
	bad.Hardware.RAM = 0
	var apiErr *nodeapi.Error
	if _, err := c.Enroll(context.Background(), once.Token, bad); !errors.As(err, &apiErr) || apiErr.Status != 400 {
		t.Fatalf("bad hardware: %v", err)
	}
	if _, err := c.Enroll(context.Background(), once.Token, req); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Enroll(context.Background(), once.Token, req); !nodeapi.IsUnauthorized(err) {
		t.Fatalf("reused single-use token: %v", err)
	}
	multi, _ := control.CreateEnrollmentToken(e.st, 2, time.Hour, time.Now())
	for i := range 3 {
		_, err := c.Enroll(context.Background(), multi.Token, req)
		if (i < 2) != (err == nil) {
			t.Fatalf("multi-use enrollment %d: %v", i, err)
		}
	}
	expired, _ := control.CreateEnrollmentToken(e.st, 1, time.Millisecond, time.Now().Add(-time.Second))
	if _, err := c.Enroll(context.Background(), expired.Token, req); !nodeapi.IsUnauthorized(err) {
		t.Fatalf("expired token: %v", err)
	}
	nodes, err := control.ListNodes(e.st)
	if err != nil || len(nodes) != 3 {
		t.Fatalf("nodes %v %v", nodes, err)
	}
	// Node endpoints refuse API tokens and bogus credentials.
	e.req("GET", "/v1/nodes/self/desired", nil).wantErr(t, 401, control.CodeUnauthorized, "")
	e.reqAs("hcn_nope", "POST", "/v1/nodes/self/observed", map[string]any{}).wantErr(t, 401, control.CodeUnauthorized, "")
}

func TestNodeProtocolOverHTTP(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	cred := n.credential
	// The long-poll answers 204 when nothing changes, and validates input.
	d, _, _ := n.client.Desired(context.Background(), 0, time.Second)
	a := e.reqAs(cred, "GET", "/v1/nodes/self/desired?after="+strconv.FormatUint(d.Revision, 10)+"&wait=0.05", nil)
	a.must(t, 204)
	e.reqAs(cred, "GET", "/v1/nodes/self/desired?after=-1", nil).wantErr(t, 400, control.CodeInvalidRequest, "after")
	e.reqAs(cred, "GET", "/v1/nodes/self/desired?wait=x", nil).wantErr(t, 400, control.CodeInvalidRequest, "wait")
	e.reqAs(cred, "GET", "/v1/nodes/self/desired", nil).must(t, 200)
	e.reqAs(cred, "POST", "/v1/nodes/self/observed", map[string]any{"revision": "x"}).wantErr(t, 400, control.CodeInvalidRequest, "revision")
	e.reqAs(cred, "POST", "/v1/nodes/self/observed", map[string]any{"ip": "not-an-ip"}).wantErr(t, 400, control.CodeInvalidRequest, "ip")
	e.reqAs(cred, "POST", "/v1/nodes/self/observed", map[string]any{"revision": 1, "runtime_healthy": true, "firewall_revision": 1, "ssh_keys_revision": 1, "wiped": false}).must(t, 204)
	nodes, _ := control.ListNodes(e.st)
	if len(nodes) != 1 || nodes[0].Observed == nil || nodes[0].LastSeen.IsZero() {
		t.Fatalf("node record %+v", nodes)
	}
	// A poll in progress ends when the client goes away.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := n.client.Desired(ctx, d.Revision, 0); err == nil {
		t.Fatal("cancelled poll returned no error")
	}
}

// Errors repeat at most a bounded piece of what was sent: a huge unknown
// field, name, key or query parameter never comes back whole.
func TestErrorsDoNotEchoUnboundedInput(t *testing.T) {
	e := newEnv(t, nil)
	huge := strings.Repeat("é", 100<<10)
	for name, req := range map[string][2]string{
		"unknown field": {"/v1/ssh-keys", `{"` + huge + `":1}`},
		"server name":   {"/v1/servers", `{"name":"` + huge + `","chip":"cpu","ram":4,"storage":20}`},
		"ssh key":       {"/v1/ssh-keys", `{"name":"k","public_key":"` + huge + `"}`},
		"query":         {"/v1/servers?" + strings.Repeat("x", 4000) + "=1", ""},
	} {
		t.Run(name, func(t *testing.T) {
			method := "POST"
			if req[1] == "" {
				method = "GET"
			}
			a := e.req(method, req[0], req[1], "Idempotency-Key", name)
			if a.status/100 != 4 || a.status == 413 || len(a.body) > 2048 {
				t.Fatalf("status %d, %d bytes: %.300s", a.status, len(a.body), a.body)
			}
		})
	}
}

// A node's report is not trusted blindly: a revision never issued to the
// node is refused and moves nothing, and its error texts are bounded.
func TestForgedReportsAreRefusedAndBounded(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("web-1")).must(t, 201))
	d, _, err := n.client.Desired(context.Background(), 0, time.Second)
	if err != nil || d.Server == nil {
		t.Fatalf("desired %+v, %v", d, err)
	}
	for _, forge := range []func(*nodeapi.Observed){
		func(o *nodeapi.Observed) { o.Revision = 1e18 },
		func(o *nodeapi.Observed) { o.FirewallRevision = d.Revision + 1 },
		func(o *nodeapi.Observed) { o.RuntimeRevision = 1 << 62 },
		func(o *nodeapi.Observed) { o.Usage = make([]nodeapi.KeyUsage, 10000) },
	} {
		report := applied(d, "203.0.113.45")
		forge(&report)
		if err := n.client.ReportObserved(context.Background(), report); err == nil {
			t.Fatalf("forged report %+v accepted", report)
		}
		if got := e.req("GET", "/v1/servers/"+id, nil).must(t, 200).obj(t); got["status"] != "provisioning" || got["ip"] != nil {
			t.Fatalf("a refused report changed the server: %v", got)
		}
	}
	report := applied(d, "203.0.113.45")
	report.FirewallError = strings.Repeat("x", 900<<10)
	if err := n.client.ReportObserved(context.Background(), report); err != nil {
		t.Fatal(err)
	}
	a := e.req("GET", "/v1/servers/"+id, nil).must(t, 200)
	if len(a.body) > 4096 || !strings.Contains(string(a.body), "xxx…") {
		t.Fatalf("server answer of %d bytes after a 900 KB error", len(a.body))
	}
	// A capability of 100 KB is cut; a pull's progress below zero, or
	// past its total, is brought back within it.
	report = applied(d, "203.0.113.45")
	report.RuntimeCapabilities = []string{"completion", strings.Repeat("c", 100<<10)}
	report.RuntimeProgress = &nodeapi.PullProgress{Status: "pulling", Completed: -5, Total: -1}
	if err := n.client.ReportObserved(context.Background(), report); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Enforcement struct {
			Runtime struct {
				Capabilities []string
				Progress     struct{ Completed, Total int64 }
			}
		}
	}
	a = e.req("GET", "/v1/servers/"+id, nil).must(t, 200)
	a.decode(t, &v)
	rt := v.Enforcement.Runtime
	if len(a.body) > 4096 || len(rt.Capabilities) != 2 || len(rt.Capabilities[1]) > 100 || rt.Progress.Completed != 0 || rt.Progress.Total != 0 {
		t.Fatalf("server answer of %d bytes after a 100 KB capability and negative progress: %+v", len(a.body), rt)
	}
	report.RuntimeProgress = &nodeapi.PullProgress{Status: "pulling", Completed: 1 << 40, Total: 1 << 20}
	if err := n.client.ReportObserved(context.Background(), report); err != nil {
		t.Fatal(err)
	}
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &v)
	if p := v.Enforcement.Runtime.Progress; p.Completed != 1<<20 || p.Total != 1<<20 {
		t.Fatalf("progress past its total shown as %+v", p)
	}
	if l := e.req("GET", "/v1/servers", nil).must(t, 200); len(l.body) > 4096 {
		t.Fatalf("list of %d bytes after a 900 KB error", len(l.body))
	}
}

// A node that reports too fast is throttled with 429 and Retry-After (its
// own bucket: other nodes and the management API are not affected), and is
// let in again once its bucket refills.
func TestNodeReportFloodIsThrottled(t *testing.T) {
	e, clk := newClockEnv(t, func(c *control.Config) { c.NodeRateLimit, c.NodeRateBurst = 1, 3 })
	flood, other := e.enroll(hwM4), e.enroll(hwM4)
	report := nodeapi.Observed{RuntimeHealthy: true}
	for i := range 3 {
		if err := flood.client.ReportObserved(context.Background(), report); err != nil {
			t.Fatalf("report %d within the burst: %v", i, err)
		}
	}
	err := flood.client.ReportObserved(context.Background(), report)
	var ne *nodeapi.Error
	if !errors.As(err, &ne) || ne.Status != 429 || ne.Code != control.CodeRateLimited {
		t.Fatalf("report over the burst: %v", err)
	}
	if err := other.client.ReportObserved(context.Background(), report); err != nil {
		t.Fatalf("another node was throttled too: %v", err)
	}
	e.req("GET", "/v1/servers", nil).must(t, 200)
	clk.add(time.Second)
	if err := flood.client.ReportObserved(context.Background(), report); err != nil {
		t.Fatalf("after the bucket refilled: %v", err)
	}
}

// A cursor is followed only if this list issued it: a well-formed cursor
// for an item that was never the end of a page, a tampered one, and one
// from another list are refused with 400; an issued one survives a restart.
func TestCursorsAreOnlyThoseIssued(t *testing.T) {
	e := newEnv(t, nil)
	for i := range 3 {
		pub, _ := newKey(t, "ed25519")
		e.req("POST", "/v1/ssh-keys", map[string]any{"name": fmt.Sprintf("k%d", i), "public_key": pub}).must(t, 201)
	}
	var p struct {
		NextCursor *string `json:"next_cursor"`
	}
	e.req("GET", "/v1/ssh-keys?limit=1", nil).must(t, 200).decode(t, &p)
	if p.NextCursor == nil {
		t.Fatal("no cursor")
	}
	good := *p.NextCursor
	sealed, _ := base64.RawURLEncoding.DecodeString(good)
	changed := []byte(string(sealed))
	changed[len(changed)/2] ^= 1
	for name, c := range map[string]string{
		"changed":    base64.RawURLEncoding.EncodeToString(changed),
		"truncated":  base64.RawURLEncoding.EncodeToString(sealed[:len(sealed)-1]),
		"short":      base64.RawURLEncoding.EncodeToString(sealed[:8]),
		"not base64": good + "!",
		"made up":    base64.RawURLEncoding.EncodeToString([]byte("00000000000000000001/sk_000000000000000000000000")),
		"old form":   base64.RawURLEncoding.EncodeToString([]byte("00000000000000000001/sk_000000000000000000000000")) + "." + base64.RawURLEncoding.EncodeToString(make([]byte, 16)),
		"empty":      "",
	} {
		t.Run(name, func(t *testing.T) {
			e.req("GET", "/v1/ssh-keys?limit=1&cursor="+c, nil).wantErr(t, 400, control.CodeInvalidRequest, "cursor")
		})
	}
	e.req("GET", "/v1/servers?limit=1&cursor="+good, nil).wantErr(t, 400, control.CodeInvalidRequest, "cursor")
	e.restart()
	e.req("GET", "/v1/ssh-keys?limit=1&cursor="+good, nil).must(t, 200)
}

// Names and descriptions people read elsewhere may not hide characters:
// bidi overrides and other invisible formatting characters are refused
// like control characters, and so are characters drawn as nothing (the
// Hangul fillers, the blank Braille pattern) and a lone joiner.
func TestInvisibleCharactersAreRefused(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	pub, _ := newKey(t, "ed25519")
	for _, name := range []string{"admin\u202Egnp.exe", "a\u2066b\u2069", "zero\u200bwidth", "x\u0085",
		"\u3164", "\u2800", "\u115f", "admin\u3164", "\u200d", "\ufe0f"} {
		e.req("POST", "/v1/ssh-keys", map[string]any{"name": name, "public_key": pub}).wantErr(t, 400, control.CodeInvalidRequest, "name")
	}
	srv := idOf(t, e.req("POST", "/v1/servers", serverBody("web-1")).must(t, 201))
	rule := func(desc string) map[string]any {
		return map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "22", "source": "10.1.2.3",
			"action": "allow", "description": desc}
	}
	e.req("POST", "/v1/servers/"+srv+"/firewall-rules", rule("allow \u202Eevil")).wantErr(t, 400, control.CodeInvalidRequest, "description")
	e.req("POST", "/v1/servers/"+srv+"/firewall-rules", rule("\u3164")).wantErr(t, 400, control.CodeInvalidRequest, "description")
	e.req("POST", "/v1/servers/"+srv+"/firewall-rules", rule("ssh ✓")).must(t, 201)
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "👩‍💻 laptop", "public_key": pub}).must(t, 201)
}

// TestRolledBackStateReachesTheNode: a node that asks for changes after a
// revision the control plane has not reached (its state was restored from
// an older backup) gets the state in force at once, not a wait.
func TestRolledBackStateReachesTheNode(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	d := n.desired(t, 0)
	// A poll that waited out its time would answer 204 (changed false).
	got, changed, err := n.client.Desired(context.Background(), d.Revision+50, 20*time.Second)
	if err != nil || !changed || got.Revision != d.Revision {
		t.Fatalf("after a revision ahead of the control plane: %+v changed %v err %v", got, changed, err)
	}
	// At the current revision it waits as before.
	if _, changed, err := n.client.Desired(context.Background(), d.Revision, 50*time.Millisecond); err != nil || changed {
		t.Fatalf("at the current revision: changed %v err %v", changed, err)
	}
}

// Field names are matched exactly however they are spelled in the body:
// an escape that spells a field's own name is that field, while one that
// spells another case, or a Unicode fold of a letter (the Kelvin sign for
// k), is an unknown field.
func TestFieldNamesMatchExactly(t *testing.T) {
	e := newEnv(t, nil)
	for name, c := range map[string]struct {
		body   func(pub string) string
		status int
		param  string
	}{
		"escaped, same name":  {func(p string) string { return `{"\u006eame":"k1","public_key":"` + p + `"}` }, 201, ""},
		"escaped, other case": {func(p string) string { return `{"\u004eame":"k2","public_key":"` + p + `"}` }, 400, "Name"},
		"Kelvin sign":         {func(p string) string { return `{"name":"k3","public_` + "\u212a" + `ey":"` + p + `"}` }, 400, "public_\u212aey"},
		"escaped Kelvin sign": {func(p string) string { return `{"name":"k4","public_\u212aey":"` + p + `"}` }, 400, "public_\u212aey"},
		"uppercase":           {func(p string) string { return `{"NAME":"k5","public_key":"` + p + `"}` }, 400, "NAME"},
	} {
		t.Run(name, func(t *testing.T) {
			pub, _ := newKey(t, "ed25519")
			a := e.req("POST", "/v1/ssh-keys", c.body(pub))
			if c.status == 201 {
				a.must(t, 201)
				return
			}
			a.wantErr(t, c.status, control.CodeInvalidRequest, c.param)
		})
	}
}
