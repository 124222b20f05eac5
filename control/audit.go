package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/internal/textcheck"
	"github.com/hearthd/hearth/store"
)

// The audit log. Every mutating request of the management API that a
// token was let in for (all but 401 and 429) leaves an entry: who (the
// token's ID and name, never its secret), what (method, path, the
// resources named or made, the actions started), when, from where (the
// peer's address) and the answer's status. An entry of a change that
// succeeded is written in the change's own batch, so the one is never
// without the other; a refused or failed request's entry is written
// after its answer, on its own. Records, newest last in key order:
//
//	ctl/aud/<project>/log/<time>/<entry id>                       the entry
//	ctl/aud/<project>/tok/<token id>/<time>/<entry id>            → the entry's key
//	ctl/aud/<project>/res/<resource id>/<time>/<entry id>         → the entry's key
//
// where time is Unix nanoseconds, zero-padded: the log is filtered by time
// with a scan's bounds, by token or resource through their index.
const (
	pfxAudit    = "ctl/aud/"
	prefixAudit = "aud_"
	// maxAuditPath bounds the path an entry keeps.
	maxAuditPath = 512
)

type auditKeys string

func auditKeysOf(project string) auditKeys { return auditKeys(pfxAudit + project + "/") }

func (k auditKeys) log() string                { return string(k) + "log/" }
func (k auditKeys) token(id string) string     { return string(k) + "tok/" + id + "/" }
func (k auditKeys) resource(id string) string  { return string(k) + "res/" + id + "/" }
func timeKey(at time.Time, id string) string   { return fmt.Sprintf("%020d/%s", at.UnixNano(), id) }
func (k auditKeys) entry(a auditRec) string    { return k.log() + timeKey(a.At, a.ID) }
func (k auditKeys) entryTok(a auditRec) string { return k.token(a.TokenID) + timeKey(a.At, a.ID) }

// auditRec is an entry, as stored and as the API shows it (auditOut).
type auditRec struct {
	ID          string    `json:"id"`
	At          time.Time `json:"time"`
	TokenID     string    `json:"token_id"`
	TokenName   string    `json:"token_name"`
	Method      string    `json:"method"`
	Path        string    `json:"path"`
	Status      int       `json:"status"`
	RequestID   string    `json:"request_id"`
	Source      string    `json:"source_ip"`
	ResourceIDs []string  `json:"resource_ids"`
	ActionIDs   []string  `json:"action_ids"`
}

// auditOut is an entry as the API shows it: lists never null.
func auditOut(a auditRec) auditRec {
	a.At = a.At.UTC()
	if a.ResourceIDs == nil {
		a.ResourceIDs = []string{}
	}
	if a.ActionIDs == nil {
		a.ActionIDs = []string{}
	}
	return a
}

// auditInfo is what a mutating request's entry says besides its outcome.
type auditInfo struct {
	tokenName string
	method    string
	path      string
	source    string
	// staged is set once the entry is staged in the request's change.
	staged bool
}

// anyID matches what may be a resource's ID: a path's part is kept as a
// resource only if it looks like one.
var anyID = regexp.MustCompile(`^[a-z]+_[0-9A-Za-z]{24}$`)

// pathParams are the path parameters that name resources.
var pathParams = []string{"id", "server_id", "key_id", "rule_id"}

func newAuditInfo(r *http.Request, tok tokenRec) *auditInfo {
	src := r.RemoteAddr
	if host, _, err := net.SplitHostPort(src); err == nil {
		src = host
	}
	return &auditInfo{tokenName: tok.Name, method: r.Method, path: textcheck.Clip(redactPath(r.URL.Path), maxAuditPath),
		source: src}
}

// secretPrefixes begin the secrets this API issues or takes.
var secretPrefixes = []string{apiKeySecret, secretAPIToken, secretEnrollment, secretNode}

// redactPath cuts a secret pasted into a path (an API key where its ID
// belongs) to its prefix: the log keeps no secret, even one sent by
// mistake.
func redactPath(path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		for _, pre := range secretPrefixes {
			if strings.HasPrefix(p, pre) && len(p) > len(pre) {
				parts[i] = pre + "…"
			}
		}
	}
	return strings.Join(parts, "/")
}

// auditRecord is the entry of rc's request answered with status.
func (rc *reqCtx) auditRecord(r *http.Request, status int, at time.Time) auditRec {
	a := auditRec{ID: newID(prefixAudit), At: rc.s.auditStamp(at), TokenID: rc.tokenID, TokenName: rc.audit.tokenName,
		Method: rc.audit.method, Path: rc.audit.path, Status: status, RequestID: rc.requestID, Source: rc.audit.source,
		ActionIDs: rc.actions}
	for _, p := range pathParams {
		if v := r.PathValue(p); anyID.MatchString(v) && !slices.Contains(a.ResourceIDs, v) {
			a.ResourceIDs = append(a.ResourceIDs, v)
		}
	}
	for _, id := range rc.resources {
		if !slices.Contains(a.ResourceIDs, id) {
			a.ResourceIDs = append(a.ResourceIDs, id)
		}
	}
	return a
}

// auditStamp is an entry's time: at, or a nanosecond after the last one
// this process gave, so that a process's entries order as they were made
// (a clock's reading may repeat).
func (s *Server) auditStamp(at time.Time) time.Time {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	if !at.After(s.auditLast) {
		at = s.auditLast.Add(time.Nanosecond)
	}
	s.auditLast = at
	return at
}

// replayed notes the resources and actions of an answer replayed for an
// Idempotency-Key: the entry of the replay names those of the first.
func (rc *reqCtx) replayed(body []byte) {
	var made struct {
		ID      string          `json:"id"`
		Action  json.RawMessage `json:"action"` // a firewall rule's is a string
		Started json.RawMessage `json:"started_action"`
	}
	if json.Unmarshal(body, &made) != nil {
		return
	}
	if anyID.MatchString(made.ID) {
		rc.resources = append(rc.resources, made.ID)
	}
	for _, raw := range []json.RawMessage{made.Action, made.Started} {
		var act struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(raw, &act) == nil && validID(act.ID, prefixAction) {
			rc.actions = append(rc.actions, act.ID)
		}
	}
}

// putAudit stages an entry with its index entries through put.
func putAudit(project string, a auditRec, put func(key string, v any) error) error {
	ak := auditKeysOf(project)
	key := ak.entry(a)
	if err := put(key, a); err != nil {
		return err
	}
	if err := put(ak.entryTok(a), key); err != nil {
		return err
	}
	for _, res := range a.ResourceIDs {
		if err := put(ak.resource(res)+timeKey(a.At, a.ID), key); err != nil {
			return err
		}
	}
	return nil
}

// stageAudit stages the entry of a request that succeeded in its change.
func (s *Server) stageAudit(r *http.Request, rc *reqCtx, status int) error {
	if rc.audit == nil {
		return nil
	}
	m := rc.mutation()
	if err := putAudit(rc.project, rc.auditRecord(r, status, rc.now), m.put); err != nil {
		return err
	}
	rc.audit.staged = true
	return nil
}

// auditAfter writes the entry of a request whose change did not carry it
// (refused, failed, or an Idempotency-Key's replay), after its answer;
// not for the answers without a token let in (401, 429) nor for a
// database out of reach (503: it could not be written either).
func (s *Server) auditAfter(r *http.Request, rc *reqCtx, sw *statusWriter) {
	status := sw.status
	if status == 0 {
		status = http.StatusOK
	}
	if status == http.StatusServiceUnavailable || (rc.audit.staged && status < 400) {
		return
	}
	b := s.st.NewBatch()
	err := putAudit(rc.project, rc.auditRecord(r, status, s.now()), b.Put)
	if err == nil {
		err = b.Commit()
	} else {
		b.Discard()
	}
	if err != nil {
		s.log.Error("write audit log entry", "request_id", rc.requestID, "err", err)
	}
}

// statusWriter notes the status a handler answers with.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// auditFilter is a listing's filter: a window [from, until) and a token
// or a resource.
type auditFilter struct {
	from, until time.Time
	token       string
	resource    string
}

func parseAuditFilter(r *http.Request) (auditFilter, *apiError) {
	q := r.URL.Query()
	var f auditFilter
	for _, p := range []struct {
		name string
		at   *time.Time
	}{{"start", &f.from}, {"end", &f.until}} {
		if !q.Has(p.name) {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, q.Get(p.name))
		if err != nil || len(q[p.name]) != 1 {
			return f, invalid(p.name, "%s must be an RFC 3339 time such as 2030-01-02T15:04:05Z", p.name)
		}
		*p.at = t
	}
	if !f.from.IsZero() && !f.until.IsZero() && !f.from.Before(f.until) {
		return f, invalid("start", "start must be before end")
	}
	if q.Has("token_id") {
		f.token = q.Get("token_id")
		if !validID(f.token, prefixAPIToken) || len(q["token_id"]) != 1 {
			return f, invalid("token_id", "token_id must be an API token's ID (tok_…)")
		}
	}
	if q.Has("resource_id") {
		f.resource = q.Get("resource_id")
		if !anyID.MatchString(f.resource) || len(q["resource_id"]) != 1 {
			return f, invalid("resource_id", "resource_id must be a resource's ID, such as srv_… or act_…")
		}
	}
	return f, nil
}

// index is the index the filter scans, and whether its entries point to
// the log (an index) or are the log.
func (f auditFilter) index(ak auditKeys) (prefix string, indirect bool) {
	switch {
	case f.resource != "":
		return ak.resource(f.resource), true
	case f.token != "":
		return ak.token(f.token), true
	}
	return ak.log(), false
}

// bounds are the filter's window as scan bounds under prefix.
func (f auditFilter) bounds(prefix string) (from, until string) {
	if !f.from.IsZero() {
		from = prefix + fmt.Sprintf("%020d", f.from.UnixNano())
	}
	if !f.until.IsZero() {
		until = prefix + fmt.Sprintf("%020d", f.until.UnixNano())
	}
	return from, until
}

func (s *Server) listAudit(r *http.Request, rc *reqCtx) (result, error) {
	p, e := parsePage(r, "start", "end", "token_id", "resource_id")
	if e != nil {
		return result{}, e
	}
	f, e := parseAuditFilter(r)
	if e != nil {
		return result{}, e
	}
	body, err := s.auditPage(rc.project, f, p)
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: body}, nil
}

// auditPage is a page of a project's log, newest first, filtered.
func (s *Server) auditPage(project string, f auditFilter, p page) (listBody, error) {
	ak := auditKeysOf(project)
	prefix, indirect := f.index(ak)
	from, until := f.bounds(prefix)
	return s.scanPageIn(prefix, p, from, until, func(_ string, val []byte) (any, bool, error) {
		a, err := s.auditEntry(val, indirect)
		if err != nil || a == nil {
			return nil, false, err
		}
		if f.token != "" && a.TokenID != f.token {
			return nil, false, nil
		}
		return auditOut(*a), true, nil
	})
}

// auditEntry decodes an entry, or the entry an index entry points to (nil
// if gone).
func (s *Server) auditEntry(val []byte, indirect bool) (*auditRec, error) {
	var a auditRec
	if !indirect {
		if err := json.Unmarshal(val, &a); err != nil {
			return nil, fmt.Errorf("decode audit entry: %w", err)
		}
		return &a, nil
	}
	var key string
	if err := json.Unmarshal(val, &key); err != nil {
		return nil, fmt.Errorf("decode audit index entry: %w", err)
	}
	if err := s.st.Get(key, &a); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	return &a, nil
}

// AuditEntry is an audit log entry for operators: the API's, with the
// project.
type AuditEntry struct {
	Project string `json:"project"`
	auditRec
}

// ListAudit returns the newest entries of every project's audit log (or
// of project, an ID or a name), up to limit, newest first, from before
// until (zero: now) back to since (zero: the beginning): what
// `hearth-control audit-log` shows.
func ListAudit(st store.KV, project string, since, until time.Time, limit int) ([]AuditEntry, error) {
	var projects []projectRec
	err := store.ScanJSON(st, pfxProject, func(_ string, p projectRec) (bool, error) {
		if project == "" || p.ID == project || p.Name == project {
			projects = append(projects, p)
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	if project != "" && len(projects) == 0 {
		return nil, opErr(ErrUnknownProject, "no project %q (give a project ID or name; see projects list)", project)
	}
	// The newest limit of each project, then the newest limit of those.
	out := []AuditEntry{}
	f := auditFilter{from: since, until: until}
	for _, p := range projects {
		prefix := auditKeysOf(p.ID).log()
		lower, upper := f.bounds(prefix)
		n := 0
		err := st.Scan(prefix, upper, true, func(key string, val []byte) (bool, error) {
			if lower != "" && key < lower {
				return false, nil
			}
			var a auditRec
			if err := json.Unmarshal(val, &a); err != nil {
				return false, fmt.Errorf("decode %s: %w", key, err)
			}
			out = append(out, AuditEntry{Project: p.ID, auditRec: auditOut(a)})
			n++
			return n < limit, nil
		})
		if err != nil {
			return nil, fmt.Errorf("audit log of %s: %w", p.ID, err)
		}
	}
	slices.SortFunc(out, func(a, b AuditEntry) int {
		if c := b.At.Compare(a.At); c != 0 {
			return c
		}
		return strings.Compare(b.ID, a.ID)
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// parseLimit reads an operator listing's limit (default 50).
func parseLimit(s string) (int, error) {
	if s == "" {
		return 50, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%w: limit must be a positive integer", ErrInvalid)
	}
	return n, nil
}
