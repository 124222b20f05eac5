package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
)

// Faults: the runtime dies or stalls, the control plane is killed, a node
// is away, processes are killed -9 in the middle of writes. hearth keeps
// serving and loses nothing it acknowledged.

// The supervised Ollama is killed in the middle of a stream: the client
// gets an error event and a clean end, the failure is counted, the
// supervisor brings the runtime back and hearthd serves again without a
// restart of its own.
func TestRuntimeKilledMidStream(t *testing.T) {
	bin, err := ollamatest.FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	gguf, tmpl := tinyModelFiles(t)
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", testutil.FreePort(t))
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", "e2e-tiny", "--model-gguf", gguf, "--model-template", tmpl,
		"--model-param", "num_thread=1", "--ollama-start", "--ollama-bin", bin,
		"--ollama-url", fmt.Sprintf("http://127.0.0.1:%d", testutil.FreePort(t)), "--ollama-models-dir", filepath.Join(t.TempDir(), "models"),
		"--metrics-listen", metricsAddr, "--max-output-tokens", "100000"}})
	first := ollamaChild(h.cmd.Process.Pid)
	if first == 0 {
		t.Fatal("no supervised ollama serve found")
	}

	resp := postChat(t, h, h.secret, `{"model":"e2e-tiny","stream":true,"max_tokens":100000,"messages":[{"role":"user","content":"go on"}]}`)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream: %d %s", resp.StatusCode, b)
	}
	br := bufio.NewReader(resp.Body)
	for n := 0; n < 3; {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("stream ended before the kill: %v", err)
		}
		if strings.Contains(line, `"content":"`) {
			n++
		}
	}
	if err := syscall.Kill(first, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var rest []string
	var restErr error
	go func() { defer close(done); rest, restErr = sseLines(br) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the stream did not end after the runtime was killed")
	}
	if restErr != nil {
		t.Fatalf("stream broke instead of ending cleanly: %v", restErr)
	}
	if len(rest) < 2 || rest[len(rest)-1] != "[DONE]" {
		t.Fatalf("stream did not end with an error event and [DONE]: %q", tail(rest, 3))
	}
	var ev struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(rest[len(rest)-2]), &ev); err != nil || ev.Error == nil || ev.Error.Message == "" || ev.Error.Type == "" {
		t.Fatalf("last event before [DONE] is not an error event: %q", rest[len(rest)-2])
	}

	// The failed generation is counted as such.
	m, err := scrape(metricsAddr)
	if err != nil {
		t.Fatalf("metrics at --metrics-listen %s: %v", metricsAddr, err)
	}
	if !metricAtLeast(m, "hearth_generations_total", `finish_reason="error"`, 1) {
		t.Fatalf("no failed completion counted:\n%s", grepLines(m, "hearth_generations_total"))
	}

	// The supervisor starts a new ollama serve.
	testutil.WaitFor(t, 60*time.Second, "ollama serve restarted", func() bool {
		p := ollamaChild(h.cmd.Process.Pid)
		return p != 0 && p != first
	})
	// The deployment becomes ready again on its own: a load balancer
	// that follows /readyz sends no traffic until it does, so readiness
	// must not wait for a request to load the model.
	h.waitReady(30 * time.Second)
	c := h.client(h.secret)
	out, err := c.Chat.Completions.New(context.Background(), userParams("e2e-tiny", "hi", 4))
	if err != nil {
		t.Fatalf("first request after the runtime came back: %v", err)
	}
	if out.Usage.CompletionTokens != 4 {
		t.Fatalf("usage %+v", out.Usage)
	}
}

// metricAtLeast reports whether a sample of name whose labels contain
// label has a value of at least v.
func metricAtLeast(exposition, name, label string, v float64) bool {
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, name+"{") || !strings.Contains(line, label) {
			continue
		}
		var got float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &got); err == nil && got >= v {
			return true
		}
	}
	return false
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A runtime that accepts the request and then says nothing: after
// --runtime-timeout the client gets 504 in the OpenAI error shape, streaming
// or not, and hearthd serves again as soon as the runtime answers.
func TestRuntimeSlowTimesOut(t *testing.T) {
	mock := startMockRuntime(t, "slow-model", bench.MockConfig{Tokens: 8})
	// A slot for each request: one the runtime has not answered keeps its
	// slot after its 504 until the runtime is done with it (at most
	// --runtime-timeout more, a minute at least), and a request behind it
	// would wait that long in hearthd's queue.
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", "slow-model", "--ollama-url", mock.URL, "--runtime-timeout", "1s", "--metrics-listen", "",
		"--max-concurrent", "3"}})
	mock.SetConfig(bench.MockConfig{Tokens: 8, TTFT: time.Hour})
	for _, stream := range []bool{false, true} {
		start := time.Now()
		resp := postChat(t, h, h.secret, fmt.Sprintf(`{"model":"slow-model","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Fatalf("stream=%v: %d %s, want 504", stream, resp.StatusCode, b)
		}
		if took < time.Second || took > 10*time.Second {
			t.Fatalf("stream=%v: 504 after %v with --runtime-timeout 1s", stream, took)
		}
		if typ, code := openAIError(t, b); typ != "server_error" || code != "timeout" {
			t.Fatalf("stream=%v: error type %q code %q: %s", stream, typ, code, b)
		}
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("stream=%v: 504 with content type %q", stream, ct)
		}
	}
	mock.SetConfig(bench.MockConfig{Tokens: 8})
	c := h.client(h.secret)
	if _, err := c.Chat.Completions.New(context.Background(), userParams("slow-model", "hi", 4)); err != nil {
		t.Fatalf("after the runtime recovered: %v", err)
	}
}

// The control plane is killed (SIGKILL) while a node is connected: the node
// keeps enforcing its last keys, the deployment keeps serving, and once the
// control plane is back the node reconnects with backoff and converges to
// the changes made meanwhile.
func TestControlPlaneKilledNodeKeepsState(t *testing.T) {
	e := startEnrolledNode(t)
	ctl, node, ak, nodeID := e.ctl, e.node, e.ak, e.id

	pub1 := genPubKey(t, "first")
	k1 := ctl.mustCreate("/v1/ssh-keys", map[string]any{"name": "first", "public_key": pub1})
	srv := ctl.mustCreate("/v1/servers", map[string]any{"name": "cp-kill", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "bare", "billing": "monthly", "ssh_key_ids": []string{k1}})
	ctl.mustCreate("/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "action": "allow"})
	rev := ctl.applied(nodeID, 20*time.Second)
	before, err := os.ReadFile(ak)
	if err != nil || !strings.Contains(string(before), strings.Fields(pub1)[1]) {
		t.Fatalf("authorized_keys before the kill: %q %v", before, err)
	}

	mark := node.logLen()
	ctl.kill()
	// Several failed reconnects (backoff 0.5, 1, 2 s …) go by.
	testutil.WaitFor(t, 30*time.Second, "three failed reconnects logged by the node", func() bool {
		return strings.Count(node.logs()[mark:], "control plane unreachable") >= 3
	})
	if b, err := os.ReadFile(ak); err != nil || string(b) != string(before) {
		t.Fatalf("authorized_keys changed while the control plane was down: %q %v", b, err)
	}
	select {
	case <-node.exited:
		t.Fatal("the node exited while the control plane was down")
	default:
	}

	ctl = ctl.restart()
	// Changes while the node is still backing off: the key leaves the
	// server and a rule is added.
	if code := ctl.api("DELETE", "/v1/ssh-keys/"+k1, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete key: %d", code)
	}
	ctl.mustCreate("/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "443", "action": "allow"})
	newRev := ctl.applied(nodeID, 45*time.Second)
	if newRev <= rev {
		t.Fatalf("revision did not move: %d → %d", rev, newRev)
	}
	after, _ := os.ReadFile(ak)
	if strings.Contains(string(after), strings.Fields(pub1)[1]) {
		t.Fatalf("deleted key still in authorized_keys:\n%s", after)
	}
}

// A node that was away while many changes were made converges when it
// comes back. "An hour away" is modelled by what the hour changes for the
// node, not by waiting: the node process is gone (SIGKILL, so no goodbye)
// while the control plane moves many revisions ahead — keys added and
// deleted, rules added and deleted — and is restarted from its state
// directory, where it first enforces its stale local copy and then must
// catch up in one step to the latest revision. Nothing in the protocol
// depends on wall-clock time beyond that: the long-poll answers any
// revision newer than the node's, however old.
func TestNodeOfflineConverges(t *testing.T) {
	e := startEnrolledNode(t)
	ctl, node, ak, nodeID := e.ctl, e.node, e.ak, e.id
	pubOld := genPubKey(t, "old")
	kOld := ctl.mustCreate("/v1/ssh-keys", map[string]any{"name": "old", "public_key": pubOld})
	srv := ctl.mustCreate("/v1/servers", map[string]any{"name": "away", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "bare", "billing": "monthly", "ssh_key_ids": []string{kOld}})
	rev := ctl.applied(nodeID, 20*time.Second)

	node.kill()
	// Many changes while the node is away.
	var rules []string
	for i := range 30 {
		rules = append(rules, ctl.mustCreate("/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound",
			"protocol": "tcp", "port_range": fmt.Sprint(8000 + i), "source": fmt.Sprintf("10.0.%d.0/24", i), "action": "allow"}))
	}
	for _, id := range rules[:10] {
		if code := ctl.api("DELETE", "/v1/servers/"+srv+"/firewall-rules/"+id, nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete rule: %d", code)
		}
	}
	if code := ctl.api("DELETE", "/v1/ssh-keys/"+kOld, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete key: %d", code)
	}
	if n := ctl.node(nodeID); n.Revision < rev+40 {
		t.Fatalf("node revision %d did not move ahead of %d", n.Revision, rev)
	}
	stale, _ := os.ReadFile(ak)
	if !strings.Contains(string(stale), strings.Fields(pubOld)[1]) {
		t.Fatalf("authorized_keys lost its key while the node was down: %q", stale)
	}

	node = node.restart(e.nodeArgs()...)
	final := ctl.applied(nodeID, 30*time.Second)
	if final < rev+40 {
		t.Fatalf("node converged to %d, want ≥ %d", final, rev+40)
	}
	b, _ := os.ReadFile(ak)
	if strings.Contains(string(b), strings.Fields(pubOld)[1]) {
		t.Fatalf("key deleted while the node was away is still authorized:\n%s", b)
	}
	if !strings.Contains(node.logs(), "enforcing last known desired state") {
		t.Fatalf("the restarted node did not enforce its local state first")
	}
}

// createOutcome is one create the client saw answered 2xx.
type createOutcome struct {
	kind string // "server", "key", "rule"
	id   string
	path string // where it is read back
	body map[string]any
}

// The control plane is killed -9 in the middle of 1 000 concurrent creates
// (50 in flight): after a restart every create that was answered 2xx is
// there, unchanged, and nothing half-written is visible.
func TestControlPlaneKilledDuringCreates(t *testing.T) {
	ctl := startControl(t, noRateLimit...)
	// Capacity for the servers: nodes enrolled over the node protocol
	// directly (no hearthd needed to hold a place in the pool).
	const nodes = 250
	enr := ctl.enrollmentToken(nodes)
	for i := range nodes {
		req, _ := http.NewRequest("POST", ctl.url+"/v1/nodes/enroll", strings.NewReader(fmt.Sprintf(
			`{"hostname":"n%d","hardware":{"chip":"cpu","ram":8,"storage":40}}`, i)))
		req.Header.Set("Authorization", "Bearer "+enr)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("enroll %d: %v %v", i, err, resp)
		}
		resp.Body.Close()
	}
	// A few servers and keys exist before the storm, so rules and key
	// references have targets from the start.
	var (
		mu      sync.Mutex
		acked   []createOutcome
		servers []string
		keys    []string
	)
	for i := range 5 {
		keys = append(keys, ctl.mustCreate("/v1/ssh-keys", map[string]any{"name": fmt.Sprint("pre ", i), "public_key": genPubKey(t, "pre")}))
		servers = append(servers, ctl.mustCreate("/v1/servers", map[string]any{"name": fmt.Sprint("pre-", i), "chip": "cpu",
			"ram": 4, "storage": 20, "stack": "bare", "billing": "monthly", "ssh_key_ids": keys[i : i+1]}))
	}
	// Key material is made up front, so the workers only send requests.
	const total = 1000
	pubs := make([]string, total)
	for i := range pubs {
		pubs[i] = genPubKey(t, "e2e@test")
	}

	var killed atomic.Bool
	var answered atomic.Int64
	killAt := int64(300 + rand.IntN(400))
	killedCh := make(chan struct{})
	var once sync.Once
	jobs := make(chan int)
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				mu.Lock()
				srv := servers[rand.IntN(len(servers))]
				key := keys[rand.IntN(len(keys))]
				mu.Unlock()
				var path string
				var body any
				kind := []string{"key", "server", "rule", "rule"}[i%4]
				switch kind {
				case "key":
					path, body = "/v1/ssh-keys", map[string]any{"name": fmt.Sprint("k ", i), "public_key": pubs[i]}
				case "server":
					path, body = "/v1/servers", map[string]any{"name": fmt.Sprint("s-", i), "chip": "cpu", "ram": 4, "storage": 20,
						"stack": "bare", "billing": "monthly", "ssh_key_ids": []string{key}}
				case "rule":
					path, body = "/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "udp",
						"port_range": fmt.Sprint(1000 + i), "action": "deny", "description": fmt.Sprint("r ", i)}
				}
				b, _ := json.Marshal(body)
				req, _ := http.NewRequest("POST", ctl.url+path, strings.NewReader(string(b)))
				req.Header.Set("Authorization", "Bearer "+ctl.token)
				resp, err := client.Do(req)
				if err != nil {
					if !killed.Load() {
						t.Errorf("create before the kill failed: %v", err)
					}
					continue
				}
				rb, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusCreated {
					if resp.StatusCode >= 500 || resp.StatusCode != http.StatusConflict {
						t.Errorf("POST %s: %d %s", path, resp.StatusCode, rb)
					}
					continue // conflicts: e.g. the pool ran out
				}
				var out map[string]any
				if err := json.Unmarshal(rb, &out); err != nil {
					t.Errorf("201 with a torn body %q: %v", rb, err)
					continue
				}
				id := out["id"].(string)
				mu.Lock()
				acked = append(acked, createOutcome{kind: kind, id: id, path: path + "/" + id, body: out})
				switch kind {
				case "server":
					servers = append(servers, id)
				case "key":
					keys = append(keys, id)
				}
				mu.Unlock()
				if answered.Add(1) == killAt {
					once.Do(func() {
						killed.Store(true)
						ctl.kill()
						close(killedCh)
					})
				}
			}
		}()
	}
	for i := range total {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	select {
	case <-killedCh:
	default:
		t.Fatalf("the control plane was never killed (%d answers)", answered.Load())
	}
	t.Logf("%d creates answered 2xx before or while the process was killed", len(acked))

	ctl = ctl.restart()
	for _, a := range acked {
		var got map[string]any
		if code := ctl.api("GET", a.path, nil, &got); code != http.StatusOK {
			t.Fatalf("acknowledged %s %s lost after kill -9: %d", a.kind, a.id, code)
		}
		for _, f := range []string{"name", "created_at", "fingerprint", "port_range", "description", "server_id"} {
			if fmt.Sprint(got[f]) != fmt.Sprint(a.body[f]) {
				t.Fatalf("%s %s field %s: %v after restart, acknowledged %v", a.kind, a.id, f, got[f], a.body[f])
			}
		}
	}
	checkConsistent(t, ctl)
}

// checkConsistent walks every list and checks it against the GETs: every
// listed server, key and rule reads back the same, servers list only
// existing keys, and rules only exist under existing servers.
func checkConsistent(t *testing.T, ctl *controlPlane) {
	t.Helper()
	keys := walkAPIList(t, ctl, "/v1/ssh-keys")
	servers := walkAPIList(t, ctl, "/v1/servers")
	for id, item := range keys {
		var one map[string]any
		if code := ctl.api("GET", "/v1/ssh-keys/"+id, nil, &one); code != 200 || fmt.Sprint(one) != fmt.Sprint(item) {
			t.Fatalf("listed key %s != its GET (%d): %v vs %v", id, code, item, one)
		}
	}
	for id, item := range servers {
		var one map[string]any
		if code := ctl.api("GET", "/v1/servers/"+id, nil, &one); code != 200 || one["name"] != item["name"] || one["status"] != item["status"] {
			t.Fatalf("listed server %s != its GET (%d): %v vs %v", id, code, item, one)
		}
		for _, k := range one["ssh_key_ids"].([]any) {
			if _, ok := keys[k.(string)]; !ok {
				t.Fatalf("server %s lists missing SSH key %v", id, k)
			}
		}
		for rid, rule := range walkAPIList(t, ctl, "/v1/servers/"+id+"/firewall-rules") {
			var one map[string]any
			if code := ctl.api("GET", "/v1/servers/"+id+"/firewall-rules/"+rid, nil, &one); code != 200 ||
				fmt.Sprint(one) != fmt.Sprint(rule) || one["server_id"] != id {
				t.Fatalf("listed rule %s != its GET (%d): %v vs %v", rid, code, rule, one)
			}
		}
	}
	// Every node assignment points at a listed server and back.
	assigned := map[string]string{}
	for _, n := range ctl.nodes() {
		if n.ServerID != "" {
			if _, ok := servers[n.ServerID]; !ok {
				t.Fatalf("node %s assigned to missing server %s", n.ID, n.ServerID)
			}
			if other, dup := assigned[n.ServerID]; dup {
				t.Fatalf("server %s on two nodes %s and %s", n.ServerID, other, n.ID)
			}
			assigned[n.ServerID] = n.ID
		}
	}
	if len(assigned) != len(servers) {
		t.Fatalf("%d servers but %d node assignments", len(servers), len(assigned))
	}
}

// walkAPIList follows a list's cursors and returns its items by ID.
func walkAPIList(t *testing.T, ctl *controlPlane, path string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	next := path + "?limit=100"
	for {
		var page struct {
			Data       []map[string]any `json:"data"`
			HasMore    bool             `json:"has_more"`
			NextCursor *string          `json:"next_cursor"`
		}
		if code := ctl.api("GET", next, nil, &page); code != 200 {
			t.Fatalf("GET %s: %d", next, code)
		}
		for _, item := range page.Data {
			id := item["id"].(string)
			if _, dup := out[id]; dup {
				t.Fatalf("%s lists %s twice", path, id)
			}
			out[id] = item
		}
		if !page.HasMore {
			return out
		}
		next = path + "?limit=100&cursor=" + *page.NextCursor
	}
}

// hearthd is killed -9 while `hearthd keys create` runs against its admin
// socket: every key the CLI printed authenticates after the restart and is
// listed.
func TestHearthdKilledDuringKeyCreates(t *testing.T) {
	mock := startMockRuntime(t, "keys-model", bench.MockConfig{Tokens: 2})
	h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", "keys-model", "--ollama-url", mock.URL, "--metrics-listen", ""}})
	var (
		mu      sync.Mutex
		printed = map[string]string{} // secret → name
	)
	var killed atomic.Bool
	var wg sync.WaitGroup
	var created atomic.Int64
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				name := fmt.Sprintf("w%d-%d", w, i)
				out, err := exec.Command(h.bin, "keys", "create", "--name", name, "--state-dir", h.stateDir).Output()
				if err != nil {
					if !killed.Load() {
						t.Errorf("keys create before the kill: %v", err)
					}
					continue
				}
				if key := keyRe.FindString(string(out)); key != "" {
					mu.Lock()
					printed[key] = name
					mu.Unlock()
					created.Add(1)
				}
			}
		}()
	}
	testutil.WaitFor(t, 60*time.Second, "keys being created", func() bool { return created.Load() >= 20 })
	killed.Store(true)
	atKill := created.Load()
	h.kill()
	// The CLI falls back to the state directory once hearthd is gone; let
	// a few of those land too (beyond the at most four a worker had in
	// flight at the kill), then stop before hearthd takes the state.
	testutil.WaitFor(t, 60*time.Second, "keys created in the state directory after the kill", func() bool {
		return created.Load() >= atKill+5
	})
	close(stop)
	wg.Wait()

	h2 := h.restart()
	h2.waitReady(30 * time.Second)
	list := h2.keysCLI("list")
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d keys printed", len(printed))
	for key, name := range printed {
		if keyID(list, name) == "" {
			t.Fatalf("key %s printed but not listed after the restart:\n%s", name, list)
		}
		c := h2.client(key)
		if _, err := c.Models.List(context.Background()); err != nil {
			t.Fatalf("key %s printed but rejected after the restart: %v", name, err)
		}
	}
}
