package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/internal/testutil"
)

// TestControlPlaneAndNode runs the control plane and a hearthd node as two
// real processes: the node enrolls, a server created through the API is
// assigned to it and becomes running, changes reach it, and deleting the
// server returns it to the pool; on embedded Pebble and on PostgreSQL.
func TestControlPlaneAndNode(t *testing.T) {
	t.Run("pebble", func(t *testing.T) { testControlPlaneAndNode(t, startControl(t)) })
	t.Run("postgres", func(t *testing.T) {
		db := pgtest.Start(t)
		testControlPlaneAndNode(t, startControl(t, "--database-url", db.NewDatabase(t)))
	})
}

func testControlPlaneAndNode(t *testing.T, ctl *controlPlane) {
	// While the server runs, the CLI goes through its admin socket.
	token2 := strings.TrimSpace(ctl.cli("tokens", "create", "--project", "default", "--name", "online"))
	if !strings.HasPrefix(token2, "hct_") || token2 == ctl.token {
		t.Fatalf("second token %q", token2)
	}
	enroll := strings.TrimSpace(ctl.cli("enrollment-tokens", "create", "--uses", "1", "--ttl", "10m"))
	if !strings.HasPrefix(enroll, "hce_") {
		t.Fatalf("enrollment token %q", enroll)
	}
	// No node yet: no capacity.
	server := map[string]any{"name": "e2e-web", "chip": "cpu", "ram": 4, "storage": 20, "stack": "deployment",
		"model": "tiny", "billing": "monthly"}
	if code := ctl.api("POST", "/v1/servers", server, nil); code != http.StatusConflict {
		t.Fatalf("create without nodes: %d", code)
	}

	inst := shared.ollama.Get(t)
	server["model"] = inst.Model
	startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL,
		"--control-url", ctl.url, "--enrollment-token", enroll,
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40"}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })

	var key struct{ ID string }
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL e2e@test"
	if code := ctl.api("POST", "/v1/ssh-keys", map[string]any{"name": "e2e", "public_key": pub}, &key); code != http.StatusCreated {
		t.Fatalf("create key: %d", code)
	}
	server["ssh_key_ids"] = []string{key.ID}
	var srv struct {
		ID, Status, DeploymentURL string
		IP                        *string
	}
	if code := ctl.api("POST", "/v1/servers", server, &srv); code != http.StatusCreated || srv.Status != "provisioning" {
		t.Fatalf("create server: %d %+v", code, srv)
	}
	testutil.WaitFor(t, 60*time.Second, "server running", func() bool {
		ctl.api("GET", "/v1/servers/"+srv.ID, nil, &srv)
		return srv.Status == "running"
	})
	if srv.IP == nil || *srv.IP != "127.0.0.1" {
		t.Fatalf("server ip %v", srv.IP)
	}
	// What the node's runtime says of the served model is on the server.
	var info struct {
		Enforcement struct {
			Runtime struct {
				ContextLength *int     `json:"context_length"`
				Capabilities  []string `json:"capabilities"`
			}
		}
	}
	testutil.WaitFor(t, 30*time.Second, "model info reported", func() bool {
		ctl.api("GET", "/v1/servers/"+srv.ID, nil, &info)
		return info.Enforcement.Runtime.ContextLength != nil
	})
	if rt := info.Enforcement.Runtime; *rt.ContextLength != 2048 || !slices.Contains(rt.Capabilities, "tools") {
		t.Fatalf("runtime info %d %q, want the tiny model's 2048 and tools", *rt.ContextLength, rt.Capabilities)
	}

	// A firewall rule reaches the node and is reported applied.
	if code := ctl.api("POST", "/v1/servers/"+srv.ID+"/firewall-rules", map[string]any{"direction": "inbound",
		"protocol": "tcp", "port_range": "22", "action": "allow"}, nil); code != http.StatusCreated {
		t.Fatalf("create rule: %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "rule applied on the node", func() bool {
		n := ctl.nodes()[0]
		return n.Observed != nil && n.Observed.FirewallRevision == n.Revision && n.ServerID == srv.ID
	})

	// Deleting the server wipes the node and frees it.
	if code := ctl.api("DELETE", "/v1/servers/"+srv.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	testutil.WaitFor(t, 30*time.Second, "server gone", func() bool {
		return ctl.api("GET", "/v1/servers/"+srv.ID, nil, nil) == http.StatusNotFound
	})
	if n := ctl.nodes()[0]; n.ServerID != "" {
		t.Fatalf("node still assigned: %+v", n)
	}
	server["name"] = "e2e-again"
	if code := ctl.api("POST", "/v1/servers", server, nil); code != http.StatusCreated {
		t.Fatalf("node not back in the pool: %d", code)
	}
}
