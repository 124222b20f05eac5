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

	"github.com/cockroachdb/pebble/vfs"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// The control plane's crash safety: every change is one synced batch, so a
// power cut loses no acknowledged change and never exposes half of one.
// These tests run the real handlers over Pebble on a strict in-memory
// filesystem that drops everything not synced when it "crashes".

const crashStateDir = "ctl"

type crashRig struct {
	t     *testing.T
	fs    *vfs.MemFS
	st    *store.Store
	srv   *Server
	h     http.Handler
	token string
}

func newCrashRig(t *testing.T) *crashRig {
	t.Helper()
	fs := vfs.NewStrictMem()
	if err := fs.MkdirAll(crashStateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	root, err := fs.OpenDir("")
	if err != nil {
		t.Fatal(err)
	}
	if err := root.Sync(); err != nil {
		t.Fatal(err)
	}
	root.Close()
	r := &crashRig{t: t, fs: fs}
	r.open()
	tok, err := CreateAPIToken(r.st, "crash", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	r.token = tok.Token
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
	r.st, r.srv, r.h = st, srv, srv.Handler()
}

// crash drops every write not synced so far, as a power cut would, and
// reopens the state. Syncs are ignored from the moment it is called, so a
// change committed after that is not durable even if it is answered 2xx:
// callers count only answers they saw before calling crash.
func (r *crashRig) crash(inFlight *sync.WaitGroup) {
	r.fs.SetIgnoreSyncs(true)
	if inFlight != nil {
		inFlight.Wait() // their commits go nowhere
	}
	_ = r.st.Close()
	r.fs.ResetToSyncedState()
	r.fs.SetIgnoreSyncs(false)
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

func (r *crashRig) do(method, path string, body any) crashAnswer {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Authorization", "Bearer "+r.token)
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
	// late are creates answered 2xx after the power cut began: they may or
	// may not survive; lost counts those that did not.
	late []string
	lost int
}

func newAcked() *acked {
	return &acked{servers: map[string]map[string]any{}, keys: map[string]map[string]any{},
		rules: map[string]map[string]any{}, deletedKeys: map[string]bool{}}
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
// keys, servers listing keys, firewall rules) and SSH key deletes, cuts the
// power while requests are in flight, and checks after each restart that
// every acknowledged change is there and that the state is consistent.
func TestCrashDuringConcurrentCreates(t *testing.T) {
	r := newCrashRig(t)
	r.enrollNodes(150)
	ack := newAcked()
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
					op := wr.IntN(10)
					n := seq.Add(1)
					switch {
					case op < 3:
						a := r.do("POST", "/v1/ssh-keys", map[string]any{"name": fmt.Sprintf("key %d", n), "public_key": testSSHKey(t)})
						record(t, ack, &crashed, a, http.StatusCreated, func(id string, body map[string]any) { ack.keys[id] = body })
					case op < 6:
						var keys []string
						for range 2 {
							if k := ack.pick(ack.keys, wr); k != "" && !slices.Contains(keys, k) {
								keys = append(keys, k)
							}
						}
						a := r.do("POST", "/v1/servers", map[string]any{"name": fmt.Sprintf("srv-%d", n), "chip": "cpu",
							"ram": 8, "storage": 50, "stack": "bare", "billing": "monthly", "ssh_key_ids": keys})
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
						a := r.do("POST", "/v1/servers/"+srv+"/firewall-rules", map[string]any{"direction": "inbound",
							"protocol": "tcp", "port_range": fmt.Sprint(1 + n%60000), "source": fmt.Sprintf("10.%d.%d.0/24", n%250, w),
							"action": "allow", "description": fmt.Sprintf("rule %d", n)})
						record(t, ack, &crashed, a, http.StatusCreated, func(id string, body map[string]any) { ack.rules[id] = body })
					default:
						k := ack.pick(ack.keys, wr)
						if k == "" {
							continue
						}
						a := r.do("DELETE", "/v1/ssh-keys/"+k, nil)
						if a.status == http.StatusNotFound {
							continue // deleted by another worker
						}
						record(t, ack, &crashed, a, http.StatusNoContent, func(string, map[string]any) {
							delete(ack.keys, k)
							ack.deletedKeys[k] = true
						})
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
		checkCrashState(t, r, ack, fmt.Sprintf("round %d", round))
	}
	ack.mu.Lock()
	t.Logf("acknowledged: %d servers, %d keys (%d deleted), %d rules; %d changes committed during the cut were lost",
		len(ack.servers), len(ack.keys), len(ack.deletedKeys), len(ack.rules), ack.lost)
	// The cut must really lose unsynced changes, or the test proves nothing.
	if ack.lost == 0 {
		t.Errorf("no change committed during the power cut was lost: the crash harness drops nothing")
	}
	if len(ack.servers) == 0 || len(ack.rules) == 0 || len(ack.deletedKeys) == 0 {
		t.Errorf("the workload did not exercise every kind of change")
	}
	ack.mu.Unlock()
	r.close()
}

// record notes a successful answer unless the crash has begun. Any answer
// other than want (or a tolerated refusal the caller filtered) is a bug.
func record(t *testing.T, ack *acked, crashed *atomic.Bool, a crashAnswer, want int, note func(id string, body map[string]any)) {
	if a.status != want {
		t.Errorf("unexpected answer %d (want %d): %s", a.status, want, a.body)
		return
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
		return
	}
	note(id, body)
}

// checkCrashState verifies, after a restart, that every acknowledged change
// survived and that no half-written change is visible: every index entry
// points at its record and back, servers reference existing keys and nodes,
// rules belong to existing servers, and lists agree with GETs.
func checkCrashState(t *testing.T, r *crashRig, ack *acked, stage string) {
	t.Helper()
	ack.mu.Lock()
	defer ack.mu.Unlock()
	get := func(path string) crashAnswer { return r.do("GET", path, nil) }
	for _, p := range ack.late {
		if get(p).status == http.StatusNotFound {
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
	}
	for id := range ack.keys {
		if a := get("/v1/ssh-keys/" + id); a.status != http.StatusOK {
			t.Fatalf("%s: acknowledged SSH key %s: %d %s", stage, id, a.status, a.body)
		}
	}
	for id := range ack.deletedKeys {
		if a := get("/v1/ssh-keys/" + id); a.status != http.StatusNotFound {
			t.Fatalf("%s: SSH key %s deleted (204) is back: %d", stage, id, a.status)
		}
	}
	for id, want := range ack.rules {
		srv := want["server_id"].(string)
		a := get("/v1/servers/" + srv + "/firewall-rules/" + id)
		if a.status != http.StatusOK {
			t.Fatalf("%s: acknowledged rule %s: %d %s", stage, id, a.status, a.body)
		}
	}

	// The raw state: every record with its indexes, nothing dangling.
	st := r.st
	servers := map[string]serverRec{}
	mustScan(t, store.ScanJSON(st, pfxServer, func(_ string, s serverRec) (bool, error) { servers[s.ID] = s; return true, nil }))
	keys := map[string]sshKeyRec{}
	mustScan(t, store.ScanJSON(st, pfxSSHKey, func(_ string, k sshKeyRec) (bool, error) { keys[k.ID] = k; return true, nil }))
	nodes := map[string]nodeRec{}
	mustScan(t, store.ScanJSON(st, pfxNode, func(_ string, n nodeRec) (bool, error) { nodes[n.ID] = n; return true, nil }))
	var rev uint64
	if err := st.Get(keyRevision, &rev); err != nil {
		t.Fatalf("%s: revision: %v", stage, err)
	}
	for id, s := range servers {
		if s.Seq > rev {
			t.Fatalf("%s: server %s made at revision %d after the stored revision %d", stage, id, s.Seq, rev)
		}
		var byName, bySeq string
		if err := st.Get(pfxServerName+s.Name, &byName); err != nil || byName != id {
			t.Fatalf("%s: name index of %s: %q %v", stage, id, byName, err)
		}
		if err := st.Get(pfxServerSeq+seqKey(s.Seq, id), &bySeq); err != nil || bySeq != id {
			t.Fatalf("%s: creation index of %s: %q %v", stage, id, bySeq, err)
		}
		for _, k := range s.SSHKeyIDs {
			if _, ok := keys[k]; !ok {
				t.Fatalf("%s: server %s lists missing SSH key %s", stage, id, k)
			}
		}
		if n, ok := nodes[s.NodeID]; !ok || n.ServerID != id {
			t.Fatalf("%s: server %s on node %s which holds %q", stage, id, s.NodeID, n.ServerID)
		}
	}
	for id, n := range nodes {
		if n.ServerID != "" {
			if s, ok := servers[n.ServerID]; !ok || s.NodeID != id {
				t.Fatalf("%s: node %s assigned to missing server %s", stage, id, n.ServerID)
			}
		}
	}
	mustScan(t, st.Scan(pfxServerSeq, "", false, func(key string, val []byte) (bool, error) {
		var id string
		_ = json.Unmarshal(val, &id)
		if _, ok := servers[id]; !ok {
			t.Fatalf("%s: creation index %s points at missing server %s", stage, key, id)
		}
		return true, nil
	}))
	mustScan(t, st.Scan(pfxServerName, "", false, func(key string, val []byte) (bool, error) {
		var id string
		_ = json.Unmarshal(val, &id)
		if s, ok := servers[id]; !ok || pfxServerName+s.Name != key {
			t.Fatalf("%s: name index %s points at %s", stage, key, id)
		}
		return true, nil
	}))
	for id, k := range keys {
		var byFP, bySeq string
		if err := st.Get(pfxSSHKeyFP+k.Fingerprint, &byFP); err != nil || byFP != id {
			t.Fatalf("%s: fingerprint index of %s: %q %v", stage, id, byFP, err)
		}
		if err := st.Get(pfxSSHKeySeq+seqKey(k.Seq, id), &bySeq); err != nil || bySeq != id {
			t.Fatalf("%s: creation index of key %s: %q %v", stage, id, bySeq, err)
		}
	}
	for _, pfx := range []string{pfxSSHKeySeq, pfxSSHKeyFP} {
		mustScan(t, st.Scan(pfx, "", false, func(key string, val []byte) (bool, error) {
			var id string
			_ = json.Unmarshal(val, &id)
			if _, ok := keys[id]; !ok {
				t.Fatalf("%s: index %s points at missing key %s", stage, key, id)
			}
			return true, nil
		}))
	}
	rules := 0
	mustScan(t, store.ScanJSON(st, pfxRule, func(key string, rr ruleRec) (bool, error) {
		rules++
		if _, ok := servers[rr.ServerID]; !ok {
			t.Fatalf("%s: rule %s for missing server %s", stage, rr.ID, rr.ServerID)
		}
		var back string
		if err := st.Get(pfxRuleID+rr.ID, &back); err != nil || back != key {
			t.Fatalf("%s: rule index of %s: %q %v", stage, rr.ID, back, err)
		}
		return true, nil
	}))
	ruleIDs := 0
	mustScan(t, st.Scan(pfxRuleID, "", false, func(string, []byte) (bool, error) { ruleIDs++; return true, nil }))
	if ruleIDs != rules {
		t.Fatalf("%s: %d rule index entries for %d rules", stage, ruleIDs, rules)
	}

	// The lists show exactly the records, each as its GET does.
	listed := walkList(t, r, "/v1/servers")
	if len(listed) != len(servers) {
		t.Fatalf("%s: server list has %d items, state %d", stage, len(listed), len(servers))
	}
	for id := range listed {
		if _, ok := servers[id]; !ok {
			t.Fatalf("%s: listed server %s has no record", stage, id)
		}
	}
	listedKeys := walkList(t, r, "/v1/ssh-keys")
	if len(listedKeys) != len(keys) {
		t.Fatalf("%s: key list has %d items, state %d", stage, len(listedKeys), len(keys))
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

func mustScan(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// walkList follows a list's cursors to the end and returns its items by ID.
func walkList(t *testing.T, r *crashRig, path string) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	next := path + "?limit=100"
	for {
		a := r.do("GET", next, nil)
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
