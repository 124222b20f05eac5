package control_test

import (
	"crypto/sha256"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestMigrateSingleProjectState opens a state written in the layout of
// the control plane before projects (records as that code wrote them) and
// finds all of it in the default project: the old token works and is
// read-write, every record reads back whole through the API, names and
// fingerprints stay taken, the node's desired state is unchanged, an old
// Idempotency-Key still replays, and nothing is left in the old key
// space. A second start changes nothing.
func TestMigrateSingleProjectState(t *testing.T) {
	const (
		srvID, nodeID, skID = "srv_AAAAAAAAAAAAAAAAAAAAAAA1", "node_AAAAAAAAAAAAAAAAAAAAAAA2", "sk_AAAAAAAAAAAAAAAAAAAAAAA3"
		fwID, dkID, tokID   = "fw_AAAAAAAAAAAAAAAAAAAAAAA4", "dk_AAAAAAAAAAAAAAAAAAAAAAA5", "tok_AAAAAAAAAAAAAAAAAAAAAAA6"
		seqSK, seqSrv       = "00000000000000000002", "00000000000000000003"
		seqFW, seqDK        = "00000000000000000004", "00000000000000000005"
	)
	token := "hct_" + strings.Repeat("T", 40)
	cred := "hcn_" + strings.Repeat("N", 40)
	pub, fp := newKey(t, "ed25519")
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	skBody := `{"id":"` + skID + `","name":"laptop","public_key":"` + pub + `","fingerprint":"` + fp + `","type":"ssh-ed25519","bits":256,"created_at":"2026-01-02T03:04:05Z"}`
	old := map[string]any{
		"ctl/meta/rev": 5,
		"ctl/srv/" + srvID: map[string]any{"id": srvID, "name": "web", "status": "running", "chip": "m4", "ram": 32, "storage": 500,
			"stack": "deployment", "model": "llama3.2:1b", "billing": "monthly", "ssh_key_ids": []string{skID}, "ip": "192.0.2.7",
			"node_id": nodeID, "seq": 3, "created_at": created, "updated_at": created},
		"ctl/srvseq/" + seqSrv + "/" + srvID: srvID,
		"ctl/srvname/web":                    srvID,
		"ctl/sk/" + skID: map[string]any{"id": skID, "name": "laptop", "public_key": pub, "fingerprint": fp, "type": "ssh-ed25519",
			"bits": 256, "comment": "user@test", "seq": 2, "created_at": created},
		"ctl/skseq/" + seqSK + "/" + skID: skID,
		"ctl/skfp/" + fp:                  skID,
		"ctl/fw/" + srvID + "/" + seqFW + "/" + fwID: map[string]any{"id": fwID, "server_id": srvID, "seq": 4, "created_at": created,
			"rule": map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": "22", "source": "10.0.0.0/8", "action": "allow"}},
		"ctl/fwid/" + fwID: "ctl/fw/" + srvID + "/" + seqFW + "/" + fwID,
		"ctl/dk/" + srvID + "/" + seqDK + "/" + dkID: map[string]any{"id": dkID, "server_id": srvID, "name": "app", "hash": sha("hearth_live_x"),
			"hint": "hearth_live_…abcd", "requests_per_minute": 60, "tokens_per_minute": 0, "seq": 5, "created_at": created},
		"ctl/dkid/" + dkID:  "ctl/dk/" + srvID + "/" + seqDK + "/" + dkID,
		"ctl/dkuse/" + dkID: map[string]any{"id": dkID, "requests": 7, "prompt_tokens": 70, "completion_tokens": 700},
		"ctl/node/" + nodeID: map[string]any{"id": nodeID, "hostname": "n1", "hardware": map[string]any{"chip": "m4", "ram": 64, "storage": 1000},
			"credential_hash": sha(cred), "server_id": srvID, "revision": 5, "last_seen": created, "created_at": created},
		"ctl/nodecred/" + sha(cred): nodeID,
		"ctl/tok/" + sha(token):     map[string]any{"id": tokID, "name": "ops", "hash": sha(token), "created_at": created},
		"ctl/idem/" + tokID + "/old-key": map[string]any{"request_hash": sha("POST /v1/ssh-keys\n" + `{"name":"again"}`), "status": 201,
			"body": []byte(skBody), "expires_at": time.Now().Add(time.Hour)},
	}
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range old {
		if err := st.Put(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	e := &env{t: t, dir: dir, api: loadOpenAPI(t), token: token,
		cfg: control.Config{RateLimit: 1e4, RateBurst: 1e4, SweepInterval: time.Hour, DeploymentURLTemplate: "https://{name}.deploy.test/api/v1"}}
	e.start()
	t.Cleanup(e.close)

	srv := e.req("GET", "/v1/servers/"+srvID, nil).must(t, 200).obj(t)
	if srv["name"] != "web" || srv["status"] != "running" || srv["ip"] != "192.0.2.7" || srv["created_at"] != "2026-01-02T03:04:05Z" ||
		srv["deployment_url"] != "https://web.deploy.test/api/v1" {
		t.Fatalf("server after the upgrade: %v", srv)
	}
	var list struct{ Data []map[string]any }
	e.req("GET", "/v1/servers", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 || list.Data[0]["id"] != srvID {
		t.Fatalf("server list %v", list.Data)
	}
	if k := e.req("GET", "/v1/ssh-keys/"+skID, nil).must(t, 200).obj(t); k["fingerprint"] != fp {
		t.Fatalf("SSH key %v", k)
	}
	e.req("GET", "/v1/ssh-keys", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 {
		t.Fatalf("SSH key list %v", list.Data)
	}
	if r := e.req("GET", "/v1/servers/"+srvID+"/firewall-rules/"+fwID, nil).must(t, 200).obj(t); r["source"] != "10.0.0.0/8" {
		t.Fatalf("rule %v", r)
	}
	if k := e.req("GET", "/v1/servers/"+srvID+"/api-keys/"+dkID, nil).must(t, 200).obj(t); k["requests"] != 7.0 || k["requests_per_minute"] != 60.0 {
		t.Fatalf("API key %v", k)
	}
	// Taken names and fingerprints stay taken.
	e.req("POST", "/v1/servers", serverBody("web")).wantErr(t, 409, control.CodeConflict, "name")
	e.req("POST", "/v1/ssh-keys", map[string]any{"name": "dup", "public_key": pub}).wantErr(t, 409, control.CodeConflict, "public_key")
	// An answer remembered before the upgrade still replays.
	a := e.req("POST", "/v1/ssh-keys", `{"name":"again"}`, "Idempotency-Key", "old-key").must(t, 201)
	if a.hdr.Get("Idempotent-Replayed") != "true" || string(a.body) != skBody+"\n" {
		t.Fatalf("replay after the upgrade: %s %v", a.body, a.hdr)
	}
	// The node's credential works and its desired state is what it was.
	c := nodeapi.NewClient(e.ts.URL, e.ts.Client())
	c.SetCredential(cred)
	d, changed, err := c.Desired(t.Context(), 0, time.Second)
	if err != nil || !changed || d.Revision != 5 || d.Server == nil || d.Server.ID != srvID || len(d.SSHKeys) != 1 ||
		len(d.FirewallRules) != 1 || d.FirewallRules[0].ID != fwID || len(d.APIKeys) != 1 || d.APIKeys[0].ID != dkID {
		t.Fatalf("desired state after the upgrade: %+v %v %v", d, changed, err)
	}
	// The old token is in the default project, read-write.
	var tokens []control.TokenInfo
	e.admin("GET", "/admin/tokens?project=default", nil).must(t, 200).decode(t, &tokens)
	if len(tokens) != 1 || tokens[0].ID != tokID || tokens[0].Scope != control.ScopeReadWrite || tokens[0].ProjectName != control.DefaultProject {
		t.Fatalf("tokens %+v", tokens)
	}
	// Nothing is left in the old key space, and a second start is a no-op.
	for _, pfx := range []string{"ctl/srv/", "ctl/srvseq/", "ctl/srvname/", "ctl/sk/", "ctl/skseq/", "ctl/skfp/", "ctl/fwid/fw_", "ctl/dkid/dk_"} {
		_ = e.st.Scan(pfx, "", false, func(k string, _ []byte) (bool, error) { t.Errorf("left in the old layout: %s", k); return true, nil })
	}
	before := snapshot(t, e)
	e.restart()
	sameState(t, before, snapshot(t, e), "a second start")
	// And the data is still served after the restart.
	e.req("GET", "/v1/servers/"+srvID+"/firewall-rules/"+fwID, nil).must(t, 200)
}
