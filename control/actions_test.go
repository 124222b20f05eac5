package control_test

import (
	"context"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
)

type actionView struct {
	ID         string  `json:"id"`
	Command    string  `json:"command"`
	Status     string  `json:"status"`
	Progress   int     `json:"progress"`
	StartedAt  string  `json:"started_at"`
	FinishedAt *string `json:"finished_at"`
	Error      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
	Resources []struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"resources"`
}

func (e *env) action(t *testing.T, id string) actionView {
	t.Helper()
	var a actionView
	e.req("GET", "/v1/actions/"+id, nil).must(t, 200).decode(t, &a)
	return a
}

// startedBy is the action an answer names, in its body (field) and its
// X-Action-Id header alike.
func startedBy(t *testing.T, a answer, field string) actionView {
	t.Helper()
	var act actionView
	if field != "" {
		var body map[string]any
		a.decode(t, &body)
		raw, _ := body[field].(map[string]any)
		if raw == nil {
			t.Fatalf("no %s in %s", field, a.body)
		}
		b := mustJSON(t, raw)
		answer{body: []byte(b)}.decode(t, &act)
	}
	ids := a.hdr.Values("X-Action-Id")
	if len(ids) != 1 || (field != "" && ids[0] != act.ID) {
		t.Fatalf("X-Action-Id %v, body's action %q", ids, act.ID)
	}
	act.ID = ids[0]
	return act
}

func wantAction(t *testing.T, a actionView, command, status string, resources ...string) {
	t.Helper()
	var got []string
	for _, r := range a.Resources {
		got = append(got, r.Type+":"+r.ID)
	}
	if a.Command != command || a.Status != status || !slices.Equal(got, resources) ||
		(status == "running") != (a.FinishedAt == nil) || (status == "error") != (a.Error != nil) {
		t.Fatalf("action %+v, want %s %s on %v", a, command, status, resources)
	}
	if status == "success" && a.Progress != 100 {
		t.Fatalf("a successful action at %d%%", a.Progress)
	}
}

// TestActions: every change to a server is an action, running until its
// node has done it: a create shows the model pull's progress and succeeds
// once the server runs; a key's or rule's change once the node applied
// its revision, or fails with the node's error; a model change replaced
// by another is superseded; a deletion succeeds with the wipe and takes
// the server's other actions down with it.
func TestActions(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	created := e.req("POST", "/v1/servers", serverBody("acting")).must(t, 201)
	sid := idOf(t, created)
	create := startedBy(t, created, "action")
	wantAction(t, create, "create", "running", "server:"+sid)

	d := n.desired(t, 0)
	o := applied(d, "192.0.2.100")
	o.RuntimeRevision, o.RuntimeModel = 0, ""
	o.RuntimeProgress = &nodeapi.PullProgress{Status: "pulling", Completed: 30, Total: 60}
	n.report(t, o)
	if a := e.action(t, create.ID); a.Status != "running" || a.Progress != 50 {
		t.Fatalf("during the pull: %+v", a)
	}
	n.report(t, applied(d, "192.0.2.100"))
	wantAction(t, e.action(t, create.ID), "create", "success", "server:"+sid)

	// An API key: success once the node applied its revision.
	k := e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "k"}).must(t, 201)
	kid := idOf(t, k)
	keyAct := startedBy(t, k, "action")
	wantAction(t, keyAct, "api_key_create", "running", "server:"+sid, "api_key:"+kid)
	d = n.desired(t, d.Revision)
	o = applied(d, "192.0.2.100")
	o.APIKeysRevision = d.Revision - 1
	n.report(t, o)
	wantAction(t, e.action(t, keyAct.ID), "api_key_create", "running", "server:"+sid, "api_key:"+kid)
	n.report(t, applied(d, "192.0.2.100"))
	wantAction(t, e.action(t, keyAct.ID), "api_key_create", "success", "server:"+sid, "api_key:"+kid)

	// A rule the node cannot apply: the action fails with its error.
	r := e.req("POST", "/v1/servers/"+sid+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "source": "10.0.0.0/8", "action": "allow"}).must(t, 201)
	if v, _ := r.obj(t)["action"].(string); v != "allow" {
		t.Fatalf("the rule's own action is %q", v)
	}
	ruleAct := startedBy(t, r, "started_action")
	d = n.desired(t, d.Revision)
	o = applied(d, "192.0.2.100")
	o.FirewallRevision, o.FirewallError = d.Revision-1, "nft: table busy"
	n.report(t, o)
	a := e.action(t, ruleAct.ID)
	wantAction(t, a, "firewall_rule_add", "error", "server:"+sid, "firewall_rule:"+idOf(t, r))
	if a.Error.Code != "apply_failed" || a.Error.Message != "nft: table busy" {
		t.Fatalf("error %+v", a.Error)
	}

	// Two model changes: the first is superseded, the second succeeds once
	// the new model is served.
	m1 := startedBy(t, e.req("PATCH", "/v1/servers/"+sid, map[string]any{"model": "m1"}).must(t, 200), "action")
	m2 := startedBy(t, e.req("PATCH", "/v1/servers/"+sid, map[string]any{"model": "m2", "name": "acted"}).must(t, 200), "action")
	if a := e.action(t, m1.ID); a.Status != "error" || a.Error.Code != "superseded" {
		t.Fatalf("the first model change %+v", a)
	}
	wantAction(t, m2, "update_model", "running", "server:"+sid)
	if unchanged := e.req("PATCH", "/v1/servers/"+sid, map[string]any{"model": "m2"}).must(t, 200); unchanged.obj(t)["action"] != nil ||
		len(unchanged.hdr.Values("X-Action-Id")) != 0 {
		t.Fatalf("a PATCH that changed nothing started an action: %s", unchanged.body)
	}
	d = n.desired(t, d.Revision)
	n.report(t, applied(d, "192.0.2.100"))
	wantAction(t, e.action(t, m2.ID), "update_model", "success", "server:"+sid)
	rename := startedBy(t, e.req("PATCH", "/v1/servers/"+sid, map[string]any{"name": "acting"}).must(t, 200), "action")
	wantAction(t, rename, "rename", "running", "server:"+sid)

	// The deletion: a 204 names its action in X-Action-Id; the rename the
	// node never applied fails with the server.
	del := startedBy(t, e.req("DELETE", "/v1/servers/"+sid, nil).must(t, 204), "")
	wantAction(t, e.action(t, del.ID), "delete", "running", "server:"+sid)
	d = n.desired(t, d.Revision)
	n.report(t, applied(d, ""))
	wantAction(t, e.action(t, del.ID), "delete", "success", "server:"+sid)
	if a := e.action(t, rename.ID); a.Status != "error" || a.Error.Code != "server_deleted" {
		t.Fatalf("the rename of a deleted server %+v", a)
	}

	// The project's list keeps them all, newest first; by status.
	var list struct {
		Data    []actionView
		HasMore bool `json:"has_more"`
	}
	e.req("GET", "/v1/actions?limit=100", nil).must(t, 200).decode(t, &list)
	var cmds []string
	for _, a := range list.Data {
		cmds = append(cmds, a.Command)
	}
	if want := []string{"delete", "rename", "update_model", "update_model", "firewall_rule_add", "api_key_create", "create"}; !slices.Equal(cmds, want) {
		t.Fatalf("actions %v, want %v", cmds, want)
	}
	e.req("GET", "/v1/actions?status=error", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 3 {
		t.Fatalf("%d failed actions, want 3", len(list.Data))
	}
	e.req("GET", "/v1/actions?status=running", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 0 {
		t.Fatalf("running actions left: %+v", list.Data)
	}
	// The server is gone: its own list is a 404, the actions stay readable.
	e.req("GET", "/v1/servers/"+sid+"/actions", nil).wantErr(t, 404, "not_found", "id")
}

// TestActionLists: a server's actions page by page; another project's
// action or server is a 404; bad parameters are 400s.
func TestActionLists(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("listed")).must(t, 201))
	for i := range 3 {
		e.req("POST", "/v1/servers/"+sid+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
			"port_range": []string{"1", "2", "3"}[i], "action": "allow"}).must(t, 201)
	}
	var seen []string
	cursor := ""
	for {
		q := url.Values{"limit": {"2"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page struct {
			Data       []actionView
			NextCursor *string `json:"next_cursor"`
		}
		e.req("GET", "/v1/servers/"+sid+"/actions?"+q.Encode(), nil).must(t, 200).decode(t, &page)
		for _, a := range page.Data {
			seen = append(seen, a.Command)
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if want := []string{"firewall_rule_add", "firewall_rule_add", "firewall_rule_add", "create"}; !slices.Equal(seen, want) {
		t.Fatalf("pages %v, want %v", seen, want)
	}
	// The project's list is in the order the changes were made, across
	// servers whose nodes each count their own revisions.
	e.enroll(hwM4)
	second := idOf(t, e.req("POST", "/v1/servers", serverBody("second")).must(t, 201))
	e.req("POST", "/v1/servers/"+second+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "icmp",
		"action": "allow"}).must(t, 201)
	var project struct{ Data []actionView }
	e.req("GET", "/v1/actions", nil).must(t, 200).decode(t, &project)
	var order []string
	for _, a := range project.Data {
		order = append(order, a.Command+" "+a.Resources[0].ID)
	}
	if want := []string{"firewall_rule_add " + second, "create " + second, "firewall_rule_add " + sid, "firewall_rule_add " + sid,
		"firewall_rule_add " + sid, "create " + sid}; !slices.Equal(order, want) {
		t.Fatalf("the project's actions %v, want %v", order, want)
	}
	var all struct{ Data []actionView }
	e.req("GET", "/v1/actions?status=running", nil).must(t, 200).decode(t, &all)
	_, other := e.project("elsewhere", false)
	e.reqAs(other, "GET", "/v1/actions/"+all.Data[0].ID, nil).wantErr(t, 404, "not_found", "id")
	e.reqAs(other, "GET", "/v1/servers/"+sid+"/actions", nil).wantErr(t, 404, "not_found", "id")
	var none struct{ Data []actionView }
	e.reqAs(other, "GET", "/v1/actions", nil).must(t, 200).decode(t, &none)
	if len(none.Data) != 0 {
		t.Fatalf("another project lists %+v", none.Data)
	}
	e.req("GET", "/v1/actions?status=done", nil).wantErr(t, 400, "invalid_request", "status")
	e.req("GET", "/v1/actions?cursor=abc", nil).wantErr(t, 400, "invalid_request", "cursor")
	e.req("GET", "/v1/servers/"+sid+"/actions?status=running", nil).wantErr(t, 400, "invalid_request", "status")
	e.req("GET", "/v1/actions/act_nope", nil).wantErr(t, 404, "not_found", "id")
}

// TestActionTimeouts: an action the node does not do within the provision
// timeout fails; a create fails with its server.
func TestActionTimeouts(t *testing.T) {
	e, clk := newClockEnv(t, func(c *control.Config) { c.ProvisionTimeout = time.Minute })
	n := e.enroll(hwM4)
	created := e.req("POST", "/v1/servers", serverBody("slow")).must(t, 201)
	sid := idOf(t, created)
	create := startedBy(t, created, "action")
	d := n.desired(t, 0)
	o := applied(d, "192.0.2.101")
	o.RuntimeHealthy, o.RuntimeError = false, "out of memory"
	n.report(t, o)
	rule := startedBy(t, e.req("POST", "/v1/servers/"+sid+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "udp", "action": "deny"}).must(t, 201), "started_action")
	clk.add(2 * time.Minute)
	_ = n.client.ReportObserved(context.Background(), o) // heard from: not unreachable
	e.sweep()
	a := e.action(t, create.ID)
	if a.Status != "error" || a.Error.Code != "timeout" || !containsPart(a.Error.Message, "out of memory") {
		t.Fatalf("create %+v", a)
	}
	if a := e.action(t, rule.ID); a.Status != "error" || a.Error.Code != "timeout" {
		t.Fatalf("rule %+v", a)
	}
	e.wantStatus(t, sid, "failed", "after the timeout")
}

// TestSSHKeyDeleteActions: deleting an SSH key is an action on every
// server that listed it.
func TestSSHKeyDeleteActions(t *testing.T) {
	e := newEnv(t, nil)
	e.enroll(hwM4)
	e.enroll(hwM4)
	pub, _ := newKey(t, "ed25519")
	kid := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "me", "public_key": pub}).must(t, 201))
	with := func(m map[string]any) { m["ssh_key_ids"] = []string{kid} }
	s1 := idOf(t, e.req("POST", "/v1/servers", serverBody("one", with)).must(t, 201))
	s2 := idOf(t, e.req("POST", "/v1/servers", serverBody("two", with)).must(t, 201))
	del := e.req("DELETE", "/v1/ssh-keys/"+kid, nil).must(t, 204)
	ids := del.hdr.Values("X-Action-Id")
	if len(ids) != 2 {
		t.Fatalf("X-Action-Id %v, want one per server", ids)
	}
	var servers []string
	for _, id := range ids {
		a := e.action(t, id)
		if a.Command != "ssh_keys_update" || a.Status != "running" || len(a.Resources) != 2 || a.Resources[1].ID != kid {
			t.Fatalf("action %+v", a)
		}
		servers = append(servers, a.Resources[0].ID)
	}
	slices.Sort(servers)
	want := []string{s1, s2}
	slices.Sort(want)
	if !slices.Equal(servers, want) {
		t.Fatalf("actions on %v, want %v", servers, want)
	}
}
