package control

import (
	"bytes"
	"crypto/ed25519"
	crand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
	"github.com/hearthd/hearth/store/storetest"
)

// The control plane's crash safety: every change is one synced batch, so a
// power cut loses no acknowledged change and never exposes half of one.
// These tests run the real handlers over Pebble on a strict in-memory
// filesystem that drops everything not synced when it "crashes".

const crashStateDir = "ctl"

type crashRig struct {
	t  *testing.T
	fs storetest.CrashFS
	st *store.Store
	h  http.Handler
	// Two projects, each with a token: the workload runs in both, and
	// each one's records must stay invisible to the other.
	projects [2]string
	tokens   [2]string
}

func newCrashRig(t *testing.T) *crashRig {
	t.Helper()
	r := &crashRig{t: t, fs: storetest.NewCrashFS(t, crashStateDir)}
	r.open()
	second, err := CreateProject(r.st, "second", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{DefaultProject, second.ID} {
		tok, err := CreateToken(r.st, TokenSpec{Project: p, Name: "crash"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		r.projects[i], r.tokens[i] = tok.Project, tok.Token
	}
	return r
}

func (r *crashRig) open() {
	r.t.Helper()
	st, err := store.Open(crashStateDir, store.Options{FS: r.fs})
	if err != nil {
		r.t.Fatal(err)
	}
	srv, err := New(Config{Store: st, RateLimit: 1e6, RateBurst: 1e6})
	if err != nil {
		r.t.Fatal(err)
	}
	r.st, r.h = st, srv.Handler()
}

// crash drops every write not synced so far, as a power cut would, and
// reopens the state. Syncs are ignored from the moment it is called, so a
// change committed after that is not durable even if it is answered 2xx:
// callers count only answers they saw before calling crash.
func (r *crashRig) crash(inFlight *sync.WaitGroup) {
	r.fs.Crash(func() {
		if inFlight != nil {
			inFlight.Wait() // their commits go nowhere
		}
		_ = r.st.Close()
	})
	r.open()
}

func (r *crashRig) close() {
	if err := r.st.Close(); err != nil {
		r.t.Errorf("close store: %v", err)
	}
}

type crashAnswer struct {
	path   string // where the created record is read back
	status int
	body   []byte
}

func (r *crashRig) do(project int, method, path string, body any) crashAnswer {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Authorization", "Bearer "+r.tokens[project])
	rec := httptest.NewRecorder()
	r.h.ServeHTTP(rec, req)
	a := crashAnswer{status: rec.Code, body: rec.Body.Bytes()}
	if method == http.MethodPost && rec.Code == http.StatusCreated {
		var created struct{ ID string }
		_ = json.Unmarshal(a.body, &created)
		a.path = path + "/" + created.ID
	}
	return a
}

// enrollNodes adds n free nodes with the chip "cpu" to the pool.
func (r *crashRig) enrollNodes(n int) {
	r.t.Helper()
	et, err := CreateEnrollmentToken(r.st, n, time.Hour, time.Now())
	if err != nil {
		r.t.Fatal(err)
	}
	for i := range n {
		b, _ := json.Marshal(nodeapi.EnrollRequest{Hostname: fmt.Sprintf("node-%d", i),
			Hardware: nodeapi.Hardware{Chip: "cpu", RAM: 16, Storage: 100}})
		req := httptest.NewRequest(http.MethodPost, nodeapi.PathEnroll, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+et.Token)
		rec := httptest.NewRecorder()
		r.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			r.t.Fatalf("enroll: %d %s", rec.Code, rec.Body)
		}
	}
}

// testSSHKey returns a fresh, valid ssh-ed25519 public key line.
func testSSHKey(t testing.TB) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(crand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for _, part := range [][]byte{[]byte("ssh-ed25519"), pub} {
		wire = binary.BigEndian.AppendUint32(wire, uint32(len(part)))
		wire = append(wire, part...)
	}
	return "ssh-ed25519 " + base64.StdEncoding.EncodeToString(wire) + " crash@test"
}

// acked is what the client was told: the records answered 2xx (with their
// bodies) and the deletes answered 204.
type acked struct {
	mu          sync.Mutex
	servers     map[string]map[string]any
	keys        map[string]map[string]any
	rules       map[string]map[string]any // rule ID → body (holds server_id)
	deletedKeys map[string]bool
	apiKeys     map[string]map[string]any // API key ID → body (holds server_id)
	deletedAPI  map[string]string         // deleted API key ID → its server
	// late are creates answered 2xx after the power cut began: they may or
	// may not survive; lost counts those that did not.
	late []string
	lost int
}

func newAcked() *acked {
	return &acked{servers: map[string]map[string]any{}, keys: map[string]map[string]any{},
		rules: map[string]map[string]any{}, deletedKeys: map[string]bool{},
		apiKeys: map[string]map[string]any{}, deletedAPI: map[string]string{}}
}

func (a *acked) pick(m map[string]map[string]any, rnd *rand.Rand) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(m) == 0 {
		return ""
	}
	n := rnd.IntN(len(m))
	for id := range m {
		if n == 0 {
			return id
		}
		n--
	}
	return ""
}

// TestCrashDuringConcurrentCreates runs bursts of concurrent creates (SSH
// keys, servers listing keys, firewall rules, API keys) and deletes (SSH
// keys, API keys), cuts the
// power while requests are in flight, and checks after each restart that
// every acknowledged change is there and that the state is consistent.
func TestCrashDuringConcurrentCreates(t *testing.T) {
	r := newCrashRig(t)
	r.enrollNodes(150)
	acks := [2]*acked{newAcked(), newAcked()}
	var seq atomic.Int64
	rnd := rand.New(rand.NewPCG(1, 2))
	var rndMu sync.Mutex
	intN := func(n int) int { rndMu.Lock(); defer rndMu.Unlock(); return rnd.IntN(n) }

	for round := range 4 {
		var crashed atomic.Bool
		var inFlight sync.WaitGroup
		var answered atomic.Int64
		crashAfter := int64(40 + intN(60))
		stop := make(chan struct{})
		var stopOnce sync.Once
		for w := range 12 {
			inFlight.Add(1)
			go func() {
				defer inFlight.Done()
				wr := rand.New(rand.NewPCG(uint64(round), uint64(w)))
				for !crashed.Load() {
					p := wr.IntN(2)
					ack, do := acks[p], func(method, path string, body any) crashAnswer { return r.do(p, method, path, body) }
					op := wr.IntN(13)
					n := seq.Add(1)
					switch {
					case op < 3:
						a := do("POST", "/v1/ssh-keys", map[string]any{"name": fmt.Sprintf("key %d", n), "public_key": testSSHKey(t)})
						record(t, ack, &crashed, a, http.StatusCreated, func(id string, body map[string]any) { ack.keys[id] = body })
					case op < 6:
						var keys []string
						for range 2 {
							if k := ack.pick(ack.keys, wr); k != "" && !slices.Contains(keys, k) {
								keys = append(keys, k)
							}
						}
						a := do("POST", "/v1/servers", map[string]any{"name": fmt.Sprintf("srv-%d", n), "chip": "cpu",
							"ram": 8, "storage": 50, "stack": "deployment", "model": "tiny", "billing": "monthly", "ssh_key_ids": keys})
						if a.status == http.StatusBadRequest && strings.Contains(string(a.body), "does not exist") {
							continue // a listed key was deleted meanwhile
						}
						if a.status == http.StatusConflict && strings.Contains(string(a.body), CodeCapacityUnavailable) {
							continue
						}
						record(t, ack, &crashed, a, http.StatusCreated, func(id string, body map[string]any) { ack.servers[id] = body })
					case op < 9:
						srv := ack.pick(ack.servers, wr)
						if srv == "" {
							continue
						}
						a := do("POST", "/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound",
							"protocol": "tcp", "port_range": fmt.Sprint(1 + n%60000), "source": fmt.Sprintf("10.%d.%d.0/24", n%250, w),
							"action": "allow", "description": fmt.Sprintf("rule %d", n)})
						record(t, ack, &crashed, a, http.StatusCreated, func(id string, body map[string]any) { ack.rules[id] = body })
					case op < 11:
						srv := ack.pick(ack.servers, wr)
						if srv == "" {
							continue
						}
						body := map[string]any{"name": fmt.Sprintf("api key %d", n)}
						if n%2 == 0 {
							body["expires_at"] = time.Now().Add(time.Duration(1+n) * time.Hour).UTC().Format(time.RFC3339)
						}
						a := do("POST", "/v1/servers/"+srv+"/api-keys", body)
						record(t, ack, &crashed, a, http.StatusCreated, func(id string, body map[string]any) { ack.apiKeys[id] = body })
					case op < 12:
						k := ack.pick(ack.apiKeys, wr)
						if k == "" {
							continue
						}
						ack.mu.Lock()
						srv, _ := ack.apiKeys[k]["server_id"].(string)
						ack.mu.Unlock()
						a := do("DELETE", "/v1/servers/"+srv+"/api-keys/"+k, nil)
						if a.status == http.StatusNotFound {
							continue // deleted by another worker
						}
						if !record(t, ack, &crashed, a, http.StatusNoContent, func(string, map[string]any) {
							delete(ack.apiKeys, k)
							ack.deletedAPI[k] = srv
						}) {
							ack.mu.Lock()
							delete(ack.apiKeys, k)
							ack.mu.Unlock()
						}
					default:
						k := ack.pick(ack.keys, wr)
						if k == "" {
							continue
						}
						a := do("DELETE", "/v1/ssh-keys/"+k, nil)
						if a.status == http.StatusNotFound {
							continue // deleted by another worker
						}
						if !record(t, ack, &crashed, a, http.StatusNoContent, func(string, map[string]any) {
							delete(ack.keys, k)
							ack.deletedKeys[k] = true
						}) {
							// Answered during the cut: the key may or may
							// not be gone after it, so it is no longer
							// acknowledged either way.
							ack.mu.Lock()
							delete(ack.keys, k)
							ack.mu.Unlock()
						}
					}
					if answered.Add(1) >= crashAfter {
						stopOnce.Do(func() { close(stop) })
					}
				}
			}()
		}
		<-stop
		// Order matters: a worker that still sees crashed == false after
		// its answer knows the answer's sync happened before syncs were
		// ignored.
		crashed.Store(true)
		r.crash(&inFlight)
		for p, ack := range acks {
			checkCrashState(t, r, ack, p, fmt.Sprintf("round %d, project %d", round, p))
		}
		checkRawState(t, r, fmt.Sprintf("round %d", round))
	}
	ack := mergeAcked(acks)
	t.Logf("acknowledged: %d servers, %d keys (%d deleted), %d rules, %d API keys (%d deleted); %d changes committed during the cut were lost",
		len(ack.servers), len(ack.keys), len(ack.deletedKeys), len(ack.rules), len(ack.apiKeys), len(ack.deletedAPI), ack.lost)
	// The cut must really lose unsynced changes, or the test proves nothing.
	if ack.lost == 0 {
		t.Errorf("no change committed during the power cut was lost: the crash harness drops nothing")
	}
	for p, ack := range acks {
		if len(ack.servers) == 0 || len(ack.rules) == 0 || len(ack.deletedKeys) == 0 || len(ack.apiKeys) == 0 || len(ack.deletedAPI) == 0 {
			t.Errorf("the workload did not exercise every kind of change in project %d", p)
		}
	}
	r.close()
}

// mergeAcked sums the projects' acknowledgements, for the summary.
func mergeAcked(acks [2]*acked) *acked {
	out := newAcked()
	for _, a := range acks {
		for _, pair := range []struct{ to, from map[string]map[string]any }{
			{out.servers, a.servers}, {out.keys, a.keys}, {out.rules, a.rules}, {out.apiKeys, a.apiKeys},
		} {
			for k, v := range pair.from {
				pair.to[k] = v
			}
		}
		for k := range a.deletedKeys {
			out.deletedKeys[k] = true
		}
		for k, v := range a.deletedAPI {
			out.deletedAPI[k] = v
		}
		out.lost += a.lost
	}
	return out
}

// record notes a successful answer unless the crash has begun, and reports
// whether it did. Any answer other than want (or a tolerated refusal the
// caller filtered) is a bug.
func record(t *testing.T, ack *acked, crashed *atomic.Bool, a crashAnswer, want int, note func(id string, body map[string]any)) bool {
	if a.status != want {
		t.Errorf("unexpected answer %d (want %d): %s", a.status, want, a.body)
		return false
	}
	var body map[string]any
	if len(a.body) > 0 {
		_ = json.Unmarshal(a.body, &body)
	}
	id, _ := body["id"].(string)
	ack.mu.Lock()
	defer ack.mu.Unlock()
	if crashed.Load() {
		if id != "" {
			ack.late = append(ack.late, a.path)
		}
		return false
	}
	note(id, body)
	return true
}

// checkCrashState verifies, after a restart, that every change
// acknowledged to project p survived, that none of its records shows to the
// other project, and that its lists agree with its GETs.
func checkCrashState(t *testing.T, r *crashRig, ack *acked, p int, stage string) {
	t.Helper()
	ack.mu.Lock()
	defer ack.mu.Unlock()
	get := func(path string) crashAnswer { return r.do(p, "GET", path, nil) }
	hidden := func(path string) {
		if a := r.do(1-p, "GET", path, nil); a.status != http.StatusNotFound {
			t.Fatalf("%s: %s of project %d shows to the other project: %d %s", stage, path, p, a.status, a.body)
		}
	}
	for _, path := range ack.late {
		if get(path).status == http.StatusNotFound {
			ack.lost++
		}
	}
	ack.late = nil

	for id, want := range ack.servers {
		a := get("/v1/servers/" + id)
		if a.status != http.StatusOK {
			t.Fatalf("%s: acknowledged server %s: %d %s", stage, id, a.status, a.body)
		}
		var got map[string]any
		_ = json.Unmarshal(a.body, &got)
		for _, f := range []string{"name", "chip", "stack", "created_at"} {
			if got[f] != want[f] {
				t.Fatalf("%s: server %s %s = %v, acknowledged %v", stage, id, f, got[f], want[f])
			}
		}
		hidden("/v1/servers/" + id)
	}
	for id := range ack.keys {
		if a := get("/v1/ssh-keys/" + id); a.status != http.StatusOK {
			t.Fatalf("%s: acknowledged SSH key %s: %d %s", stage, id, a.status, a.body)
		}
		hidden("/v1/ssh-keys/" + id)
	}
	for id := range ack.deletedKeys {
		if a := get("/v1/ssh-keys/" + id); a.status != http.StatusNotFound {
			t.Fatalf("%s: SSH key %s deleted (204) is back: %d", stage, id, a.status)
		}
	}
	for id, want := range ack.rules {
		path := "/v1/servers/" + want["server_id"].(string) + "/firewall-rules/" + id
		if a := get(path); a.status != http.StatusOK {
			t.Fatalf("%s: acknowledged rule %s: %d %s", stage, id, a.status, a.body)
		}
		hidden(path)
	}
	for id, want := range ack.apiKeys {
		path := "/v1/servers/" + want["server_id"].(string) + "/api-keys/" + id
		if a := get(path); a.status != http.StatusOK {
			t.Fatalf("%s: acknowledged API key %s: %d %s", stage, id, a.status, a.body)
		}
		hidden(path)
	}
	for id, srv := range ack.deletedAPI {
		if a := get("/v1/servers/" + srv + "/api-keys/" + id); a.status != http.StatusNotFound {
			t.Fatalf("%s: API key %s deleted (204) is back: %d", stage, id, a.status)
		}
	}

	// The lists show exactly the project's records, each as its GET does.
	pk := keysOf(r.projects[p])
	servers, keys := 0, 0
	mustScan(t, r.st.Scan(pk.servers(), "", false, func(string, []byte) (bool, error) { servers++; return true, nil }))
	mustScan(t, r.st.Scan(pk.sshKeys(), "", false, func(string, []byte) (bool, error) { keys++; return true, nil }))
	if listed := walkList(t, r, p, "/v1/servers"); len(listed) != servers {
		t.Fatalf("%s: server list has %d items, state %d", stage, len(listed), servers)
	}
	listedKeys := walkList(t, r, p, "/v1/ssh-keys")
	if len(listedKeys) != keys {
		t.Fatalf("%s: key list has %d items, state %d", stage, len(listedKeys), keys)
	}
	for id, item := range listedKeys {
		a := get("/v1/ssh-keys/" + id)
		var one map[string]any
		_ = json.Unmarshal(a.body, &one)
		if a.status != http.StatusOK || fmt.Sprint(one) != fmt.Sprint(item) {
			t.Fatalf("%s: listed key %s differs from its GET: %v vs %d %v", stage, id, item, a.status, one)
		}
	}
}

// checkRawState verifies that no half-written change is visible: every
// record of every project is in its project's key space with its indexes
// pointing at it and back, servers reference existing keys of their own
// project and existing nodes, rules and API keys belong to existing
// servers of their own project, and nothing is left in the layout-1 key
// space.
func checkRawState(t *testing.T, r *crashRig, stage string) {
	t.Helper()
	st := r.st
	servers := map[string]serverRec{}
	keys := map[string]sshKeyRec{}
	for _, p := range r.projects {
		pk := keysOf(p)
		mustScan(t, store.ScanJSON(st, pk.servers(), func(key string, s serverRec) (bool, error) {
			if s.Project != p || key != s.key() {
				t.Fatalf("%s: server %s of project %q at %s", stage, s.ID, s.Project, key)
			}
			servers[s.ID] = s
			return true, nil
		}))
		mustScan(t, store.ScanJSON(st, pk.sshKeys(), func(key string, k sshKeyRec) (bool, error) {
			if k.Project != p || key != pk.sshKey(k.ID) {
				t.Fatalf("%s: SSH key %s of project %q at %s", stage, k.ID, k.Project, key)
			}
			keys[k.ID] = k
			return true, nil
		}))
		checkIndex(t, st, stage, pk.serverSeq(), func(key, id string) bool {
			s, ok := servers[id]
			return ok && key == pk.serverSeq()+seqKey(s.Seq, id)
		})
		checkIndex(t, st, stage, pk.serverName(""), func(key, id string) bool {
			s, ok := servers[id]
			return ok && key == pk.serverName(s.Name)
		})
		checkIndex(t, st, stage, pk.sshKeySeq(), func(key, id string) bool {
			k, ok := keys[id]
			return ok && key == pk.sshKeySeq()+seqKey(k.Seq, id)
		})
		checkIndex(t, st, stage, pk.sshKeyFP(""), func(key, id string) bool {
			k, ok := keys[id]
			return ok && key == pk.sshKeyFP(k.Fingerprint)
		})
	}
	for _, old := range []string{v1Server, v1ServerSeq, v1ServerName, v1SSHKey, v1SSHKeySeq, v1SSHKeyFP} {
		checkIndex(t, st, stage, old, func(string, string) bool { return false })
	}
	nodes := map[string]nodeRec{}
	mustScan(t, store.ScanJSON(st, pfxNode, func(_ string, n nodeRec) (bool, error) { nodes[n.ID] = n; return true, nil }))
	var rev uint64
	if err := st.Get(keyRevision, &rev); err != nil {
		t.Fatalf("%s: revision: %v", stage, err)
	}
	for id, s := range servers {
		pk := keysOf(s.Project)
		if s.Seq > rev {
			t.Fatalf("%s: server %s made at revision %d after the stored revision %d", stage, id, s.Seq, rev)
		}
		var byName, bySeq string
		if err := st.Get(pk.serverName(s.Name), &byName); err != nil || byName != id {
			t.Fatalf("%s: name index of %s: %q %v", stage, id, byName, err)
		}
		if err := st.Get(pk.serverSeq()+seqKey(s.Seq, id), &bySeq); err != nil || bySeq != id {
			t.Fatalf("%s: creation index of %s: %q %v", stage, id, bySeq, err)
		}
		for _, k := range s.SSHKeyIDs {
			if key, ok := keys[k]; !ok || key.Project != s.Project {
				t.Fatalf("%s: server %s lists SSH key %s, missing or of another project", stage, id, k)
			}
		}
		if n, ok := nodes[s.NodeID]; !ok || n.ServerID != id || n.ServerProject != s.Project {
			t.Fatalf("%s: server %s on node %s which holds %q of %q", stage, id, s.NodeID, n.ServerID, n.ServerProject)
		}
	}
	for id, n := range nodes {
		if n.ServerID != "" {
			if s, ok := servers[n.ServerID]; !ok || s.NodeID != id {
				t.Fatalf("%s: node %s assigned to missing server %s", stage, id, n.ServerID)
			}
		}
	}
	for id, k := range keys {
		pk := keysOf(k.Project)
		var byFP, bySeq string
		if err := st.Get(pk.sshKeyFP(k.Fingerprint), &byFP); err != nil || byFP != id {
			t.Fatalf("%s: fingerprint index of %s: %q %v", stage, id, byFP, err)
		}
		if err := st.Get(pk.sshKeySeq()+seqKey(k.Seq, id), &bySeq); err != nil || bySeq != id {
			t.Fatalf("%s: creation index of key %s: %q %v", stage, id, bySeq, err)
		}
	}
	rules := 0
	mustScan(t, store.ScanJSON(st, pfxRule, func(key string, rr ruleRec) (bool, error) {
		rules++
		if s, ok := servers[rr.ServerID]; !ok || s.Project != rr.Project {
			t.Fatalf("%s: rule %s of project %q for missing server %s", stage, rr.ID, rr.Project, rr.ServerID)
		}
		var back string
		if err := st.Get(rr.idKey(), &back); err != nil || back != key {
			t.Fatalf("%s: rule index of %s: %q %v", stage, rr.ID, back, err)
		}
		return true, nil
	}))
	ruleIDs := 0
	mustScan(t, st.Scan(pfxRuleID, "", false, func(string, []byte) (bool, error) { ruleIDs++; return true, nil }))
	if ruleIDs != rules {
		t.Fatalf("%s: %d rule index entries for %d rules", stage, ruleIDs, rules)
	}
	checkAPIKeyIndexes(t, st, servers, stage)
}

// checkIndex fails the test for an index entry (its value an ID) that ok
// refuses.
func checkIndex(t *testing.T, st *store.Store, stage, prefix string, ok func(key, id string) bool) {
	t.Helper()
	mustScan(t, st.Scan(prefix, "", false, func(key string, val []byte) (bool, error) {
		var id string
		_ = json.Unmarshal(val, &id)
		if !ok(key, id) {
			t.Fatalf("%s: index entry %s points at %s", stage, key, id)
		}
		return true, nil
	}))
}

func mustScan(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// walkList follows a list's cursors to the end and returns its items by ID.
func walkList(t *testing.T, r *crashRig, project int, path string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	next := path + "?limit=100"
	for {
		a := r.do(project, "GET", next, nil)
		if a.status != http.StatusOK {
			t.Fatalf("list %s: %d %s", next, a.status, a.body)
		}
		var page struct {
			Data       []map[string]any `json:"data"`
			HasMore    bool             `json:"has_more"`
			NextCursor *string          `json:"next_cursor"`
		}
		if err := json.Unmarshal(a.body, &page); err != nil {
			t.Fatal(err)
		}
		for _, item := range page.Data {
			id := item["id"].(string)
			if _, dup := out[id]; dup {
				t.Fatalf("list %s shows %s twice", path, id)
			}
			out[id] = item
		}
		if !page.HasMore {
			return out
		}
		next = path + "?limit=100&cursor=" + *page.NextCursor
	}
}

// checkAPIKeyIndexes: every API key record has its ID index and (if it
// expires) its expiry entry pointing back at it, under an existing
// server, and no index entry points at a missing record.
func checkAPIKeyIndexes(t *testing.T, st *store.Store, servers map[string]serverRec, stage string) {
	t.Helper()
	records := map[string]bool{}
	mustScan(t, store.ScanJSON(st, pfxAPIKey, func(key string, k apiKeyRec) (bool, error) {
		records[key] = true
		if s, ok := servers[k.ServerID]; !ok || s.Project != k.Project {
			t.Fatalf("%s: API key %s of project %q of missing server %s", stage, k.ID, k.Project, k.ServerID)
		}
		var back string
		if err := st.Get(k.idKey(), &back); err != nil || back != key {
			t.Fatalf("%s: ID index of API key %s: %q %v", stage, k.ID, back, err)
		}
		if exp := k.expKey(); exp != "" {
			if err := st.Get(exp, &back); err != nil || back != key {
				t.Fatalf("%s: expiry index of API key %s: %q %v", stage, k.ID, back, err)
			}
		}
		return true, nil
	}))
	for _, pfx := range []string{pfxAPIKeyID, pfxAPIKeyExp} {
		mustScan(t, st.Scan(pfx, "", false, func(key string, val []byte) (bool, error) {
			var rec string
			_ = json.Unmarshal(val, &rec)
			if !records[rec] {
				t.Fatalf("%s: index %s points at missing API key %s", stage, key, rec)
			}
			return true, nil
		}))
	}
}
