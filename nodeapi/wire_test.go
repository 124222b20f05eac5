package nodeapi_test

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
)

// The node protocol's JSON is pinned byte for byte: nodes and control
// planes of different versions speak it to each other, and Desired carries
// the firewall and sshkeys types directly, so a tag changed there would
// otherwise change the wire silently.
func TestWireFormat(t *testing.T) {
	expires := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		v    any
		wire string
	}{{
		name: "desired with a server, keys and rules",
		v: nodeapi.Desired{NodeID: "node_1", Revision: 7,
			Server: &nodeapi.Server{ID: "srv_1", Name: "web", Stack: "deployment", Model: "m", DeploymentURL: "https://web.example/api/v1"},
			Model:  "m",
			SSHKeys: []sshkeys.Key{
				{ID: "sk_1", PublicKey: "ssh-ed25519 AAAA a@b", Fingerprint: "SHA256:x"},
				{ID: "sk_2", PublicKey: "ssh-ed25519 BBBB"},
			},
			FirewallRules: []firewall.Rule{
				{ID: "fw_1", Direction: "inbound", Protocol: "tcp", PortRange: "22", Source: "10.0.0.0/8", Action: "allow", Description: "ssh"},
				{Direction: "outbound", Protocol: "icmp", Destination: "192.0.2.1/32", Action: "deny"},
			}},
		wire: `{"node_id":"node_1","revision":7,"server":{"id":"srv_1","name":"web","stack":"deployment","model":"m","deployment_url":"https://web.example/api/v1"},"model":"m",` +
			`"ssh_keys":[{"id":"sk_1","public_key":"ssh-ed25519 AAAA a@b","fingerprint":"SHA256:x"},{"id":"sk_2","public_key":"ssh-ed25519 BBBB","fingerprint":""}],` +
			`"firewall_rules":[{"id":"fw_1","direction":"inbound","protocol":"tcp","port_range":"22","source":"10.0.0.0/8","action":"allow","description":"ssh"},` +
			`{"direction":"outbound","protocol":"icmp","destination":"192.0.2.1/32","action":"deny"}],"api_keys":null,"wipe":false}`,
	}, {
		name: "desired of an idle node",
		v:    nodeapi.Desired{NodeID: "node_2", Revision: 3, SSHKeys: []sshkeys.Key{}, FirewallRules: []firewall.Rule{}},
		wire: `{"node_id":"node_2","revision":3,"server":null,"ssh_keys":[],"firewall_rules":[],"api_keys":null,"wipe":false}`,
	}, {
		name: "desired wipe",
		v:    nodeapi.Desired{NodeID: "node_2", Revision: 4, Server: &nodeapi.Server{ID: "srv_1", Name: "web", Stack: "bare"}, Wipe: true},
		wire: `{"node_id":"node_2","revision":4,"server":{"id":"srv_1","name":"web","stack":"bare"},"ssh_keys":null,"firewall_rules":null,"api_keys":null,"wipe":true}`,
	}, {
		name: "observed with a failure",
		v: nodeapi.Observed{Revision: 7, IP: "192.0.2.10", RuntimeError: "model is loading", FirewallRevision: 7,
			SSHKeysRevision: 6, SSHKeysError: "key sk_2: bad"},
		wire: `{"revision":7,"ip":"192.0.2.10","runtime_healthy":false,"runtime_error":"model is loading","runtime_revision":0,"firewall_revision":7,"ssh_keys_revision":6,"ssh_keys_error":"key sk_2: bad","api_keys_revision":0,"wiped":false}`,
	}, {
		name: "observed wiped",
		v:    nodeapi.Observed{Revision: 9, RuntimeHealthy: true, FirewallRevision: 9, SSHKeysRevision: 9, Wiped: true},
		wire: `{"revision":9,"runtime_healthy":true,"runtime_revision":0,"firewall_revision":9,"ssh_keys_revision":9,"api_keys_revision":0,"wiped":true}`,
	}, {
		name: "desired with API keys",
		v: nodeapi.Desired{NodeID: "node_3", Revision: 5, SSHKeys: []sshkeys.Key{}, FirewallRules: []firewall.Rule{},
			APIKeys: []nodeapi.APIKey{
				{ID: "dk_1", Name: "prod", Hash: "ab12", ExpiresAt: &expires, RequestsPerMinute: 60, TokensPerMinute: 1000},
				{ID: "dk_2", Name: "ci", Hash: "cd34"},
			}},
		wire: `{"node_id":"node_3","revision":5,"server":null,"ssh_keys":[],"firewall_rules":[],` +
			`"api_keys":[{"id":"dk_1","name":"prod","hash":"ab12","expires_at":"2030-01-02T03:04:05Z","requests_per_minute":60,"tokens_per_minute":1000},` +
			`{"id":"dk_2","name":"ci","hash":"cd34"}],"wipe":false}`,
	}, {
		name: "observed runtime, API keys and usage",
		v: nodeapi.Observed{Revision: 5, RuntimeHealthy: true, RuntimeRevision: 4, RuntimeModel: "model-a",
			RuntimeProgress:  &nodeapi.PullProgress{Status: "pulling", Completed: 10, Total: 20},
			FirewallRevision: 5, SSHKeysRevision: 5, APIKeysRevision: 5,
			Usage: []nodeapi.KeyUsage{{ID: "dk_1", Requests: 3, PromptTokens: 30, CompletionTokens: 40, LastUsedAt: &expires}}},
		wire: `{"revision":5,"runtime_healthy":true,"runtime_revision":4,"runtime_model":"model-a",` +
			`"runtime_progress":{"status":"pulling","completed":10,"total":20},"firewall_revision":5,"ssh_keys_revision":5,"api_keys_revision":5,` +
			`"usage":[{"id":"dk_1","requests":3,"prompt_tokens":30,"completion_tokens":40,"last_used_at":"2030-01-02T03:04:05Z"}],"wiped":false}`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.wire {
				t.Fatalf("encoded\n%s\nwant\n%s", b, tc.wire)
			}
			// And the wire decodes back to the same value.
			back := reflect.New(reflect.TypeOf(tc.v))
			if err := json.Unmarshal([]byte(tc.wire), back.Interface()); err != nil {
				t.Fatal(err)
			}
			if got := back.Elem().Interface(); !reflect.DeepEqual(got, tc.v) {
				t.Fatalf("decoded %+v, want %+v", got, tc.v)
			}
		})
	}
}
