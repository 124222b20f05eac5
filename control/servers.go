package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/hearthd/hearth/store"
)

var (
	// A DNS label: it can become a hostname or part of a deployment URL.
	namePattern  = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	chipPattern  = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
	modelPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,199}$`)
)

const maxSSHKeysPerServer = 100

type createServerReq struct {
	Name      string   `json:"name"`
	Chip      string   `json:"chip"`
	RAM       int      `json:"ram"`
	Storage   int      `json:"storage"`
	Stack     string   `json:"stack"`
	Model     string   `json:"model"`
	Billing   string   `json:"billing"`
	SSHKeyIDs []string `json:"ssh_key_ids"`
}

type serverJSON struct {
	ID            string   `json:"id"`
	Name          string   `json:"name"`
	Status        string   `json:"status"`
	Chip          string   `json:"chip"`
	RAM           int      `json:"ram"`
	Storage       int      `json:"storage"`
	Stack         string   `json:"stack"`
	Model         *string  `json:"model,omitempty"`
	DeploymentURL *string  `json:"deployment_url,omitempty"`
	Billing       string   `json:"billing"`
	SSHKeyIDs     []string `json:"ssh_key_ids"`
	IP            *string  `json:"ip"`
	CreatedAt     string   `json:"created_at"`
	UpdatedAt     string   `json:"updated_at"`
	// Enforcement is set in management API answers (not in the node's
	// desired state, which only borrows the deployment URL).
	Enforcement *enforcementJSON `json:"enforcement,omitempty"`
	// Action is the action a create or a change started (in its answer
	// only).
	Action *actionJSON `json:"action,omitempty"`
}

func formatTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func (s *Server) serverJSON(rec serverRec, fullIP bool) serverJSON {
	out := serverJSON{
		ID: rec.ID, Name: rec.Name, Status: rec.Status, Chip: rec.Chip, RAM: rec.RAM, Storage: rec.Storage,
		Stack: rec.Stack, Billing: rec.Billing, SSHKeyIDs: rec.SSHKeyIDs,
		CreatedAt: formatTime(rec.CreatedAt), UpdatedAt: formatTime(rec.UpdatedAt),
	}
	if out.SSHKeyIDs == nil {
		out.SSHKeyIDs = []string{}
	}
	if rec.Stack == StackDeployment {
		model := rec.Model
		u := s.cfg.DeploymentURLTemplate
		if strings.Contains(u, "{project}") {
			u = strings.ReplaceAll(u, "{project}", s.projectName(rec.Project))
		}
		u = strings.NewReplacer("{id}", rec.ID, "{name}", rec.Name).Replace(u)
		out.Model, out.DeploymentURL = &model, &u
	}
	if rec.IP != "" {
		ip := rec.IP
		if !fullIP {
			ip = maskIP(ip)
		}
		out.IP = &ip
	}
	return out
}

// maskIP hides the host part of an address in list responses: the last two
// groups of an IPv4 address, the interface identifier (last four groups) of
// an IPv6 address.
func maskIP(s string) string {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "x"
	}
	if a.Is4() {
		b := a.As4()
		return fmt.Sprintf("%d.%d.x.x", b[0], b[1])
	}
	b := a.As16()
	return fmt.Sprintf("%x:%x:%x:%x:x:x:x:x",
		uint16(b[0])<<8|uint16(b[1]), uint16(b[2])<<8|uint16(b[3]),
		uint16(b[4])<<8|uint16(b[5]), uint16(b[6])<<8|uint16(b[7]))
}

func validateServer(req *createServerReq) *apiError {
	if !namePattern.MatchString(req.Name) {
		return invalid("name", "name must be 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit")
	}
	if !chipPattern.MatchString(req.Chip) {
		return invalid("chip", "chip must be 1 to 63 lowercase letters, digits, '.', '_' or '-'")
	}
	if req.RAM <= 0 {
		return invalid("ram", "ram must be a positive integer (GB)")
	}
	if req.Storage <= 0 {
		return invalid("storage", "storage must be a positive integer (GB)")
	}
	switch req.Stack {
	case StackDeployment:
		if req.Model == "" {
			return invalid("model", "model is required for the deployment stack")
		}
		if !modelPattern.MatchString(req.Model) {
			return invalid("model", "model must be 1 to 200 characters of letters, digits and ._:/+-")
		}
	case StackBare:
		if req.Model != "" {
			return invalid("model", "model is only allowed with the deployment stack")
		}
	default:
		return invalid("stack", "stack must be one of: deployment, bare")
	}
	if req.Billing != "monthly" {
		return invalid("billing", "billing must be: monthly")
	}
	if len(req.SSHKeyIDs) > maxSSHKeysPerServer {
		return invalid("ssh_key_ids", "at most %d SSH keys per server", maxSSHKeysPerServer)
	}
	seen := map[string]bool{}
	for _, id := range req.SSHKeyIDs {
		if seen[id] {
			return invalid("ssh_key_ids", "SSH key %q is listed twice", id)
		}
		seen[id] = true
	}
	return nil
}

// maxWarmKeys bounds the SSH keys a create reads before the lock.
const maxWarmKeys = 8

// warmCreateServer reads what createServer checks under the lock: the
// name's index entry (absent for a new name, which no cache knows
// without a read) and the SSH keys named.
func (s *Server) warmCreateServer(rc *reqCtx, body []byte) {
	var req struct {
		Name      string   `json:"name"`
		SSHKeyIDs []string `json:"ssh_key_ids"`
	}
	if json.Unmarshal(body, &req) != nil || !namePattern.MatchString(req.Name) {
		return
	}
	_, _ = s.st.Has(rc.pk.serverName(req.Name))
	for i, id := range req.SSHKeyIDs {
		if i == maxWarmKeys || !validID(id, prefixSSHKey) {
			break
		}
		_, _ = s.st.Has(rc.pk.sshKey(id))
	}
}

func (s *Server) createServer(r *http.Request, rc *reqCtx) (result, error) {
	var req createServerReq
	if e := s.decodeJSON(r, &req); e != nil {
		return result{}, e
	}
	if e := validateServer(&req); e != nil {
		return result{}, e
	}
	for _, id := range req.SSHKeyIDs {
		ok, err := s.st.Has(rc.pk.sshKey(id))
		if err != nil {
			return result{}, err
		}
		if !ok {
			return result{}, invalid("ssh_key_ids", "SSH key %q does not exist", id)
		}
	}
	// The change may already hold other creates (a fold): their writes
	// count as stored.
	m := rc.mutation()
	var existing string
	if id, ok := m.names[rc.pk.serverName(req.Name)]; ok {
		return result{}, conflict("name", "a server named %q already exists: %s", req.Name, id)
	}
	if err := s.st.Get(rc.pk.serverName(req.Name), &existing); err == nil {
		return result{}, conflict("name", "a server named %q already exists: %s", req.Name, existing)
	} else if !errors.Is(err, store.ErrNotFound) {
		return result{}, err
	}

	node, ok, err := s.pickNode(req.Chip, req.RAM, req.Storage, m)
	if err != nil {
		return result{}, err
	}
	if !ok {
		return result{}, &apiError{status: http.StatusConflict, code: CodeCapacityUnavailable,
			message: fmt.Sprintf("no free node with chip %s, at least %d GB RAM and %d GB storage", req.Chip, req.RAM, req.Storage)}
	}
	id := newID(prefixServer)
	m.newServer(id)
	rev := m.nextRev()
	rec := serverRec{
		ID: id, Project: rc.project, Name: req.Name, Status: StatusProvisioning, Chip: req.Chip, RAM: req.RAM, Storage: req.Storage,
		Stack: req.Stack, Model: req.Model, Billing: req.Billing, SSHKeyIDs: req.SSHKeyIDs,
		NodeID: node.ID, Seq: rev, RevBase: node.Revision, CreatedAt: rc.now, UpdatedAt: rc.now, StatusSince: rc.now,
	}
	if rec.SSHKeyIDs == nil {
		rec.SSHKeyIDs = []string{}
	}
	node.ServerID, node.ServerProject = id, rc.project
	m.newRevision(&node)
	m.saveNode(&node)
	act, err := m.startAction(&rec, ActCreate, node.Revision, rc.now)
	if err != nil {
		return result{}, err
	}
	rc.started(act)
	if err := m.put(rec.key(), rec); err != nil {
		return result{}, err
	}
	if err := m.put(rc.pk.serverSeq()+seqKey(rev, id), id); err != nil {
		return result{}, err
	}
	if err := m.put(rc.pk.serverName(req.Name), id); err != nil {
		return result{}, err
	}
	if m.names == nil {
		m.names = map[string]string{}
	}
	m.names[rc.pk.serverName(req.Name)] = id
	// A new server has no rules and no API keys yet; the node's long-poll,
	// which this change wakes, lists both.
	m.noteEmpty(pfxRule+id+"/", pfxAPIKey+id+"/")
	m.wake[node.ID] = true
	out := s.serverJSON(rec, true)
	out.Enforcement = enforcement(rec, node)
	out.Action = actionOut(act)
	return result{status: http.StatusCreated, body: out}, nil
}

// serverStatuses lists every status, in lifecycle order.
var serverStatuses = []string{StatusProvisioning, StatusRunning, StatusUpdating, StatusFailed, StatusUnreachable, StatusDeleting}

func (s *Server) listServers(r *http.Request, rc *reqCtx) (result, error) {
	p, e := parsePage(r, "status")
	if e != nil {
		return result{}, e
	}
	q := r.URL.Query()
	status := q.Get("status")
	if q.Has("status") && (!slices.Contains(serverStatuses, status) || len(q["status"]) != 1) {
		return result{}, invalid("status", "status must be one of: %s", strings.Join(serverStatuses, ", "))
	}
	// With a status, the status index holds just those servers.
	index := rc.pk.serverSeq()
	if status != "" {
		index = rc.pk.serverStatus(status)
	}
	body, err := s.scanPage(index, p, func(_ string, val []byte) (any, bool, error) {
		var rec serverRec
		id := strings.Trim(string(val), `"`)
		if err := s.st.Get(rc.pk.server(id), &rec); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil, false, nil
			}
			return nil, false, err
		}
		if status != "" && rec.Status != status {
			return nil, false, nil
		}
		out, err := s.withEnforcement(s.serverJSON(rec, false), rec)
		return out, err == nil, err
	})
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: body}, nil
}

// loadServer reads a server of the request's project. Another project's
// server is not in its key space: it is not found by the same one read
// that finds no unknown ID, and answered alike.
func (s *Server) loadServer(rc *reqCtx, id string) (serverRec, error) {
	var rec serverRec
	if !validID(id, prefixServer) {
		return rec, notFound("id", "no server %q", id)
	}
	if err := s.st.Get(rc.pk.server(id), &rec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return rec, notFound("id", "no server %q", id)
		}
		return rec, err
	}
	return rec, nil
}

func (s *Server) getServer(r *http.Request, rc *reqCtx) (result, error) {
	rec, err := s.loadServer(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	out, err := s.withEnforcement(s.serverJSON(rec, true), rec)
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: out}, nil
}

// deleteServer answers 204 at once and marks the server deleting; the
// record disappears when its node confirms the wipe.
func (s *Server) deleteServer(r *http.Request, rc *reqCtx) (result, error) {
	rec, err := s.loadServer(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	if rec.Status == StatusDeleting {
		return result{}, notFound("id", "server %q is already being deleted", rec.ID)
	}
	m := rc.mutation()
	rec.Status, rec.PrevStatus, rec.StatusSince, rec.UpdatedAt = StatusDeleting, "", rc.now, rc.now
	rev, err := m.bumpRev(rec.NodeID)
	if err != nil {
		return result{}, err
	}
	act, err := m.startAction(&rec, ActDelete, rev, rc.now)
	if err != nil {
		return result{}, err
	}
	rc.started(act)
	if err := m.put(rec.key(), rec); err != nil {
		return result{}, err
	}
	return result{status: http.StatusNoContent}, nil
}

// patchServerReq is a PATCH body. The fields stay raw so that an explicit
// null is refused rather than read as "absent".
type patchServerReq struct {
	Name  json.RawMessage `json:"name"`
	Model json.RawMessage `json:"model"`
}

// patchString decodes one PATCH field: ok is false when it is absent.
func patchString(raw json.RawMessage, param string) (v string, ok bool, e *apiError) {
	if raw == nil {
		return "", false, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil || string(raw) == "null" {
		return "", false, invalid(param, "%s must be a string", param)
	}
	return v, true, nil
}

// patchServer renames a server and/or changes its model. A new model puts
// the server in "updating" until its node serves it (or "failed" after
// ProvisionTimeout); a rename changes the deployment URL. Either gives the
// node a new revision. Nothing else about the server changes.
func (s *Server) patchServer(r *http.Request, rc *reqCtx) (result, error) {
	rec, err := s.loadServer(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	var req patchServerReq
	if e := s.decodeJSON(r, &req); e != nil {
		return result{}, e
	}
	name, hasName, e := patchString(req.Name, "name")
	if e != nil {
		return result{}, e
	}
	model, hasModel, e := patchString(req.Model, "model")
	if e != nil {
		return result{}, e
	}
	if !hasName && !hasModel {
		return result{}, invalid("", "nothing to change: send name and/or model")
	}
	if hasName && !namePattern.MatchString(name) {
		return result{}, invalid("name", "name must be 1 to 63 lowercase letters, digits or '-', starting and ending with a letter or digit")
	}
	if hasModel && rec.Stack != StackDeployment {
		return result{}, invalid("model", "model is only allowed with the deployment stack; server %s is %s", rec.ID, rec.Stack)
	}
	if hasModel && !modelPattern.MatchString(model) {
		return result{}, invalid("model", "model must be 1 to 200 characters of letters, digits and ._:/+-")
	}
	if rec.Status == StatusDeleting {
		return result{}, conflict("id", "server %s is being deleted", rec.ID)
	}
	m := rc.mutation()
	changed := false
	if hasName && name != rec.Name {
		var existing string
		if err := s.st.Get(rc.pk.serverName(name), &existing); err == nil {
			return result{}, conflict("name", "a server named %q already exists: %s", name, existing)
		} else if !errors.Is(err, store.ErrNotFound) {
			return result{}, err
		}
		m.b.Delete(rc.pk.serverName(rec.Name))
		if err := m.put(rc.pk.serverName(name), rec.ID); err != nil {
			return result{}, err
		}
		rec.Name, changed = name, true
	}
	command := ActRename
	if hasModel && model != rec.Model {
		rec.Model, changed, command = model, true, ActUpdateModel
		rec.setLifecycle(StatusUpdating, rc.now)
		if err := m.supersede(&rec, rc.now); err != nil {
			return result{}, err
		}
	}
	var act *actionJSON
	if changed {
		rec.UpdatedAt = rc.now
		rev, err := m.bumpRev(rec.NodeID)
		if err != nil {
			return result{}, err
		}
		a, err := m.startAction(&rec, command, rev, rc.now)
		if err != nil {
			return result{}, err
		}
		rc.started(a)
		act = actionOut(a)
		if err := m.put(rec.key(), rec); err != nil {
			return result{}, err
		}
	}
	out := s.serverJSON(rec, true)
	out.Action = act
	n, err := m.node(rec.NodeID)
	if err != nil {
		return result{}, err
	}
	shown := *n
	s.overlayReported(&shown)
	out.Enforcement = enforcement(rec, shown)
	return result{status: http.StatusOK, body: out}, nil
}

// removeServer stages the removal of a server and everything under it:
// its name, its firewall rules and its API keys with their usage; its
// running actions end (its deletion's with success). Its usage over time,
// its actions and its audit log entries stay: they are the project's.
func (s *Server) removeServer(m *mutation, rec serverRec, now time.Time) error {
	if err := m.endActions(&rec, now); err != nil {
		return err
	}
	pk := keysOf(rec.Project)
	m.b.Delete(rec.key())
	m.unindexServer(rec)
	m.b.Delete(pk.serverSeq() + seqKey(rec.Seq, rec.ID))
	m.b.Delete(pk.serverName(rec.Name))
	err := s.st.Scan(pfxRule+rec.ID+"/", "", false, func(key string, val []byte) (bool, error) {
		m.b.Delete(key)
		m.b.Delete(pfxRuleID + rec.ID + "/" + key[strings.LastIndexByte(key, '/')+1:])
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("remove rules of %s: %w", rec.ID, err)
	}
	err = store.ScanJSON(s.st, pfxAPIKey+rec.ID+"/", func(_ string, k apiKeyRec) (bool, error) {
		removeAPIKey(m, k)
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("remove API keys of %s: %w", rec.ID, err)
	}
	return nil
}
