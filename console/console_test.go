package console_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

var bins controltest.Binaries

func TestMain(m *testing.M) { os.Exit(controltest.Main(m, &bins)) }

// browser is a cookie-keeping HTTP client of one console, sending its
// forms from the console's own origin as a browser would.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

// page is an answer: status, headers, body and where a redirect goes.
type page struct {
	status int
	header http.Header
	body   string
}

func (p page) location() string { return p.header.Get("Location") }

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return page{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

func (b *browser) get(path string) page {
	b.t.Helper()
	req, _ := http.NewRequest("GET", b.base+path, nil)
	return b.do(req)
}

// post sends a form; origin "" is the console's own.
func (b *browser) post(path string, form url.Values, origin string) page {
	b.t.Helper()
	req, _ := http.NewRequest("POST", b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin == "" {
		origin = b.base
	}
	req.Header.Set("Origin", origin)
	return b.do(req)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the CSRF token of the forms of a signed-in page.
func (b *browser) csrf() string {
	b.t.Helper()
	p := b.get("/console/token")
	m := csrfRe.FindStringSubmatch(p.body)
	if p.status != http.StatusOK || m == nil {
		b.t.Fatalf("token page %d without a CSRF token:\n%s", p.status, p.body)
	}
	return m[1]
}

func (b *browser) signIn(token string) {
	b.t.Helper()
	p := b.post("/console/sign-in", url.Values{"token": {token}, "next": {"/console/servers"}}, "")
	if p.status != http.StatusSeeOther || p.location() != "/console/servers" {
		b.t.Fatalf("sign-in: %d %s\n%s", p.status, p.location(), p.body)
	}
}

// api is the management API's client with a token.
func api(t *testing.T, ctl *controltest.Control, token string) *client.Client {
	t.Helper()
	c, err := client.New(ctl.URL, client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func createServer(t *testing.T, ctl *controltest.Control, token, name string) string {
	t.Helper()
	s, err := api(t, ctl, token).CreateServer(context.Background(), client.CreateServerRequest{Name: name, Chip: "cpu", RAM: 4,
		Storage: 20, Stack: client.StackDeployment, Model: "tiny", Billing: client.BillingMonthly})
	if err != nil {
		t.Fatalf("create server: %v", err)
	}
	return s.ID
}

// Every page forbids inline script and framing; the session cookie is
// HttpOnly and SameSite=Strict (and not Secure on loopback, where the
// browser would not send it back); a bad token is refused on the form;
// forms need the session's CSRF token and the console's origin; sign-out
// ends the session on the server, not only in the browser.
func TestSessionAndSecurity(t *testing.T) {
	ctl := controltest.Start(t, &bins)
	b := newBrowser(t, ctl.URL)

	p := b.get("/console/sign-in")
	csp := p.header.Get("Content-Security-Policy")
	if p.status != http.StatusOK || !strings.Contains(csp, "default-src 'self'") || !strings.Contains(csp, "script-src 'self'") ||
		strings.Contains(csp, "unsafe") || p.header.Get("X-Frame-Options") != "DENY" || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Fatalf("sign-in page %d, headers %v", p.status, p.header)
	}
	if strings.Contains(p.body, "<script>") || regexp.MustCompile(`<script(?:\s[^>]*)?>[^<]`).MatchString(p.body) {
		t.Fatalf("inline script in the sign-in page:\n%s", p.body)
	}

	// Not signed in: a page sends to sign-in and back.
	p = b.get("/console/ssh-keys")
	if p.status != http.StatusSeeOther || p.location() != "/console/sign-in?next=%2Fconsole%2Fssh-keys" {
		t.Fatalf("signed out: %d %q", p.status, p.location())
	}

	p = b.post("/console/sign-in", url.Values{"token": {"hearth_nope"}}, "")
	if p.status != http.StatusUnauthorized || !strings.Contains(p.body, "this token is not valid") || !strings.Contains(p.body, `aria-invalid="true"`) {
		t.Fatalf("bad token: %d\n%s", p.status, p.body)
	}
	if p := b.post("/console/sign-in", url.Values{"token": {ctl.Token}}, "http://evil.example"); p.status != http.StatusForbidden {
		t.Fatalf("cross-site sign-in: %d", p.status)
	}

	p = b.post("/console/sign-in", url.Values{"token": {ctl.Token}, "next": {"/console/ssh-keys"}}, "")
	if p.status != http.StatusSeeOther || p.location() != "/console/ssh-keys" {
		t.Fatalf("sign-in: %d %q", p.status, p.location())
	}
	var cookie *http.Cookie
	for _, c := range (&http.Response{Header: p.header}).Cookies() {
		if c.Name == "hearth_console" {
			cookie = c
		}
	}
	if cookie == nil || !cookie.HttpOnly || cookie.SameSite != http.SameSiteStrictMode || cookie.Secure || cookie.MaxAge <= 0 ||
		strings.Contains(cookie.Value, ctl.Token) || strings.HasPrefix(cookie.Value, "hearth_") {
		t.Fatalf("session cookie %+v", cookie)
	}
	if p := b.get("/console/ssh-keys"); p.status != http.StatusOK || strings.Contains(p.body, ctl.Token) {
		t.Fatalf("ssh keys page %d (or it shows the token)", p.status)
	}

	csrf := b.csrf()
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl test"
	// No CSRF token, a wrong one, another origin: refused, nothing made.
	for name, tc := range map[string]struct {
		form   url.Values
		origin string
	}{
		"no token":     {url.Values{"name": {"a"}, "public_key": {pub}}, ""},
		"wrong token":  {url.Values{"name": {"a"}, "public_key": {pub}, "csrf": {"x" + csrf}}, ""},
		"another site": {url.Values{"name": {"a"}, "public_key": {pub}, "csrf": {csrf}}, "http://evil.example"},
		"another port": {url.Values{"name": {"a"}, "public_key": {pub}, "csrf": {csrf}}, "http://127.0.0.1:1"},
	} {
		if p := b.post("/console/ssh-keys", tc.form, tc.origin); p.status != http.StatusForbidden {
			t.Fatalf("%s: %d", name, p.status)
		}
	}
	if keys, err := api(t, ctl, ctl.Token).ListSSHKeys(context.Background(), client.ListParams{}); err != nil || len(keys.Data) != 0 {
		t.Fatalf("a refused form made keys: %+v %v", keys, err)
	}

	// The API's message, beside the field it names.
	p = b.post("/console/ssh-keys", url.Values{"name": {"laptop"}, "public_key": {"ssh-rsa nonsense"}, "csrf": {csrf}}, "")
	if p.status != http.StatusBadRequest || !regexp.MustCompile(`id="sshkey-public_key-err">[^<]+</p>`).MatchString(p.body) {
		t.Fatalf("bad key: %d\n%s", p.status, p.body)
	}
	p = b.post("/console/ssh-keys", url.Values{"name": {"laptop"}, "public_key": {pub}, "csrf": {csrf}}, "")
	if p.status != http.StatusSeeOther {
		t.Fatalf("add key: %d\n%s", p.status, p.body)
	}
	if p := b.get("/console/ssh-keys"); !strings.Contains(p.body, "laptop") || !strings.Contains(p.body, "SHA256:") ||
		!strings.Contains(p.body, "SSH key added.") {
		t.Fatalf("ssh keys page after adding:\n%s", p.body)
	}

	// Sign-out revokes: the old cookie no longer works.
	if p := b.post("/console/sign-out", url.Values{"csrf": {csrf}}, ""); p.status != http.StatusSeeOther {
		t.Fatalf("sign-out: %d", p.status)
	}
	replay := newBrowser(t, ctl.URL)
	req, _ := http.NewRequest("GET", ctl.URL+"/console/ssh-keys", nil)
	req.AddCookie(&http.Cookie{Name: "hearth_console", Value: cookie.Value})
	if p := replay.do(req); p.status != http.StatusSeeOther || !strings.HasPrefix(p.location(), "/console/sign-in") {
		t.Fatalf("old session after sign-out: %d %q", p.status, p.location())
	}
}

// A user of project B cannot see or delete project A's server through the
// console: the API's 404, as for any missing server.
func TestProjectIsolation(t *testing.T) {
	ctl := controltest.Start(t, &bins)
	ctl.StartNode(controltest.NodeOptions{})
	idA := createServer(t, ctl, ctl.Token, "alpha")
	tokB := ctl.NewProject("beta")

	a := newBrowser(t, ctl.URL)
	a.signIn(ctl.Token)
	if p := a.get("/console/servers/" + idA); p.status != http.StatusOK || !strings.Contains(p.body, "alpha") {
		t.Fatalf("A's own server: %d", p.status)
	}
	b := newBrowser(t, ctl.URL)
	b.signIn(tokB)
	for _, path := range []string{"/console/servers/" + idA, "/console/servers/" + idA + "/playground", "/console/servers/" + idA + "/delete"} {
		if p := b.get(path); p.status != http.StatusNotFound || strings.Contains(p.body, "alpha") {
			t.Fatalf("B: GET %s: %d\n%s", path, p.status, p.body)
		}
	}
	if p := b.get("/console/servers"); strings.Contains(p.body, idA) || strings.Contains(p.body, "alpha") {
		t.Fatalf("B's list shows A's server:\n%s", p.body)
	}
	if p := b.post("/console/servers/"+idA+"/delete", url.Values{"confirm": {"alpha"}, "csrf": {b.csrf()}}, ""); p.status != http.StatusNotFound {
		t.Fatalf("B deletes A's server: %d", p.status)
	}
	if s, err := api(t, ctl, ctl.Token).GetServer(context.Background(), idA); err != nil || s.Status == client.StatusDeleting {
		t.Fatalf("A's server after B's attempt: %+v %v", s, err)
	}
}

// A read-only token sees everything with its changes disabled, and a
// change it sends anyway is the API's 403, shown on the page.
func TestReadOnly(t *testing.T) {
	ctl := controltest.Start(t, &bins)
	ctl.StartNode(controltest.NodeOptions{})
	id := createServer(t, ctl, ctl.Token, "alpha")
	b := newBrowser(t, ctl.URL)
	b.signIn(ctl.NewToken("default", "viewer", true))
	p := b.get("/console/servers/" + id)
	if p.status != http.StatusOK || !strings.Contains(p.body, "read-only") || strings.Count(p.body, "<fieldset disabled>") < 2 {
		t.Fatalf("read-only server page %d:\n%s", p.status, p.body)
	}
	p = b.post("/console/servers/"+id+"/firewall-rules", url.Values{"direction": {"inbound"}, "protocol": {"tcp"},
		"action": {"allow"}, "port_range": {"22"}, "csrf": {b.csrf()}}, "")
	if p.status != http.StatusForbidden || !strings.Contains(p.body, "read-only") {
		t.Fatalf("read-only write: %d\n%s", p.status, p.body)
	}
	if rules, err := api(t, ctl, ctl.Token).ListFirewallRules(context.Background(), id, client.ListParams{}); err != nil || len(rules.Data) != 0 {
		t.Fatalf("read-only token made rules: %+v %v", rules, err)
	}
}

// A one-time link signs in once.
func TestSignInLink(t *testing.T) {
	ctl := controltest.Start(t, &bins)
	sock := ctl.StateDir + "/admin.sock"
	hc := &http.Client{Transport: &http.Transport{DialContext: unixDialer(sock)}}
	req, _ := http.NewRequest("POST", "http://admin/console/sign-in-links", nil)
	req.Header.Set("Authorization", "Bearer "+ctl.Token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var out struct{ Path string }
	_ = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(out.Path, "/console/sign-in/link?code=") {
		t.Fatalf("link: %d %+v", resp.StatusCode, out)
	}
	b := newBrowser(t, ctl.URL)
	if p := b.get(out.Path); p.status != http.StatusSeeOther || p.location() != "/console/servers" {
		t.Fatalf("link: %d %q", p.status, p.location())
	}
	if p := b.get("/console/servers"); p.status != http.StatusOK {
		t.Fatalf("signed in by link: %d", p.status)
	}
	if p := newBrowser(t, ctl.URL).get(out.Path); p.status != http.StatusNotFound {
		t.Fatalf("link used twice: %d", p.status)
	}
	req, _ = http.NewRequest("POST", "http://admin/console/sign-in-links", nil)
	req.Header.Set("Authorization", "Bearer hearth_wrong")
	if resp, err := hc.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("link for a bad token: %v %v", resp, err)
	}
}

// A token revoked while its session lives ends the session at its next
// page, which sends the user to sign-in and back.
func TestRevokedToken(t *testing.T) {
	ctl := controltest.Start(t, &bins)
	b := newBrowser(t, ctl.URL)
	b.signIn(ctl.NewToken("default", "short-lived", false))
	var toks []struct{ ID, Name string }
	if err := json.Unmarshal([]byte(ctl.CLI("tokens", "list", "--json")), &toks); err != nil {
		t.Fatal(err)
	}
	for _, tok := range toks {
		if tok.Name == "short-lived" {
			ctl.CLI("tokens", "revoke", tok.ID)
		}
	}
	p := b.get("/console/ssh-keys")
	if p.status != http.StatusSeeOther || p.location() != "/console/sign-in?expired=1&next=%2Fconsole%2Fssh-keys" {
		t.Fatalf("revoked token: %d %q", p.status, p.location())
	}
	if p := b.get("/console/servers"); p.status != http.StatusSeeOther || p.location() != "/console/sign-in?next=%2Fconsole%2Fservers" {
		t.Fatalf("after the revoked token: %d %q", p.status, p.location())
	}
}
