package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/client"
)

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	Signed   bool
	CSRF     string
	Project  string
	ReadOnly bool
	Flash    string
	Error    string            // about the page, or a form without a field named
	Errors   map[string]string // "form.param" → the API's message
	Form     url.Values        // the values a refused form is shown again with
	Data     any
	// connect is the extra origin the page's script may fetch from (the
	// playground's deployment API).
	connect string
}

// flash is what a redirect after a change shows once: a message, and a
// created API key's secret.
type flash struct {
	msg, secret, keyID string
}

// view is a session as the handlers use it.
type view struct {
	*session
	id string
}

var funcs = template.FuncMap{
	"deref": func(s *string) string {
		if s == nil {
			return ""
		}
		return *s
	},
	"when": func(t *time.Time) string {
		if t == nil {
			return "never"
		}
		return t.UTC().Format("2006-01-02 15:04 UTC")
	},
	"date": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04 UTC") },
	"has": func(list []string, s string) bool {
		for _, x := range list {
			if x == s {
				return true
			}
		}
		return false
	},
	"diagnose":    client.Diagnose,
	"command":     commandName,
	"actionError": actionError,
	// dict and list build the arguments of the field templates.
	"dict": func(kv ...any) (map[string]any, error) {
		if len(kv)%2 != 0 {
			return nil, errors.New("dict: odd arguments")
		}
		m := make(map[string]any, len(kv)/2)
		for i := 0; i < len(kv); i += 2 {
			k, ok := kv[i].(string)
			if !ok {
				return nil, fmt.Errorf("dict: key %v is not a string", kv[i])
			}
			m[k] = kv[i+1]
		}
		return m, nil
	},
	"list":  func(s ...string) []string { return s },
	"lower": strings.ToLower,
	"plural": func(n int64, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	},
}

// Handler serves the console under /console/.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /console/static/", http.StripPrefix("/console/static/", cacheStatic(http.FileServerFS(static))))
	mux.HandleFunc("GET /console/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/servers", http.StatusSeeOther)
	})
	mux.HandleFunc("GET /console/sign-in", c.signInPage)
	mux.HandleFunc("POST /console/sign-in", c.signIn)
	mux.HandleFunc("GET /console/sign-in/link", c.signInLink)
	mux.HandleFunc("POST /console/sign-out", c.authed(c.signOut))
	mux.HandleFunc("GET /console/servers", c.authed(c.serversPage))
	mux.HandleFunc("GET /console/servers/status", c.authed(c.serversStatus))
	mux.HandleFunc("POST /console/servers", c.authed(c.createServer))
	mux.HandleFunc("GET /console/servers/{id}", c.authed(c.serverPage))
	mux.HandleFunc("GET /console/servers/{id}/delete", c.authed(c.deletePage))
	mux.HandleFunc("POST /console/servers/{id}/delete", c.authed(c.deleteServer))
	mux.HandleFunc("GET /console/servers/{id}/playground", c.authed(c.playgroundPage))
	mux.HandleFunc("POST /console/servers/{id}/api-keys", c.authed(c.createKey))
	mux.HandleFunc("POST /console/servers/{id}/api-keys/{key}/revoke", c.authed(c.revokeKey))
	mux.HandleFunc("POST /console/servers/{id}/firewall-rules", c.authed(c.createRule))
	mux.HandleFunc("POST /console/servers/{id}/firewall-rules/{rule}/delete", c.authed(c.deleteRule))
	mux.HandleFunc("GET /console/ssh-keys", c.authed(c.sshKeysPage))
	mux.HandleFunc("POST /console/ssh-keys", c.authed(c.createSSHKey))
	mux.HandleFunc("POST /console/ssh-keys/{id}/delete", c.authed(c.deleteSSHKey))
	mux.HandleFunc("GET /console/token", c.authed(c.tokenPage))
	mux.HandleFunc("/console/", func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusNotFound, "error", &page{Title: "Not found", Error: "There is no such page."})
	})
	return secureHeaders(mux)
}

// secureHeaders sets the headers every answer of the console carries: no
// framing, no inline script, no sniffing, no caching of pages.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", csp(""))
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		if !strings.HasPrefix(r.URL.Path, "/console/static/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

func csp(connect string) string {
	c := "'self'"
	if connect != "" {
		c += " " + connect
	}
	return "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src " + c +
		"; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'"
}

func cacheStatic(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=300")
		next.ServeHTTP(w, r)
	})
}

// render writes a page.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p *page) {
	t := c.pages[name]
	if t == nil {
		c.log.Error("console: no template", "name", name)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	if p.connect != "" {
		w.Header().Set("Content-Security-Policy", csp(p.connect))
	}
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout.html", p); err != nil {
		c.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// newPage is a signed-in page, with the session's flash taken.
func (v view) newPage(title, nav string) *page {
	p := &page{Title: title, Nav: nav, Signed: true, CSRF: v.csrf, Project: v.ident.ProjectName,
		ReadOnly: v.ident.ReadOnly, Errors: map[string]string{}}
	if p.Project == "" {
		p.Project = v.ident.Project
	}
	return p
}

func (v view) takeFlash() flash {
	v.mu.Lock()
	defer v.mu.Unlock()
	f := v.flash
	v.flash = flash{}
	return f
}

func (v view) setFlash(f flash) {
	v.mu.Lock()
	v.flash = f
	v.mu.Unlock()
}

// authed runs h for a signed-in session. Without one, a page is sent to
// sign-in and back; a change (POST) must also come from the console's own
// origin with the session's CSRF token.
func (c *Console) authed(h func(http.ResponseWriter, *http.Request, view)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var ss *session
		var id string
		if ck, err := r.Cookie(cookieName); err == nil {
			id = ck.Value
			ss = c.sessions.get(id)
		}
		post := r.Method == http.MethodPost
		if post {
			r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
			if !sameOrigin(r) {
				c.render(w, r, http.StatusForbidden, "error", &page{Title: "Refused",
					Error: "This form was sent from another site, so it was refused."})
				return
			}
		}
		if ss == nil {
			if strings.HasSuffix(r.URL.Path, "/status") {
				w.WriteHeader(http.StatusUnauthorized) // the polling script signs in again
				return
			}
			http.Redirect(w, r, "/console/sign-in?next="+url.QueryEscape(returnTo(r)), http.StatusSeeOther)
			return
		}
		v := view{session: ss, id: id}
		if post && !validCSRF(r, ss) {
			c.render(w, r, http.StatusForbidden, "error", v.errorPage("Refused",
				"This form has expired or was not sent by this console; reload the page and try again."))
			return
		}
		h(w, r, v)
	}
}

// returnTo is where a user sent to sign-in comes back to: the page asked
// for, or for a form the page it was on.
func returnTo(r *http.Request) string {
	if r.Method == http.MethodGet {
		return r.URL.RequestURI()
	}
	if ref, err := url.Parse(r.Referer()); err == nil && strings.HasPrefix(ref.Path, "/console/") {
		return ref.RequestURI()
	}
	return "/console/servers"
}

func (v view) errorPage(title, msg string) *page {
	p := v.newPage(title, "")
	p.Error = msg
	return p
}

// formFields are the inputs of each form, named as the API's fields, so
// that an error's param marks the input it is about.
var formFields = map[string][]string{
	"create": {"name", "model", "chip", "ram", "storage", "ssh_key_ids"},
	"key":    {"name", "requests_per_minute", "tokens_per_minute", "expires_at"},
	"rule":   {"direction", "protocol", "action", "port_range", "source", "destination", "description"},
	"sshkey": {"name", "public_key"},
}

// fail shows an API error: a revoked token ends the session, a missing
// resource is a 404 page; any other error is shown on the page again
// renders (nil: an error page), beside the input its param names.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, v view, err error, form string, again func(*page) (string, *page)) {
	var ae client.APIError
	if !errors.As(err, &ae) {
		c.log.Error("console: API call", "err", err)
		c.render(w, r, http.StatusBadGateway, "error", v.errorPage("Error", "The management API could not be reached; try again."))
		return
	}
	switch {
	case ae.StatusCode == http.StatusUnauthorized:
		c.sessions.revoke(v.id)
		clearSessionCookie(w, r)
		http.Redirect(w, r, "/console/sign-in?expired=1&next="+url.QueryEscape(returnTo(r)), http.StatusSeeOther)
		return
	case ae.StatusCode == http.StatusNotFound && (again == nil || ae.Param == "" || ae.Param == "id" || ae.Param == "server_id"):
		c.render(w, r, http.StatusNotFound, "error", v.errorPage("Not found", ae.Message))
		return
	}
	status := ae.StatusCode
	if status < 400 || status >= 500 {
		status = http.StatusBadGateway
	}
	if again == nil {
		c.render(w, r, status, "error", v.errorPage("Error", ae.Message))
		return
	}
	name, p := again(v.newPage("", ""))
	if p == nil {
		return // again wrote the answer
	}
	p.Form = r.PostForm
	msg := ae.Message
	if ae.RetryAfter > 0 {
		msg += fmt.Sprintf(" (retry in %s)", ae.RetryAfter.Round(time.Second))
	}
	if slices.Contains(formFields[form], ae.Param) {
		p.Errors[form+"."+ae.Param] = msg
		p.Errors[form] = "Check the field marked below."
	} else {
		p.Errors[form] = msg
	}
	c.render(w, r, status, name, p)
}

func (c *Console) signInPage(w http.ResponseWriter, r *http.Request) {
	p := &page{Title: "Sign in", Errors: map[string]string{}, Form: url.Values{"next": {safeNext(r.URL.Query().Get("next"))}}}
	switch {
	case r.URL.Query().Get("expired") != "":
		p.Flash = "Your session ended; sign in again to continue."
	case r.URL.Query().Get("signed_out") != "":
		p.Flash = "You are signed out."
	}
	c.render(w, r, http.StatusOK, "signin", p)
}

// safeNext keeps a return address inside the console.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/console/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/console/servers"
	}
	return next
}

func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 16<<10)
	if !sameOrigin(r) {
		c.render(w, r, http.StatusForbidden, "error", &page{Title: "Refused", Error: "This form was sent from another site, so it was refused."})
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	if err := c.startSession(w, r, token); err != nil {
		p := &page{Title: "Sign in", Errors: map[string]string{"signin.token": err.Error()}, Form: url.Values{"next": {next}}}
		c.render(w, r, http.StatusUnauthorized, "signin", p)
		return
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) startSession(w http.ResponseWriter, r *http.Request, token string) error {
	if token == "" {
		return errors.New("enter a project token")
	}
	ident, err := c.cfg.Identify(token)
	if err != nil {
		if errors.Is(err, ErrInvalidToken) {
			return errors.New("this token is not valid: it may be mistyped or revoked")
		}
		c.log.Error("console: sign-in", "err", err)
		return errors.New("the control plane could not check the token; try again")
	}
	api, err := client.New("http://127.0.0.1", client.WithToken(token), client.WithRetries(0, 0, 0),
		client.WithUserAgent("hearth-console"), client.WithHTTPClient(&http.Client{Transport: handlerTransport{c.cfg.API}}))
	if err != nil {
		return err
	}
	// A new sign-in replaces the browser's session, if it had one.
	if ck, err := r.Cookie(cookieName); err == nil {
		c.sessions.revoke(ck.Value)
	}
	id, _ := c.sessions.create(token, ident, api)
	setSessionCookie(w, r, id, c.cfg.MaxAge)
	return nil
}

func (c *Console) signInLink(w http.ResponseWriter, r *http.Request) {
	token, ok := c.links.redeem(r.URL.Query().Get("code"))
	if !ok {
		c.render(w, r, http.StatusNotFound, "signin", &page{Title: "Sign in", Errors: map[string]string{},
			Form: url.Values{"next": {"/console/servers"}}, Error: "This sign-in link was used already or has expired; sign in with a token."})
		return
	}
	if err := c.startSession(w, r, token); err != nil {
		c.render(w, r, http.StatusUnauthorized, "signin", &page{Title: "Sign in", Errors: map[string]string{},
			Form: url.Values{"next": {"/console/servers"}}, Error: err.Error()})
		return
	}
	http.Redirect(w, r, "/console/servers", http.StatusSeeOther)
}

// SignInLink returns the path (under /console/) of a one-time link that
// signs a browser in with token; it is valid once, for Config.LinkTTL.
func (c *Console) SignInLink(token string) (string, error) {
	if _, err := c.cfg.Identify(token); err != nil {
		return "", err
	}
	return "/console/sign-in/link?code=" + c.links.issue(token), nil
}

// AdminHandler serves POST /console/sign-in-links on the control plane's
// admin socket: the bearer token's one-time sign-in link, as JSON
// {"path": …}.
func (c *Console) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /console/sign-in-links", func(w http.ResponseWriter, r *http.Request) {
		tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		path, err := c.SignInLink(strings.TrimSpace(tok))
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]string{"path": path})
	})
	return mux
}

func (c *Console) signOut(w http.ResponseWriter, r *http.Request, v view) {
	c.sessions.revoke(v.id)
	clearSessionCookie(w, r)
	http.Redirect(w, r, "/console/sign-in?signed_out=1", http.StatusSeeOther)
}

func (c *Console) tokenPage(w http.ResponseWriter, r *http.Request, v view) {
	p := v.newPage("Token", "token")
	p.Data = map[string]any{"ProjectID": v.ident.Project, "Created": v.created,
		"Ends": v.created.Add(c.cfg.MaxAge), "Idle": fmt.Sprintf("%.0f minutes", c.cfg.IdleTimeout.Minutes())}
	c.render(w, r, http.StatusOK, "token", p)
}

// ctx bounds an API call of a page.
func ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}

// collect reads every item of a list, up to max.
func collect[T any](seq func(yield func(T, error) bool), max int) ([]T, error) {
	var out []T
	for x, err := range seq {
		if err != nil {
			return out, err
		}
		out = append(out, x)
		if len(out) >= max {
			break
		}
	}
	return out, nil
}

const maxList = 500

// serversData is the servers page.
type serversData struct {
	Servers []client.Server
	SSHKeys []client.SSHKey
}

func (c *Console) serversData(r *http.Request, v view) (serversData, error) {
	cx, cancel := ctx(r)
	defer cancel()
	var d serversData
	var err error
	if d.Servers, err = collect(v.api.AllServers(cx, client.ListServersParams{ListParams: client.ListParams{Limit: 100}}), maxList); err != nil {
		return d, err
	}
	d.SSHKeys, err = collect(v.api.AllSSHKeys(cx, client.ListParams{Limit: 100}), maxList)
	return d, err
}

func (c *Console) serversPage(w http.ResponseWriter, r *http.Request, v view) {
	d, err := c.serversData(r, v)
	if err != nil {
		c.fail(w, r, v, err, "", nil)
		return
	}
	p := v.newPage("Servers", "servers")
	p.Flash = v.takeFlash().msg
	p.Form = url.Values{"chip": {"cpu"}, "ram": {"4"}, "storage": {"20"}}
	p.Data = d
	c.render(w, r, http.StatusOK, "servers", p)
}

// serverStatus is one server's live status, as the pages' script polls it.
type serverStatus struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

func (c *Console) serversStatus(w http.ResponseWriter, r *http.Request, v view) {
	cx, cancel := ctx(r)
	defer cancel()
	var out []serverStatus
	add := func(s client.Server) {
		d := ""
		if s.Status != client.StatusRunning {
			d = client.Diagnose(s)
		}
		out = append(out, serverStatus{ID: s.ID, Status: string(s.Status), Detail: d})
	}
	if id := r.URL.Query().Get("id"); id != "" {
		s, err := v.api.GetServer(cx, id)
		if err != nil {
			statusError(w, err)
			return
		}
		add(s)
	} else {
		list, err := collect(v.api.AllServers(cx, client.ListServersParams{ListParams: client.ListParams{Limit: 100}}), maxList)
		if err != nil {
			statusError(w, err)
			return
		}
		for _, s := range list {
			add(s)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

func statusError(w http.ResponseWriter, err error) {
	var ae client.APIError
	code := http.StatusBadGateway
	if errors.As(err, &ae) {
		code = ae.StatusCode
	}
	w.WriteHeader(code)
}

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.TrimSpace(s))
	return n
}

func (c *Console) createServer(w http.ResponseWriter, r *http.Request, v view) {
	f := r.PostForm
	req := client.CreateServerRequest{Name: strings.TrimSpace(f.Get("name")), Chip: strings.TrimSpace(f.Get("chip")),
		RAM: atoi(f.Get("ram")), Storage: atoi(f.Get("storage")), Stack: client.StackDeployment,
		Model: strings.TrimSpace(f.Get("model")), Billing: client.BillingMonthly, SSHKeyIDs: f["ssh_key_ids"]}
	cx, cancel := ctx(r)
	defer cancel()
	s, err := v.api.CreateServer(cx, req)
	if err != nil {
		c.fail(w, r, v, err, "create", func(p *page) (string, *page) {
			d, derr := c.serversData(r, v)
			if derr != nil {
				c.fail(w, r, v, derr, "", nil)
				return "", nil
			}
			p.Title, p.Nav, p.Data = "Servers", "servers", d
			return "servers", p
		})
		return
	}
	v.setFlash(flash{msg: fmt.Sprintf("Server %s is being created.", s.Name)})
	http.Redirect(w, r, "/console/servers/"+url.PathEscape(s.ID), http.StatusSeeOther)
}

// serverData is a server's page.
type serverData struct {
	Server  client.Server
	Keys    []client.APIKey
	Rules   []client.FirewallRule
	SSHKeys []client.SSHKey
	// Requests, PromptTokens and CompletionTokens sum the keys'
	// cumulative counters.
	Requests, PromptTokens, CompletionTokens int64
	Usage                                    usageChart
	// Actions are the latest changes to the server, newest first;
	// MoreActions says there are older ones.
	Actions             []client.ServerAction
	MoreActions         bool
	Secret, SecretKeyID string
	Snippets            []snippet
}

type snippet struct{ ID, Lang, Code string }

func (c *Console) serverData(r *http.Request, v view, id string) (serverData, error) {
	cx, cancel := ctx(r)
	defer cancel()
	var d serverData
	var err error
	if d.Server, err = v.api.GetServer(cx, id); err != nil {
		return d, err
	}
	if d.Keys, err = collect(v.api.AllAPIKeys(cx, id, client.ListParams{Limit: 100}), maxList); err != nil {
		return d, err
	}
	if d.Rules, err = collect(v.api.AllFirewallRules(cx, id, client.ListParams{Limit: 100}), maxList); err != nil {
		return d, err
	}
	keys, err := collect(v.api.AllSSHKeys(cx, client.ListParams{Limit: 100}), maxList)
	if err != nil {
		return d, err
	}
	for _, k := range keys {
		for _, want := range d.Server.SSHKeyIDs {
			if k.ID == want {
				d.SSHKeys = append(d.SSHKeys, k)
			}
		}
	}
	for _, k := range d.Keys {
		d.Requests += k.Requests
		d.PromptTokens += k.PromptTokens
		d.CompletionTokens += k.CompletionTokens
	}
	acts, err := v.api.ListServerActions(cx, id, client.ListParams{Limit: actionsShown})
	if err != nil {
		return d, err
	}
	d.Actions, d.MoreActions = acts.Data, acts.HasMore
	d.Usage = usageOf(cx, v.api, id, windowOf(r.URL.Query()), c.cfg.Now())
	if d.Usage.err != nil {
		c.log.Warn("console: usage over time", "server", id, "err", d.Usage.err)
	}
	d.Snippets = snippets(d.Server)
	return d, nil
}

// snippets are ready-to-paste calls of the deployment in Python, Node and
// curl, with the key read from the environment.
func snippets(s client.Server) []snippet {
	if s.DeploymentURL == "" {
		return nil
	}
	u, m := s.DeploymentURL, s.Model
	return []snippet{
		{"snippet-python", "Python", fmt.Sprintf(`import os
from openai import OpenAI

client = OpenAI(base_url=%q, api_key=os.environ["HEARTH_API_KEY"])
stream = client.chat.completions.create(
    model=%q,
    messages=[{"role": "user", "content": "Hello"}],
    stream=True,
)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="")
`, u, m)},
		{"snippet-node", "Node", fmt.Sprintf(`import OpenAI from "openai";

const client = new OpenAI({ baseURL: %q, apiKey: process.env.HEARTH_API_KEY });
const stream = await client.chat.completions.create({
  model: %q,
  messages: [{ role: "user", content: "Hello" }],
  stream: true,
});
for await (const chunk of stream) process.stdout.write(chunk.choices[0]?.delta?.content ?? "");
`, u, m)},
		{"snippet-curl", "curl", fmt.Sprintf(`curl -sN %s/chat/completions \
  -H "Authorization: Bearer $HEARTH_API_KEY" -H "Content-Type: application/json" \
  -d '{"model":%q,"stream":true,"messages":[{"role":"user","content":"Hello"}]}'
`, u, m)},
	}
}

func (c *Console) serverPage(w http.ResponseWriter, r *http.Request, v view) {
	c.showServer(w, r, v, http.StatusOK, nil)
}

// showServer renders a server's page; edit, if set, marks a refused form.
func (c *Console) showServer(w http.ResponseWriter, r *http.Request, v view, status int, edit func(*page)) {
	d, err := c.serverData(r, v, r.PathValue("id"))
	if err != nil {
		c.fail(w, r, v, err, "", nil)
		return
	}
	p := v.newPage(d.Server.Name, "servers")
	f := v.takeFlash()
	p.Flash, d.Secret, d.SecretKeyID = f.msg, f.secret, f.keyID
	p.Form = url.Values{"direction": {"inbound"}, "protocol": {"tcp"}, "action": {"allow"}}
	p.Data = d
	if edit != nil {
		edit(p)
	}
	c.render(w, r, status, "server", p)
}

// serverAgain is fail's re-render of a server's page.
func (c *Console) serverAgain(w http.ResponseWriter, r *http.Request, v view) func(*page) (string, *page) {
	return func(p *page) (string, *page) {
		d, err := c.serverData(r, v, r.PathValue("id"))
		if err != nil {
			c.fail(w, r, v, err, "", nil)
			return "", nil
		}
		p.Title, p.Nav, p.Data = d.Server.Name, "servers", d
		return "server", p
	}
}

func (c *Console) deletePage(w http.ResponseWriter, r *http.Request, v view) {
	cx, cancel := ctx(r)
	defer cancel()
	s, err := v.api.GetServer(cx, r.PathValue("id"))
	if err != nil {
		c.fail(w, r, v, err, "", nil)
		return
	}
	p := v.newPage("Delete "+s.Name, "servers")
	p.Data = s
	c.render(w, r, http.StatusOK, "delete", p)
}

func (c *Console) deleteServer(w http.ResponseWriter, r *http.Request, v view) {
	cx, cancel := ctx(r)
	defer cancel()
	s, err := v.api.GetServer(cx, r.PathValue("id"))
	if err != nil {
		c.fail(w, r, v, err, "", nil)
		return
	}
	if strings.TrimSpace(r.PostFormValue("confirm")) != s.Name {
		p := v.newPage("Delete "+s.Name, "servers")
		p.Data = s
		p.Errors["delete.confirm"] = fmt.Sprintf("Type the server's name, %s, to delete it.", s.Name)
		c.render(w, r, http.StatusBadRequest, "delete", p)
		return
	}
	if err := v.api.DeleteServer(cx, s.ID); err != nil {
		c.fail(w, r, v, err, "", nil)
		return
	}
	v.setFlash(flash{msg: fmt.Sprintf("Server %s is being deleted: its node wipes its keys, rules and model.", s.Name)})
	http.Redirect(w, r, "/console/servers", http.StatusSeeOther)
}

func (c *Console) createKey(w http.ResponseWriter, r *http.Request, v view) {
	f := r.PostForm
	req := client.CreateAPIKeyRequest{Name: strings.TrimSpace(f.Get("name")),
		RequestsPerMinute: atoi(f.Get("requests_per_minute")), TokensPerMinute: atoi(f.Get("tokens_per_minute"))}
	playground := f.Get("to") == "playground"
	again := c.serverAgain(w, r, v)
	if playground {
		again = c.playgroundAgain(w, r, v)
	}
	if e := strings.TrimSpace(f.Get("expires_at")); e != "" {
		t, err := time.ParseInLocation("2006-01-02T15:04", e, time.UTC)
		if err != nil {
			name, p := again(v.newPage("", ""))
			if p == nil {
				return
			}
			p.Form = f
			p.Errors["key.expires_at"] = "Give the expiry as a date and time (UTC)."
			p.Errors["key"] = "Check the field marked below."
			c.render(w, r, http.StatusBadRequest, name, p)
			return
		}
		req.ExpiresAt = &t
	}
	cx, cancel := ctx(r)
	defer cancel()
	k, err := v.api.CreateAPIKey(cx, r.PathValue("id"), req)
	if err != nil {
		c.fail(w, r, v, err, "key", again)
		return
	}
	secret := ""
	if k.Key != nil {
		secret = *k.Key
	}
	v.setFlash(flash{msg: fmt.Sprintf("API key %s created.", k.Name), secret: secret, keyID: k.ID})
	dest := "/console/servers/" + url.PathEscape(r.PathValue("id"))
	if playground {
		dest += "/playground"
	}
	http.Redirect(w, r, dest+"#api-keys", http.StatusSeeOther)
}

func (c *Console) createRule(w http.ResponseWriter, r *http.Request, v view) {
	f := r.PostForm
	req := client.CreateFirewallRuleRequest{Direction: client.Direction(f.Get("direction")), Protocol: client.Protocol(f.Get("protocol")),
		PortRange: strings.TrimSpace(f.Get("port_range")), Source: strings.TrimSpace(f.Get("source")),
		Destination: strings.TrimSpace(f.Get("destination")), Action: client.Action(f.Get("action")),
		Description: strings.TrimSpace(f.Get("description"))}
	cx, cancel := ctx(r)
	defer cancel()
	if _, err := v.api.CreateFirewallRule(cx, r.PathValue("id"), req); err != nil {
		c.fail(w, r, v, err, "rule", c.serverAgain(w, r, v))
		return
	}
	v.setFlash(flash{msg: "Firewall rule added."})
	http.Redirect(w, r, "/console/servers/"+url.PathEscape(r.PathValue("id"))+"#firewall", http.StatusSeeOther)
}

// playgroundData is the playground of a server.
type playgroundData struct {
	Server client.Server
	Secret string
}

func (c *Console) playgroundAgain(w http.ResponseWriter, r *http.Request, v view) func(*page) (string, *page) {
	return func(p *page) (string, *page) {
		cx, cancel := ctx(r)
		defer cancel()
		s, err := v.api.GetServer(cx, r.PathValue("id"))
		if err != nil {
			c.fail(w, r, v, err, "", nil)
			return "", nil
		}
		p.Title, p.Nav, p.Data = "Playground: "+s.Name, "servers", playgroundData{Server: s}
		p.connect = originOf(s.DeploymentURL)
		return "playground", p
	}
}

func originOf(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" || (p.Scheme != "http" && p.Scheme != "https") {
		return ""
	}
	return p.Scheme + "://" + p.Host
}

func (c *Console) playgroundPage(w http.ResponseWriter, r *http.Request, v view) {
	name, p := c.playgroundAgain(w, r, v)(v.newPage("", ""))
	if p == nil {
		return
	}
	f := v.takeFlash()
	p.Flash = f.msg
	d := p.Data.(playgroundData)
	d.Secret = f.secret
	p.Data = d
	c.render(w, r, http.StatusOK, name, p)
}

func (c *Console) sshKeysPage(w http.ResponseWriter, r *http.Request, v view) {
	c.showSSHKeys(w, r, v, http.StatusOK, nil)
}

func (c *Console) showSSHKeys(w http.ResponseWriter, r *http.Request, v view, status int, p *page) {
	cx, cancel := ctx(r)
	defer cancel()
	keys, err := collect(v.api.AllSSHKeys(cx, client.ListParams{Limit: 100}), maxList)
	if err != nil {
		c.fail(w, r, v, err, "", nil)
		return
	}
	if p == nil {
		p = v.newPage("SSH keys", "ssh-keys")
		p.Flash = v.takeFlash().msg
	}
	p.Title, p.Nav, p.Data = "SSH keys", "ssh-keys", keys
	c.render(w, r, status, "sshkeys", p)
}

func (c *Console) createSSHKey(w http.ResponseWriter, r *http.Request, v view) {
	cx, cancel := ctx(r)
	defer cancel()
	_, err := v.api.CreateSSHKey(cx, client.CreateSSHKeyRequest{Name: strings.TrimSpace(r.PostFormValue("name")),
		PublicKey: strings.TrimSpace(r.PostFormValue("public_key"))})
	if err != nil {
		c.fail(w, r, v, err, "sshkey", func(p *page) (string, *page) {
			keys, lerr := collect(v.api.AllSSHKeys(cx, client.ListParams{Limit: 100}), maxList)
			if lerr != nil {
				c.fail(w, r, v, lerr, "", nil)
				return "", nil
			}
			p.Title, p.Nav, p.Data = "SSH keys", "ssh-keys", keys
			return "sshkeys", p
		})
		return
	}
	v.setFlash(flash{msg: "SSH key added."})
	http.Redirect(w, r, "/console/ssh-keys", http.StatusSeeOther)
}

// remove runs a deletion through the API and goes back to dest, saying
// msg.
func (c *Console) remove(del func(context.Context) error, msg, dest string) func(http.ResponseWriter, *http.Request, view) {
	return func(w http.ResponseWriter, r *http.Request, v view) {
		cx, cancel := ctx(r)
		defer cancel()
		if err := del(cx); err != nil {
			c.fail(w, r, v, err, "", nil)
			return
		}
		v.setFlash(flash{msg: msg})
		http.Redirect(w, r, dest, http.StatusSeeOther)
	}
}

func (c *Console) revokeKey(w http.ResponseWriter, r *http.Request, v view) {
	id := r.PathValue("id")
	c.remove(func(cx context.Context) error { return v.api.DeleteAPIKey(cx, id, r.PathValue("key")) },
		"API key revoked: the node refuses it from its next update.", "/console/servers/"+url.PathEscape(id)+"#api-keys")(w, r, v)
}

func (c *Console) deleteRule(w http.ResponseWriter, r *http.Request, v view) {
	id := r.PathValue("id")
	c.remove(func(cx context.Context) error { return v.api.DeleteFirewallRule(cx, id, r.PathValue("rule")) },
		"Firewall rule deleted.", "/console/servers/"+url.PathEscape(id)+"#firewall")(w, r, v)
}

func (c *Console) deleteSSHKey(w http.ResponseWriter, r *http.Request, v view) {
	c.remove(func(cx context.Context) error { return v.api.DeleteSSHKey(cx, r.PathValue("id")) },
		"SSH key deleted.", "/console/ssh-keys")(w, r, v)
}
