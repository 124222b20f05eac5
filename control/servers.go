package control

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
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
		u := strings.NewReplacer("{id}", rec.ID, "{name}", rec.Name).Replace(s.cfg.DeploymentURLTemplate)
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

func (s *Server) createServer(r *http.Request, rc *reqCtx) (result, error) {
	var req createServerReq
	if e := decodeJSON(r, &req); e != nil {
		return result{}, e
	}
	if e := validateServer(&req); e != nil {
		return result{}, e
	}
	for _, id := range req.SSHKeyIDs {
		ok, err := s.st.Has(pfxSSHKey + id)
		if err != nil {
			return result{}, err
		}
		if !ok {
			return result{}, invalid("ssh_key_ids", "SSH key %q does not exist", id)
		}
	}
	var existing string
	if err := s.st.Get(pfxServerName+req.Name, &existing); err == nil {
		return result{}, conflict("name", "a server named %q already exists: %s", req.Name, existing)
	} else if !errors.Is(err, store.ErrNotFound) {
		return result{}, err
	}

	node, ok, err := s.pickNode(req.Chip, req.RAM, req.Storage)
	if err != nil {
		return result{}, err
	}
	if !ok {
		return result{}, &apiError{status: http.StatusConflict, code: CodeCapacityUnavailable,
			message: fmt.Sprintf("no free node with chip %s, at least %d GB RAM and %d GB storage", req.Chip, req.RAM, req.Storage)}
	}
	id, err := newID(prefixServer)
	if err != nil {
		return result{}, err
	}
	m := rc.mutation()
	rev := m.nextRev()
	rec := serverRec{
		ID: id, Name: req.Name, Status: StatusProvisioning, Chip: req.Chip, RAM: req.RAM, Storage: req.Storage,
		Stack: req.Stack, Model: req.Model, Billing: req.Billing, SSHKeyIDs: req.SSHKeyIDs,
		NodeID: node.ID, Seq: rev, CreatedAt: rc.now, UpdatedAt: rc.now,
	}
	if rec.SSHKeyIDs == nil {
		rec.SSHKeyIDs = []string{}
	}
	node.ServerID, node.Revision = id, rev
	if err := m.put(pfxServer+id, rec); err != nil {
		return result{}, err
	}
	if err := m.put(pfxServerSeq+seqKey(rev, id), id); err != nil {
		return result{}, err
	}
	if err := m.put(pfxServerName+req.Name, id); err != nil {
		return result{}, err
	}
	if err := m.put(pfxNode+node.ID, node); err != nil {
		return result{}, err
	}
	m.wake[node.ID] = true
	out := s.serverJSON(rec, true)
	out.Enforcement = enforcement(rec, node)
	return result{status: http.StatusCreated, body: out}, nil
}

// pickNode finds the free node that fits with the least hardware to spare,
// so that big nodes stay available for big requests. The caller holds s.mu
// and commits the assignment in the same change.
func (s *Server) pickNode(chip string, ram, storage int) (nodeRec, bool, error) {
	var best nodeRec
	found := false
	err := store.ScanJSON(s.st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		hw := n.Hardware
		if n.ServerID != "" || hw.Chip != chip || hw.RAM < ram || hw.Storage < storage {
			return true, nil
		}
		if !found || hw.RAM < best.Hardware.RAM || hw.RAM == best.Hardware.RAM && hw.Storage < best.Hardware.Storage {
			best, found = n, true
		}
		return true, nil
	})
	if err != nil {
		return nodeRec{}, false, fmt.Errorf("scan nodes: %w", err)
	}
	return best, found, nil
}

var serverStatuses = map[string]bool{StatusProvisioning: true, StatusRunning: true, StatusFailed: true, StatusDeleting: true}

func (s *Server) listServers(r *http.Request, rc *reqCtx) (result, error) {
	p, e := parsePage(r, "status")
	if e != nil {
		return result{}, e
	}
	q := r.URL.Query()
	status := q.Get("status")
	if q.Has("status") && (!serverStatuses[status] || len(q["status"]) != 1) {
		return result{}, invalid("status", "status must be one of: provisioning, running, failed, deleting")
	}
	if p.cursor != "" && !strings.Contains(p.cursor, "/"+prefixServer) {
		return result{}, invalid("cursor", "cursor is not a cursor returned by this list")
	}
	body, err := s.scanPage(pfxServerSeq, p, func(_ string, val []byte) (any, bool, error) {
		var rec serverRec
		id := strings.Trim(string(val), `"`)
		if err := s.st.Get(pfxServer+id, &rec); err != nil {
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

func (s *Server) loadServer(id string) (serverRec, error) {
	var rec serverRec
	if !validID(id, prefixServer) {
		return rec, notFound("id", "no server %q", id)
	}
	if err := s.st.Get(pfxServer+id, &rec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return rec, notFound("id", "no server %q", id)
		}
		return rec, err
	}
	return rec, nil
}

func (s *Server) getServer(r *http.Request, rc *reqCtx) (result, error) {
	rec, err := s.loadServer(r.PathValue("id"))
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
	rec, err := s.loadServer(r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	if rec.Status == StatusDeleting {
		return result{}, notFound("id", "server %q is already being deleted", rec.ID)
	}
	m := rc.mutation()
	rec.Status, rec.UpdatedAt = StatusDeleting, rc.now
	if err := m.put(pfxServer+rec.ID, rec); err != nil {
		return result{}, err
	}
	if err := s.bumpNode(m, rec.NodeID); err != nil {
		return result{}, err
	}
	return result{status: http.StatusNoContent}, nil
}

// bumpNode gives a node a new desired revision and wakes its long-poll.
func (s *Server) bumpNode(m *mutation, nodeID string) error {
	var n nodeRec
	if err := s.st.Get(pfxNode+nodeID, &n); err != nil {
		return fmt.Errorf("load node %s: %w", nodeID, err)
	}
	n.Revision = m.nextRev()
	m.wake[nodeID] = true
	return m.put(pfxNode+nodeID, n)
}

// removeServer stages the removal of a server and everything under it.
func (s *Server) removeServer(m *mutation, rec serverRec) error {
	m.b.Delete(pfxServer + rec.ID)
	m.b.Delete(pfxServerSeq + seqKey(rec.Seq, rec.ID))
	m.b.Delete(pfxServerName + rec.Name)
	return s.st.Scan(pfxRule+rec.ID+"/", "", false, func(key string, val []byte) (bool, error) {
		m.b.Delete(key)
		id := key[strings.LastIndexByte(key, '/')+1:]
		m.b.Delete(pfxRuleID + id)
		return true, nil
	})
}
