package control_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// openAPI validates answers against the embedded OpenAPI document: the
// operation is found by method and path template, the response by status
// (or default), and the body is checked with the response's JSON schema.
type openAPI struct {
	doc      map[string]any
	compiler *jsonschema.Compiler
	mu       sync.Mutex
	cache    map[string]*jsonschema.Schema
	paths    []openAPIPath
}

type openAPIPath struct {
	template string
	re       *regexp.Regexp
}

const openAPIURL = "https://hearth.invalid/openapi.json"

func loadOpenAPI(t testing.TB) *openAPI {
	t.Helper()
	raw := control.OpenAPI()
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if doc["openapi"] != "3.1.0" {
		t.Fatalf("openapi version %v, want 3.1.0", doc["openapi"])
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	sdoc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.AddResource(openAPIURL, sdoc); err != nil {
		t.Fatal(err)
	}
	o := &openAPI{doc: doc, compiler: c, cache: map[string]*jsonschema.Schema{}}
	param := regexp.MustCompile(`\\\{[a-z_]+\\\}`)
	for p := range doc["paths"].(map[string]any) {
		re := "^" + param.ReplaceAllString(regexp.QuoteMeta(p), `[^/]+`) + "$"
		o.paths = append(o.paths, openAPIPath{template: p, re: regexp.MustCompile(re)})
	}
	// Every schema in the document must compile.
	for name := range doc["components"].(map[string]any)["schemas"].(map[string]any) {
		if _, err := c.Compile(openAPIURL + "#/components/schemas/" + name); err != nil {
			t.Fatalf("schema %s: %v", name, err)
		}
	}
	return o
}

func pointerEscape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// check validates one answer; it reports a test error for anything the
// document does not allow.
func (o *openAPI) check(t testing.TB, method, path string, status int, hdr http.Header, body []byte) {
	t.Helper()
	if hdr.Get("X-Request-Id") == "" {
		t.Errorf("%s %s → %d: no X-Request-Id", method, path, status)
	}
	var tmpl string
	for _, p := range o.paths {
		if p.re.MatchString(path) {
			// Prefer the most literal template ("/v1/nodes/enroll" over "/v1/servers/{id}").
			if tmpl == "" || strings.Count(p.template, "{") < strings.Count(tmpl, "{") {
				tmpl = p.template
			}
		}
	}
	if tmpl == "" {
		if status != http.StatusNotFound {
			t.Errorf("%s %s → %d: path not in the OpenAPI document", method, path, status)
		}
		o.checkSchema(t, method, path, status, "#/components/schemas/Error", body)
		return
	}
	item := o.doc["paths"].(map[string]any)[tmpl].(map[string]any)
	op, ok := item[strings.ToLower(method)].(map[string]any)
	if !ok {
		if status != http.StatusMethodNotAllowed {
			t.Errorf("%s %s → %d: operation not in the OpenAPI document", method, path, status)
		}
		o.checkSchema(t, method, path, status, "#/components/schemas/Error", body)
		return
	}
	responses := op["responses"].(map[string]any)
	code := strconv.Itoa(status)
	resp, ok := responses[code].(map[string]any)
	ptr := "#/paths/" + pointerEscape(tmpl) + "/" + strings.ToLower(method) + "/responses/" + code
	if !ok {
		resp, ok = responses["default"].(map[string]any)
		ptr = "#/paths/" + pointerEscape(tmpl) + "/" + strings.ToLower(method) + "/responses/default"
		if !ok || status < 400 {
			t.Errorf("%s %s → %d: status not documented", method, path, status)
			return
		}
	}
	if ref, ok := resp["$ref"].(string); ok {
		ptr = ref
		name := strings.TrimPrefix(ref, "#/components/responses/")
		resp = o.doc["components"].(map[string]any)["responses"].(map[string]any)[name].(map[string]any)
	}
	o.checkHeaders(t, method, path, status, resp, hdr)
	if _, hasContent := resp["content"]; !hasContent {
		if len(body) != 0 {
			t.Errorf("%s %s → %d: documented without a body but got %q", method, path, status, body)
		}
		return
	}
	o.checkSchema(t, method, path, status, ptr+"/content/application~1json/schema", body)
}

// checkHeaders fails the test for a header the response documents as
// required that the answer lacks, or whose value does not match its schema.
func (o *openAPI) checkHeaders(t testing.TB, method, path string, status int, resp map[string]any, hdr http.Header) {
	t.Helper()
	headers, _ := resp["headers"].(map[string]any)
	for name, h := range headers {
		def := h.(map[string]any)
		if ref, ok := def["$ref"].(string); ok {
			def = o.doc["components"].(map[string]any)["headers"].(map[string]any)[strings.TrimPrefix(ref, "#/components/headers/")].(map[string]any)
		}
		v := hdr.Get(name)
		if v == "" {
			if def["required"] == true {
				t.Errorf("%s %s → %d: no %s header, which the OpenAPI document requires", method, path, status, name)
			}
			continue
		}
		if typ, _ := def["schema"].(map[string]any)["type"].(string); typ == "integer" {
			if _, err := strconv.ParseInt(v, 10, 64); err != nil {
				t.Errorf("%s %s → %d: header %s = %q is not an integer", method, path, status, name, v)
			}
		}
	}
}

func (o *openAPI) checkSchema(t testing.TB, method, path string, status int, ptr string, body []byte) {
	t.Helper()
	o.mu.Lock()
	sch, ok := o.cache[ptr]
	if !ok {
		var err error
		sch, err = o.compiler.Compile(openAPIURL + ptr)
		if err != nil {
			o.mu.Unlock()
			t.Fatalf("compile %s: %v", ptr, err)
		}
		o.cache[ptr] = sch
	}
	o.mu.Unlock()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Errorf("%s %s → %d: body is not JSON: %q", method, path, status, body)
		return
	}
	if err := sch.Validate(inst); err != nil {
		t.Errorf("%s %s → %d: body does not match the OpenAPI document: %v\nbody: %s", method, path, status, err, body)
	}
}

// env is a control plane on loopback with one API token.
type env struct {
	t     testing.TB
	dir   string
	cfg   control.Config
	st    store.KV
	pg    bool   // on PostgreSQL rather than Pebble
	dbURL string // the test's PostgreSQL database, on that backend
	srv   *control.Server
	ts    *httptest.Server
	token string
	api   *openAPI
	// wrap, if set, wraps the store the control plane is given.
	wrap func(store.KV) store.KV
	stop context.CancelFunc
	done chan struct{}
}

func newEnv(t testing.TB, mod func(*control.Config)) *env {
	t.Helper()
	return newEnvWith(t, mod, onPostgres(), "")
}

// newEnvWith is newEnv on the chosen backend; on PostgreSQL a non-empty
// dbURL joins that database (another replica) instead of making one.
func newEnvWith(t testing.TB, mod func(*control.Config), pg bool, dbURL string) *env {
	t.Helper()
	e := &env{t: t, dir: t.TempDir(), api: loadOpenAPI(t), pg: pg, dbURL: dbURL}
	e.cfg = control.Config{RateLimit: 10000, RateBurst: 10000, SweepInterval: 20 * time.Millisecond,
		DeploymentURLTemplate: "https://{name}.deploy.test/api/v1"}
	if mod != nil {
		mod(&e.cfg)
	}
	e.start()
	tok, err := control.CreateAPIToken(e.st, "test", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	e.token = tok.Token
	t.Cleanup(e.close)
	return e
}

func (e *env) start() {
	e.t.Helper()
	st := openBackend(e.t, e.dir, e.pg, &e.dbURL)
	cfg := e.cfg
	cfg.Store = st
	if e.wrap != nil {
		cfg.Store = e.wrap(st)
	}
	srv, err := control.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.st, e.srv = st, srv
	e.ts = httptest.NewServer(srv.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	e.stop, e.done = cancel, make(chan struct{})
	go func() {
		defer close(e.done)
		_ = srv.Run(ctx)
	}()
	// Run sweeps at once; a test starts after that sweep, not beside it.
	<-control.FirstSweepDone(srv)
}

func (e *env) close() {
	if e.st == nil {
		return
	}
	e.ts.CloseClientConnections()
	e.ts.Close()
	e.stop()
	<-e.done
	// Whatever the test did, the pool index matches the node records.
	if missing, extra, err := control.PoolIndexDrift(e.srv); err != nil || len(missing)+len(extra) > 0 {
		e.t.Errorf("pool index drift: missing %q, extra %q (%v)", missing, extra, err)
	}
	if missing, extra, err := control.StatusIndexDrift(e.srv); err != nil || len(missing)+len(extra) > 0 {
		e.t.Errorf("status index drift: missing %q, extra %q (%v)", missing, extra, err)
	}
	if err := e.st.Close(); err != nil {
		e.t.Errorf("close store: %v", err)
	}
	e.st = nil
}

// restart stops the server and opens it again on the same state.
func (e *env) restart() {
	e.t.Helper()
	e.close()
	e.start()
}

type answer struct {
	status int
	hdr    http.Header
	body   []byte
}

func (a answer) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("decode %q: %v", a.body, err)
	}
}

func (a answer) obj(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	a.decode(t, &m)
	return m
}

// errCode returns the error code and param of an error answer.
func (a answer) err(t testing.TB) (code, param string) {
	t.Helper()
	var eb struct {
		Error struct {
			Code      string  `json:"code"`
			Param     *string `json:"param"`
			RequestID string  `json:"request_id"`
		} `json:"error"`
	}
	a.decode(t, &eb)
	if eb.Error.RequestID != a.hdr.Get("X-Request-Id") {
		t.Errorf("error request_id %q != X-Request-Id %q", eb.Error.RequestID, a.hdr.Get("X-Request-Id"))
	}
	if eb.Error.Param != nil {
		param = *eb.Error.Param
	}
	return eb.Error.Code, param
}

// req sends a request with the env's token; body may be a string (sent as
// is), []byte, or a value encoded as JSON. hdr is name, value pairs.
func (e *env) req(method, path string, body any, hdr ...string) answer {
	e.t.Helper()
	return e.reqAs(e.token, method, path, body, hdr...)
}

func (e *env) reqAs(token, method, path string, body any, hdr ...string) answer {
	e.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	case []byte:
		r = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			e.t.Fatal(err)
		}
		r = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, e.ts.URL+path, r)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := e.ts.Client().Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	e.api.check(e.t, method, req.URL.Path, resp.StatusCode, resp.Header, b)
	return answer{status: resp.StatusCode, hdr: resp.Header, body: b}
}

// must fails the test unless the answer has the wanted status.
func (a answer) must(t testing.TB, status int) answer {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	return a
}

// wantErr checks an error answer's status, code and param.
func (a answer) wantErr(t testing.TB, status int, code, param string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("status %d, want %d; body %s", a.status, status, a.body)
	}
	c, p := a.err(t)
	if c != code || p != param {
		t.Fatalf("error code %q param %q, want %q %q; body %s", c, p, code, param, a.body)
	}
}

// node is an enrolled node speaking the node protocol.
type node struct {
	id         string
	credential string
	client     *nodeapi.Client
}

func (e *env) enroll(hw nodeapi.Hardware) node {
	e.t.Helper()
	et, err := control.CreateEnrollmentToken(e.st, 1, time.Hour, time.Now())
	if err != nil {
		e.t.Fatal(err)
	}
	c := nodeapi.NewClient(e.ts.URL, e.ts.Client())
	resp, err := c.Enroll(context.Background(), et.Token, nodeapi.EnrollRequest{Hostname: "node-" + hw.Chip, Hardware: hw})
	if err != nil {
		e.t.Fatal(err)
	}
	c.SetCredential(resp.Credential)
	return node{id: resp.NodeID, credential: resp.Credential, client: c}
}

// newKey makes an SSH key pair with ssh-keygen and returns the public key
// line and ssh-keygen's fingerprint of it.
func newKey(t testing.TB, typ string, extra ...string) (pub, fingerprint string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "id")
	args := append([]string{"-q", "-t", typ, "-N", "", "-C", "user@test", "-f", path}, extra...)
	if out, err := exec.Command("ssh-keygen", args...).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	out, err := exec.Command("ssh-keygen", "-lf", path+".pub").Output()
	if err != nil {
		t.Fatalf("ssh-keygen -lf: %v", err)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 {
		t.Fatalf("ssh-keygen -lf output %q", out)
	}
	b, err := os.ReadFile(path + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b)), f[1]
}

func serverBody(name string, mods ...func(map[string]any)) map[string]any {
	b := map[string]any{"name": name, "chip": "m4", "ram": 32, "storage": 500, "stack": "deployment",
		"model": "llama3.2:1b", "billing": "monthly"}
	for _, m := range mods {
		m(b)
	}
	return b
}

func idOf(t testing.TB, a answer) string {
	t.Helper()
	id, _ := a.obj(t)["id"].(string)
	if id == "" {
		t.Fatalf("no id in %s", a.body)
	}
	return id
}

// applied is the report of a node that has applied d wholly: every concern
// at d's revision and the runtime serving d's model.
func applied(d nodeapi.Desired, ip string) nodeapi.Observed {
	return nodeapi.Observed{Revision: d.Revision, IP: ip, RuntimeHealthy: true, RuntimeRevision: d.Revision, RuntimeModel: d.Model,
		FirewallRevision: d.Revision, SSHKeysRevision: d.Revision, APIKeysRevision: d.Revision, Wiped: d.Wipe}
}

// fakeClock is the control plane's clock in tests that move time.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// newClockEnv is an env on a fake clock whose background sweep never
// fires after the first: the test calls sweep itself after moving time.
func newClockEnv(t testing.TB, mod func(*control.Config)) (*env, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Now().UTC().Truncate(time.Second)}
	e := newEnv(t, func(c *control.Config) {
		c.Now = clk.now
		c.SweepInterval = time.Hour
		if mod != nil {
			mod(c)
		}
	})
	return e, clk
}

// sweep runs the control plane's periodic work once.
func (e *env) sweep() {
	e.t.Helper()
	if err := e.srv.Sweep(); err != nil {
		e.t.Fatalf("sweep: %v", err)
	}
}

// status is a server's status as GET shows it.
func (e *env) status(id string) string {
	e.t.Helper()
	s, _ := e.req("GET", "/v1/servers/"+id, nil).must(e.t, 200).obj(e.t)["status"].(string)
	return s
}

// wantStatus fails the test unless the server shows the status.
func (e *env) wantStatus(t testing.TB, id, want, when string) {
	t.Helper()
	if s := e.status(id); s != want {
		t.Fatalf("%s: status %s, want %s", when, s, want)
	}
}

// desired takes the node's desired state newer than after, failing the
// test if there is none within a second.
func (n node) desired(t testing.TB, after uint64) nodeapi.Desired {
	t.Helper()
	d, changed, err := n.client.Desired(context.Background(), after, time.Second)
	if err != nil || !changed {
		t.Fatalf("desired after %d: %+v changed %v err %v", after, d, changed, err)
	}
	return d
}

// report posts an observed state for the node.
func (n node) report(t testing.TB, o nodeapi.Observed) {
	t.Helper()
	if err := n.client.ReportObserved(context.Background(), o); err != nil {
		t.Fatalf("report: %v", err)
	}
}
