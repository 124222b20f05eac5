package control_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
)

type runtimeView struct {
	Status          string  `json:"status"`
	Healthy         bool    `json:"healthy"`
	Model           *string `json:"model"`
	AppliedRevision *uint64 `json:"applied_revision"`
	Error           *string `json:"error"`
	Progress        *struct {
		Status    string `json:"status"`
		Completed int64  `json:"completed"`
		Total     int64  `json:"total"`
	} `json:"progress"`
}

// TestProvisioningWaitsForTheModel: a deployment turns running only once
// its node serves the ordered model at the current revision, and
// enforcement.runtime shows the way there: the pull's progress, an error,
// the model served.
func TestProvisioningWaitsForTheModel(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("model-b", func(m map[string]any) { m["model"] = "model-b" })).must(t, 201))
	d := n.desired(t, 0)
	if d.Model != "model-b" || d.Server.Model != "model-b" || d.APIKeys == nil || len(d.APIKeys) != 0 {
		t.Fatalf("desired %+v", d)
	}
	v := e.enforcementOf(t, id)
	if rt := v.Enforcement.Runtime; rt.Status != "pending" || rt.Model != nil || rt.Progress != nil || rt.AppliedRevision != nil {
		t.Fatalf("before any report: %+v", rt)
	}

	// Everything applied, the runtime healthy, but still serving the
	// node's previous model while pulling the ordered one.
	o := applied(d, "192.0.2.10")
	o.RuntimeRevision, o.RuntimeModel = 0, "hearth-tiny"
	o.RuntimeProgress = &nodeapi.PullProgress{Status: "pulling sha256:abc", Completed: 1 << 20, Total: 4 << 20}
	n.report(t, o)
	v = e.enforcementOf(t, id)
	rt := v.Enforcement.Runtime
	if v.Status != "provisioning" || rt.Status != "pending" || str(rt.Model) != "hearth-tiny" || rt.Progress == nil ||
		rt.Progress.Status != "pulling sha256:abc" || rt.Progress.Completed != 1<<20 || rt.Progress.Total != 4<<20 {
		t.Fatalf("while pulling: %s %+v", v.Status, rt)
	}
	// The right model at an older revision, or the revision without the
	// model, is not enough either.
	o = applied(d, "")
	o.RuntimeRevision = d.Revision - 1
	n.report(t, o)
	e.wantStatus(t, id, "provisioning", "model at an older revision")
	o = applied(d, "")
	o.RuntimeModel = "hearth-tiny"
	n.report(t, o)
	e.wantStatus(t, id, "provisioning", "another model at the revision")
	// API keys not applied, or failed: not running.
	o = applied(d, "")
	o.APIKeysRevision, o.APIKeysError = 0, "keyring: disk full"
	n.report(t, o)
	v = e.enforcementOf(t, id)
	if v.Status != "provisioning" || v.Enforcement.APIKeys.Status != "failed" || str(v.Enforcement.APIKeys.Error) != "keyring: disk full" {
		t.Fatalf("API keys failed: %+v", v)
	}
	// A pull that fails: the error shows, and the provision timeout fails
	// the server.
	o = applied(d, "")
	o.RuntimeRevision, o.RuntimeModel, o.RuntimeError = 0, "", `pull model-b: file does not exist`
	n.report(t, o)
	v = e.enforcementOf(t, id)
	if v.Enforcement.Runtime.Status != "failed" || str(v.Enforcement.Runtime.Error) != "pull model-b: file does not exist" {
		t.Fatalf("pull failed: %+v", v.Enforcement.Runtime)
	}
	clk.add(10*time.Minute - time.Second)
	n.report(t, o) // the node is alive, just failing
	e.sweep()
	e.wantStatus(t, id, "provisioning", "before the provision timeout")
	clk.add(time.Second)
	e.sweep()
	e.wantStatus(t, id, "failed", "at the provision timeout")
	// The node keeps retrying; once it serves the model the server runs.
	n.report(t, applied(d, ""))
	v = e.enforcementOf(t, id)
	rt = v.Enforcement.Runtime
	if v.Status != "running" || rt.Status != "applied" || str(rt.Model) != "model-b" || rev(rt.AppliedRevision) != int64(v.Enforcement.DesiredRevision) ||
		rt.Error != nil || rt.Progress != nil || !rt.Healthy {
		t.Fatalf("converged: %s %+v", v.Status, rt)
	}
}

// TestPatchModel: running → updating → running, with nothing else about
// the server changed, and updating → failed at the provision timeout,
// counted from the PATCH.
func TestPatchModel(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	pub, _ := newKey(t, "ed25519")
	kid := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "me", "public_key": pub}).must(t, 201))
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("switch", func(m map[string]any) {
		m["model"], m["ssh_key_ids"] = "model-a", []string{kid}
	})).must(t, 201))
	d := n.desired(t, 0)
	n.report(t, applied(d, "192.0.2.20"))
	before := e.req("GET", "/v1/servers/"+id, nil).must(t, 200).obj(t)
	if before["status"] != "running" {
		t.Fatalf("status %v", before["status"])
	}

	clk.add(time.Minute)
	a := e.req("PATCH", "/v1/servers/"+id, map[string]any{"model": "model-b"}).must(t, 200)
	after := a.obj(t)
	if after["status"] != "updating" || after["model"] != "model-b" {
		t.Fatalf("PATCH answer %s", a.body)
	}
	for _, f := range []string{"id", "name", "chip", "ram", "storage", "stack", "billing", "ip", "created_at", "deployment_url"} {
		if fmt.Sprint(after[f]) != fmt.Sprint(before[f]) {
			t.Errorf("%s changed from %v to %v", f, before[f], after[f])
		}
	}
	if fmt.Sprint(after["ssh_key_ids"]) != fmt.Sprint(before["ssh_key_ids"]) || after["updated_at"] == before["updated_at"] {
		t.Errorf("ssh_key_ids %v → %v, updated_at %v → %v", before["ssh_key_ids"], after["ssh_key_ids"], before["updated_at"], after["updated_at"])
	}
	d2 := n.desired(t, d.Revision)
	if d2.Model != "model-b" || d2.Server.Model != "model-b" || len(d2.SSHKeys) != 1 || d2.Wipe {
		t.Fatalf("desired after PATCH %+v", d2)
	}
	// Rules and keys applied at once, the old model still served: updating.
	o := applied(d2, "")
	o.RuntimeRevision, o.RuntimeModel = d.Revision, "model-a"
	n.report(t, o)
	v := e.enforcementOf(t, id)
	if v.Status != "updating" || v.Enforcement.Runtime.Status != "pending" || str(v.Enforcement.Runtime.Model) != "model-a" {
		t.Fatalf("switching: %+v", v)
	}
	// The same model again changes nothing: no new revision.
	same := e.req("PATCH", "/v1/servers/"+id, map[string]any{"model": "model-b"}).must(t, 200).obj(t)
	if same["status"] != "updating" {
		t.Fatalf("same model: %v", same["status"])
	}
	if _, changed, _ := n.client.Desired(context.Background(), d2.Revision, 10*time.Millisecond); changed {
		t.Fatal("a PATCH to the current model gave a new revision")
	}
	n.report(t, applied(d2, ""))
	e.wantStatus(t, id, "running", "new model served")

	// Another switch that never completes fails after the provision
	// timeout from the PATCH, not from the creation.
	e.req("PATCH", "/v1/servers/"+id, map[string]any{"model": "model-c"}).must(t, 200)
	d3 := n.desired(t, d2.Revision)
	o = applied(d3, "")
	o.RuntimeRevision, o.RuntimeModel, o.RuntimeError = d2.Revision, "model-b", "pull model-c: not found"
	for range 9 {
		clk.add(time.Minute)
		n.report(t, o)
		e.sweep()
	}
	clk.add(time.Minute - time.Second)
	n.report(t, o)
	e.sweep()
	e.wantStatus(t, id, "updating", "a second before the timeout")
	clk.add(time.Second)
	e.sweep()
	v = e.enforcementOf(t, id)
	if v.Status != "failed" || str(v.Enforcement.Runtime.Error) != "pull model-c: not found" || str(v.Enforcement.Runtime.Model) != "model-b" {
		t.Fatalf("at the timeout: %+v", v)
	}
	// Back to a model the node has: running again.
	e.req("PATCH", "/v1/servers/"+id, map[string]any{"model": "model-b"}).must(t, 200)
	d4 := n.desired(t, d3.Revision)
	n.report(t, applied(d4, ""))
	e.wantStatus(t, id, "running", "after switching back")
}

// TestRename: a rename moves the name (the old one is free, a taken one is
// a conflict) and the deployment URL, and reaches the node.
func TestRename(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("old-name")).must(t, 201))
	e.enroll(hwM4)
	other := idOf(t, e.req("POST", "/v1/servers", serverBody("taken")).must(t, 201))
	d := converge(t, n, "192.0.2.30")
	e.req("PATCH", "/v1/servers/"+id, map[string]any{"name": "taken"}).wantErr(t, 409, control.CodeConflict, "name")
	a := e.req("PATCH", "/v1/servers/"+id, map[string]any{"name": "new-name"}).must(t, 200).obj(t)
	if a["name"] != "new-name" || a["deployment_url"] != "https://new-name.deploy.test/api/v1" || a["status"] != "running" || a["model"] != "llama3.2:1b" {
		t.Fatalf("renamed %v", a)
	}
	d2 := n.desired(t, d.Revision)
	if d2.Server.Name != "new-name" || d2.Server.DeploymentURL != "https://new-name.deploy.test/api/v1" || d2.Model != "llama3.2:1b" {
		t.Fatalf("desired after rename %+v", d2.Server)
	}
	// The old name is free; renaming the other server to it works.
	e.req("PATCH", "/v1/servers/"+other, map[string]any{"name": "old-name"}).must(t, 200)
	// Both at once.
	b := e.req("PATCH", "/v1/servers/"+id, map[string]any{"name": "both", "model": "model-x"}).must(t, 200).obj(t)
	if b["name"] != "both" || b["model"] != "model-x" || b["status"] != "updating" {
		t.Fatalf("both %v", b)
	}
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers?status=updating", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 || list.Data[0]["id"] != id {
		t.Fatalf("updating list %v", list.Data)
	}
	// After the server is gone, its name is free again.
	e.req("DELETE", "/v1/servers/"+id, nil).must(t, 204)
	wd := n.desired(t, d2.Revision)
	if !wd.Wipe {
		t.Fatalf("desired after DELETE %+v", wd)
	}
	n.report(t, applied(wd, ""))
	e.req("POST", "/v1/servers", serverBody("both")).must(t, 201)
}

// TestPatchBadInput: every refusal is a 4xx in the error envelope and
// changes nothing.
func TestPatchBadInput(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("patch-me")).must(t, 201))
	e.enroll(hwM4)
	e.enroll(hwM4)
	bare := idOf(t, e.req("POST", "/v1/servers", serverBody("bare-one", func(m map[string]any) {
		m["stack"] = "bare"
		delete(m, "model")
	})).must(t, 201))
	e.req("POST", "/v1/servers", serverBody("other")).must(t, 201)
	d := converge(t, n, "192.0.2.40")
	before := e.req("GET", "/v1/servers/"+id, nil).must(t, 200)
	cases := []struct {
		name   string
		path   string
		body   any
		status int
		code   string
		param  string
	}{
		{"unknown field", id, map[string]any{"ram": 64}, 400, control.CodeInvalidRequest, "ram"},
		{"unknown with known", id, map[string]any{"model": "m", "stack": "bare"}, 400, control.CodeInvalidRequest, "stack"},
		{"status", id, map[string]any{"status": "running"}, 400, control.CodeInvalidRequest, "status"},
		{"field case", id, map[string]any{"Model": "m"}, 400, control.CodeInvalidRequest, "Model"},
		{"empty", id, map[string]any{}, 400, control.CodeInvalidRequest, ""},
		{"null model", id, map[string]any{"model": nil}, 400, control.CodeInvalidRequest, "model"},
		{"numeric model", id, map[string]any{"model": 7}, 400, control.CodeInvalidRequest, "model"},
		{"empty model", id, map[string]any{"model": ""}, 400, control.CodeInvalidRequest, "model"},
		{"bad model", id, map[string]any{"model": "rm -rf"}, 400, control.CodeInvalidRequest, "model"},
		{"bad name", id, map[string]any{"name": "Bad_Name"}, 400, control.CodeInvalidRequest, "name"},
		{"null name", id, map[string]any{"name": nil}, 400, control.CodeInvalidRequest, "name"},
		{"bad name, good model", id, map[string]any{"name": "-x", "model": "fine"}, 400, control.CodeInvalidRequest, "name"},
		{"good name, bad model", id, map[string]any{"name": "fine", "model": "no way"}, 400, control.CodeInvalidRequest, "model"},
		{"taken name", id, map[string]any{"name": "other"}, 409, control.CodeConflict, "name"},
		{"taken name with a model", id, map[string]any{"name": "other", "model": "m2"}, 409, control.CodeConflict, "name"},
		{"malformed", id, `{"model":`, 400, control.CodeInvalidRequest, ""},
		{"array", id, `[]`, 400, control.CodeInvalidRequest, ""},
		{"no body", id, ``, 400, control.CodeInvalidRequest, ""},
		{"model on bare", bare, map[string]any{"model": "m"}, 400, control.CodeInvalidRequest, "model"},
		{"unknown server", "srv_AAAAAAAAAAAAAAAAAAAAAAAA", map[string]any{"model": "m"}, 404, control.CodeNotFound, "id"},
		{"malformed id", "nope", map[string]any{"model": "m"}, 404, control.CodeNotFound, "id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.req("PATCH", "/v1/servers/"+c.path, c.body).wantErr(t, c.status, c.code, c.param)
		})
	}
	e.req("PATCH", "/v1/servers/"+id, strings.Repeat(" ", 2<<20)+"{}").wantErr(t, 413, control.CodePayloadTooLarge, "")
	after := e.req("GET", "/v1/servers/"+id, nil).must(t, 200)
	if string(before.body) != string(after.body) {
		t.Fatalf("a refused PATCH changed the server:\n%s\n%s", before.body, after.body)
	}
	if _, changed, _ := n.client.Desired(context.Background(), d.Revision, 10*time.Millisecond); changed {
		t.Fatal("a refused PATCH gave the node a new revision")
	}
	// A server being deleted cannot be changed.
	e.req("DELETE", "/v1/servers/"+id, nil).must(t, 204)
	e.req("PATCH", "/v1/servers/"+id, map[string]any{"name": "late"}).wantErr(t, 409, control.CodeConflict, "id")
	e.wantStatus(t, id, "deleting", "")
}

// TestUnreachable: a server whose node is silent for NodeTimeout shows
// unreachable, and returns to its previous status once the node reports
// again (or just polls). Time the control plane was down does not count.
func TestUnreachable(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("quiet")).must(t, 201))
	d := converge(t, n, "192.0.2.50")

	clk.add(90*time.Second - time.Second)
	e.sweep()
	e.wantStatus(t, id, "running", "before the node timeout")
	clk.add(time.Second)
	e.sweep()
	e.wantStatus(t, id, "unreachable", "at the node timeout")
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers?status=unreachable", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 {
		t.Fatalf("unreachable list %v", list.Data)
	}
	// Another sweep changes nothing more.
	e.sweep()
	e.wantStatus(t, id, "unreachable", "second sweep")
	// A report brings it back at once.
	n.report(t, applied(d, ""))
	e.wantStatus(t, id, "running", "after a report")

	// A model change while unreachable: the server shows unreachable, and
	// updating once the node is back, until it serves the new model.
	clk.add(2 * time.Minute)
	e.sweep()
	if a := e.req("PATCH", "/v1/servers/"+id, map[string]any{"model": "model-q"}).must(t, 200).obj(t); a["status"] != "unreachable" {
		t.Fatalf("PATCH while unreachable: %v", a["status"])
	}
	dq := n.desired(t, d.Revision)
	o := applied(dq, "")
	o.RuntimeRevision, o.RuntimeModel = d.Revision, d.Model
	n.report(t, o)
	e.wantStatus(t, id, "updating", "back while switching")
	n.report(t, applied(dq, ""))
	e.wantStatus(t, id, "running", "switched")
	d = dq

	// A poll without a report brings it back at the next sweep.
	clk.add(2 * time.Minute)
	e.sweep()
	e.wantStatus(t, id, "unreachable", "silent again")
	if _, _, err := n.client.Desired(context.Background(), d.Revision, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	e.sweep()
	e.wantStatus(t, id, "running", "after a poll")

	// A provisioning server whose node goes silent returns to
	// provisioning; if its provision timeout passes meanwhile, to failed.
	n2 := e.enroll(hwM4)
	id2 := idOf(t, e.req("POST", "/v1/servers", serverBody("quiet-2")).must(t, 201))
	n.report(t, applied(d, ""))
	clk.add(2 * time.Minute)
	n.report(t, applied(d, ""))
	e.sweep()
	e.wantStatus(t, id2, "unreachable", "silent provisioning node")
	e.wantStatus(t, id, "running", "the reporting node's server")
	d2 := n2.desired(t, 0)
	o = applied(d2, "")
	o.RuntimeHealthy, o.RuntimeError = false, "loading"
	n2.report(t, o)
	e.wantStatus(t, id2, "provisioning", "silent node back")
	clk.add(2 * time.Minute)
	e.sweep()
	clk.add(7 * time.Minute)
	e.sweep()
	e.wantStatus(t, id2, "unreachable", "still silent")
	n2.report(t, o)
	e.wantStatus(t, id2, "failed", "back after its provision timeout")
	n2.report(t, applied(d2, ""))
	e.wantStatus(t, id2, "running", "converged")

	// After a restart of the control plane, nodes get NodeTimeout from
	// the restart before they count as silent.
	n.report(t, applied(d, ""))
	n2.report(t, applied(d2, ""))
	clk.add(10 * time.Minute)
	e.restart()
	e.sweep()
	e.wantStatus(t, id, "running", "right after a restart")
	clk.add(90 * time.Second)
	e.sweep()
	e.wantStatus(t, id, "unreachable", "silent since the restart")
}

// TestSeenTimesPersisted: a settled node that only keeps reporting is not
// silent however long it runs, its times are persisted by the sweep (they
// survive a restart) and its node record — which every long-poll, report
// and credential check reads — is not rewritten for them.
func TestSeenTimesPersisted(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("steady")).must(t, 201))
	d := converge(t, n, "192.0.2.51")
	e.wantStatus(t, id, "running", "converged")
	var before json.RawMessage
	if err := e.st.Get("ctl/node/"+n.id, &before); err != nil {
		t.Fatal(err)
	}
	for range 8 { // 4 minutes, well past NodeTimeout
		clk.add(30 * time.Second)
		n.report(t, applied(d, "192.0.2.51"))
		e.sweep()
	}
	e.wantStatus(t, id, "running", "a node that keeps reporting")
	var after json.RawMessage
	if err := e.st.Get("ctl/node/"+n.id, &after); err != nil {
		t.Fatal(err)
	}
	if string(before) != string(after) {
		t.Fatalf("settled reports rewrote the node record:\n%s\n%s", before, after)
	}
	// A time in the same period of the node's as the stored one (10 s
	// newer, the period a third of NodeTimeout) waits in memory; once the
	// node has been quiet for a period it is written.
	stored := func() time.Time {
		t.Helper()
		nodes, err := control.ListNodes(e.st)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("ListNodes = %v, %v", nodes, err)
		}
		return nodes[0].LastSeen
	}
	if end := control.SeenPeriodEnd(90*time.Second, n.id, clk.now()); end.Sub(clk.now()) <= 10*time.Second {
		// Too near the period's end: a report just after it is written.
		clk.add(end.Sub(clk.now()) + time.Second)
		n.report(t, applied(d, "192.0.2.51"))
		e.sweep()
		if got := stored(); !got.Equal(clk.now()) {
			t.Fatalf("stored last seen %v after a report in a new period, want %v", got, clk.now())
		}
	}
	last := clk.now()
	clk.add(10 * time.Second)
	n.report(t, applied(d, "192.0.2.51"))
	e.sweep()
	if got := stored(); !got.Equal(last) {
		t.Fatalf("stored last seen %v after a report 10 s later, want still %v", got, last)
	}
	last = clk.now()
	clk.add(30 * time.Second)
	e.sweep()
	if got := stored(); !got.Equal(last) {
		t.Fatalf("stored last seen %v once the node went quiet, want %v", got, last)
	}
	n.report(t, applied(d, "192.0.2.51"))
	e.sweep()
	e.restart()
	nodes, err := control.ListNodes(e.st)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("ListNodes = %v, %v", nodes, err)
	}
	if want := clk.now(); !nodes[0].LastSeen.Equal(want) {
		t.Fatalf("last seen after a restart = %v, want %v", nodes[0].LastSeen, want)
	}
	srv := e.req("GET", "/v1/servers/"+id, nil).must(t, 200).obj(t)
	enf, _ := srv["enforcement"].(map[string]any)
	if got, want := enf["reported_at"], clk.now().UTC().Format(time.RFC3339); got != want {
		t.Fatalf("enforcement reported_at after a restart = %v, want %s (the last settled report)", got, want)
	}
}

// TestDeleteWithSilentNode: a server whose node never reports the wipe
// leaves deleting after DeleteTimeout; the node is kept out of the pool,
// still told to wipe, until it reports the wipe.
func TestDeleteWithSilentNode(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("gone")).must(t, 201))
	e.req("POST", "/v1/servers/"+id+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp", "action": "allow"}).must(t, 201)
	kid := idOf(t, e.req("POST", "/v1/servers/"+id+"/api-keys", map[string]any{"name": "k"}).must(t, 201))
	d := converge(t, n, "192.0.2.60")
	e.req("DELETE", "/v1/servers/"+id, nil).must(t, 204)
	wd := n.desired(t, d.Revision)
	if !wd.Wipe || len(wd.APIKeys) != 0 || len(wd.FirewallRules) != 0 || len(wd.SSHKeys) != 0 {
		t.Fatalf("wipe desired %+v", wd)
	}
	// The node is silent: unreachable never hides deleting.
	clk.add(5*time.Minute - time.Second)
	e.sweep()
	e.wantStatus(t, id, "deleting", "before the delete timeout")
	clk.add(time.Second)
	e.sweep()
	e.req("GET", "/v1/servers/"+id, nil).wantErr(t, 404, control.CodeNotFound, "id")
	e.req("GET", "/v1/servers/"+id+"/api-keys/"+kid, nil).wantErr(t, 404, control.CodeNotFound, "server_id")
	left := 0
	for _, pfx := range []string{"ctl/fw/", "ctl/fwid/", "ctl/dk/", "ctl/dkid/", "ctl/dkuse/", "ctl/dkexp/", "ctl/p/"} {
		_ = e.st.Scan(pfx, "", false, func(k string, _ []byte) (bool, error) {
			if pfx != "ctl/p/" || strings.Contains(k, "/srv") { // the project's server, name and creation index
				left++
				t.Errorf("left over: %s", k)
			}
			return true, nil
		})
	}
	if left != 0 {
		t.Fatalf("%d records of the removed server remain", left)
	}
	// The name is free, but the node is not.
	e.req("POST", "/v1/servers", serverBody("gone")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	nodes, err := control.ListNodes(e.st)
	if err != nil || len(nodes) != 1 || nodes[0].ServerID != "" || !nodes[0].WipePending {
		t.Fatalf("nodes %+v %v", nodes, err)
	}
	// When it comes back it is still told to wipe; a report that is not
	// the wipe keeps it out.
	wd2 := n.desired(t, wd.Revision)
	if !wd2.Wipe || wd2.Server != nil || len(wd2.APIKeys) != 0 || len(wd2.FirewallRules) != 0 {
		t.Fatalf("desired of the withheld node %+v", wd2)
	}
	a := e.reqAs(n.credential, "GET", "/v1/nodes/self/desired?after=0", nil).must(t, 200).obj(t)
	if a["wipe"] != true || a["server"] != nil {
		t.Fatalf("desired over HTTP %v", a)
	}
	o := applied(wd2, "")
	o.Wiped = false
	n.report(t, o)
	e.req("POST", "/v1/servers", serverBody("gone")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	// A wipe reported for an older revision does not count.
	o = applied(wd, "")
	n.report(t, o)
	e.req("POST", "/v1/servers", serverBody("gone")).wantErr(t, 409, control.CodeCapacityUnavailable, "")
	n.report(t, applied(wd2, ""))
	empty := n.desired(t, wd2.Revision)
	if empty.Wipe || empty.Server != nil {
		t.Fatalf("desired after the wipe %+v", empty)
	}
	if nodes, _ := control.ListNodes(e.st); nodes[0].WipePending {
		t.Fatalf("still withheld: %+v", nodes[0])
	}
	e.req("POST", "/v1/servers", serverBody("gone")).must(t, 201)
}

// TestSeenTimesPersistedInChunks: when more nodes are due than one change
// of the sweep writes, one sweep still persists every node's time (in
// several changes).
func TestSeenTimesPersistedInChunks(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	var nodes []node
	for range 2*control.SeenChunk + 1 {
		nodes = append(nodes, e.enroll(hwM4))
	}
	clk.add(time.Minute)
	for _, n := range nodes {
		n.desired(t, 0)
	}
	e.sweep()
	want := clk.now()
	got, err := control.ListNodes(e.st)
	if err != nil || len(got) != len(nodes) {
		t.Fatalf("ListNodes = %d nodes, %v; want %d", len(got), err, len(nodes))
	}
	for _, n := range got {
		if !n.LastSeen.Equal(want) {
			t.Fatalf("node %s: stored last seen %v after the sweep, want %v", n.ID, n.LastSeen, want)
		}
	}
}

// TestSeenTimesSpreadOverSweeps: nodes that enrolled together, and then talk
// all the time, do not have their seen times written all in one sweep (a
// burst every period that every change waits behind): each node's periods
// of NodeTimeout/3 begin at an offset of its own. No stored time lags the
// node's last request by NodeTimeout/3 or more after a sweep.
func TestSeenTimesSpreadOverSweeps(t *testing.T) {
	const timeout = 90 * time.Second
	e, clk := newClockEnv(t, func(c *control.Config) { c.NodeTimeout = timeout })
	every := timeout / 3
	var nodes []node
	for range 100 {
		nodes = append(nodes, e.enroll(hwM4))
	}
	stored := map[string]time.Time{}
	most := 0
	for step := 1; step <= 24; step++ { // two minutes, a sweep every 5 s
		clk.add(5 * time.Second)
		for _, n := range nodes {
			n.desired(t, 0)
		}
		e.sweep()
		now := clk.now()
		got, err := control.ListNodes(e.st)
		if err != nil || len(got) != len(nodes) {
			t.Fatalf("ListNodes = %d nodes, %v", len(got), err)
		}
		written := 0
		for _, n := range got {
			if !n.LastSeen.Equal(stored[n.ID]) {
				written++
			}
			stored[n.ID] = n.LastSeen
			if lag := now.Sub(n.LastSeen); lag >= every {
				t.Fatalf("step %d: node %s stored %v behind its last request", step, n.ID, lag)
			}
		}
		if step > 1 { // the first sweep writes every node's first time
			most = max(most, written)
		}
	}
	if most > len(nodes)/2 {
		t.Fatalf("one sweep wrote %d of %d nodes' seen times: still in step", most, len(nodes))
	}
}
