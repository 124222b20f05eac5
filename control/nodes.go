package control

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

const maxHostnameLen = 253

// enroll exchanges an enrollment token for a node credential and adds the
// node, with its hardware, to the capacity pool.
func (s *Server) enroll(w http.ResponseWriter, r *http.Request) {
	var req nodeapi.EnrollRequest
	if e := decodeJSON(r, &req); e != nil {
		writeError(w, e)
		return
	}
	hw := req.Hardware
	switch {
	case req.Hostname == "" || len(req.Hostname) > maxHostnameLen || strings.ContainsFunc(req.Hostname, func(r rune) bool { return r <= ' ' || r > '~' }):
		writeError(w, invalid("hostname", "hostname must be 1 to %d printable ASCII characters", maxHostnameLen))
		return
	case !chipPattern.MatchString(hw.Chip):
		writeError(w, invalid("hardware.chip", "chip must be 1 to 63 lowercase letters, digits, '.', '_' or '-'"))
		return
	case hw.RAM <= 0:
		writeError(w, invalid("hardware.ram", "ram must be a positive integer (GB)"))
		return
	case hw.Storage <= 0:
		writeError(w, invalid("hardware.storage", "storage must be a positive integer (GB)"))
		return
	}
	tok := bearer(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var enr enrollmentRec
	key := pfxEnrollment + hashSecret(tok)
	if err := s.st.Get(key, &enr); err != nil || !strings.HasPrefix(tok, secretEnrollment) ||
		!hashesEqual(enr.Hash, hashSecret(tok)) || enr.UsesLeft <= 0 || !now.Before(enr.ExpiresAt) {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Error("look up enrollment token", "err", err)
		}
		writeError(w, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "missing, used up or expired enrollment token"})
		return
	}
	id, err := newID(prefixNode)
	if err != nil {
		s.nodeInternal(w, err)
		return
	}
	cred, err := newSecret(secretNode)
	if err != nil {
		s.nodeInternal(w, err)
		return
	}
	m := s.begin()
	node := nodeRec{ID: id, Hostname: req.Hostname, Hardware: hw, CredentialHash: hashSecret(cred),
		Revision: m.nextRev(), LastSeen: now, CreatedAt: now}
	enr.UsesLeft--
	err = m.put(pfxNode+id, node)
	if err == nil {
		err = m.put(pfxNodeCred+node.CredentialHash, id)
	}
	if err == nil {
		if enr.UsesLeft > 0 {
			err = m.put(key, enr)
		} else {
			m.b.Delete(key)
		}
	}
	if err == nil {
		err = m.commit()
	} else {
		m.discard()
	}
	if err != nil {
		s.nodeInternal(w, err)
		return
	}
	s.log.Info("node enrolled", "node", id, "hostname", req.Hostname, "chip", hw.Chip, "ram", hw.RAM, "storage", hw.Storage)
	writeJSON(w, http.StatusCreated, nodeapi.EnrollResponse{NodeID: id, Credential: cred})
}

func (s *Server) nodeInternal(w http.ResponseWriter, err error) {
	s.log.Error("node protocol request failed", "request_id", w.Header().Get("X-Request-Id"), "err", err)
	writeError(w, &apiError{status: http.StatusInternalServerError, code: CodeInternal, message: "internal error"})
}

// authNode resolves the node credential to its node ID and records the
// node's last-seen time.
func (s *Server) authNode(r *http.Request) (string, *apiError) {
	cred := bearer(r)
	unauthorized := &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "missing or invalid node credential"}
	if !strings.HasPrefix(cred, secretNode) {
		return "", unauthorized
	}
	h := hashSecret(cred)
	var id string
	if err := s.st.Get(pfxNodeCred+h, &id); err != nil {
		return "", unauthorized
	}
	var n nodeRec
	if err := s.st.Get(pfxNode+id, &n); err != nil || !hashesEqual(n.CredentialHash, h) {
		return "", unauthorized
	}
	s.seenMu.Lock()
	s.lastSeen[id] = s.now()
	s.seenMu.Unlock()
	return id, nil
}

// nodeDesired answers a node's long-poll: its desired state as soon as its
// revision is newer than ?after=, or 204 after ?wait= seconds (at most
// MaxLongPoll) with nothing newer.
func (s *Server) nodeDesired(w http.ResponseWriter, r *http.Request) {
	id, e := s.authNode(r)
	if e != nil {
		writeError(w, e)
		return
	}
	q := r.URL.Query()
	var after uint64
	if q.Has("after") {
		v, err := strconv.ParseUint(q.Get("after"), 10, 64)
		if err != nil {
			writeError(w, invalid("after", "after must be a non-negative integer revision"))
			return
		}
		after = v
	}
	wait := s.cfg.MaxLongPoll
	if q.Has("wait") {
		v, err := strconv.ParseFloat(q.Get("wait"), 64)
		if err != nil || v < 0 {
			writeError(w, invalid("wait", "wait must be a non-negative number of seconds"))
			return
		}
		wait = min(wait, time.Duration(v*float64(time.Second)))
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		// Take the watcher before reading, so a change committed between
		// the read and the wait still wakes us.
		ch := s.watcher(id)
		d, err := s.desired(id)
		if err != nil {
			s.nodeInternal(w, err)
			return
		}
		if d.Revision > after {
			writeJSON(w, http.StatusOK, d)
			return
		}
		select {
		case <-ch:
		case <-timer.C:
			w.WriteHeader(http.StatusNoContent)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// desired assembles a node's desired state at one consistent revision.
func (s *Server) desired(nodeID string) (nodeapi.Desired, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n nodeRec
	if err := s.st.Get(pfxNode+nodeID, &n); err != nil {
		return nodeapi.Desired{}, fmt.Errorf("load node %s: %w", nodeID, err)
	}
	d := nodeapi.Desired{NodeID: n.ID, Revision: n.Revision, SSHKeys: []nodeapi.SSHKey{}, FirewallRules: []nodeapi.FirewallRule{}}
	if n.ServerID == "" {
		return d, nil
	}
	var srv serverRec
	if err := s.st.Get(pfxServer+n.ServerID, &srv); err != nil {
		return nodeapi.Desired{}, fmt.Errorf("load server %s: %w", n.ServerID, err)
	}
	out := s.serverJSON(srv, true)
	d.Server = &nodeapi.Server{ID: srv.ID, Name: srv.Name, Stack: srv.Stack, Model: srv.Model}
	if out.DeploymentURL != nil {
		d.Server.DeploymentURL = *out.DeploymentURL
	}
	d.Model = srv.Model
	if srv.Status == StatusDeleting {
		d.Wipe = true
		return d, nil
	}
	for _, kid := range srv.SSHKeyIDs {
		var k sshKeyRec
		if err := s.st.Get(pfxSSHKey+kid, &k); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			return nodeapi.Desired{}, fmt.Errorf("load SSH key %s: %w", kid, err)
		}
		d.SSHKeys = append(d.SSHKeys, nodeapi.SSHKey{ID: k.ID, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint})
	}
	// Oldest first: the order in which the rules were added.
	err := store.ScanJSON(s.st, pfxRule+srv.ID+"/", func(_ string, r ruleRec) (bool, error) {
		d.FirewallRules = append(d.FirewallRules, nodeapi.FirewallRule{ID: r.ID, Direction: r.Rule.Direction,
			Protocol: r.Rule.Protocol, PortRange: r.Rule.PortRange, Source: r.Rule.Source,
			Destination: r.Rule.Destination, Action: r.Rule.Action, Description: r.Rule.Description})
		return true, nil
	})
	if err != nil {
		return nodeapi.Desired{}, fmt.Errorf("load rules of %s: %w", srv.ID, err)
	}
	return d, nil
}

// converged reports whether a node has applied everything of its current
// revision and its runtime is healthy.
func converged(o nodeapi.Observed, rev uint64) bool {
	return o.Revision >= rev && o.FirewallRevision >= rev && o.SSHKeysRevision >= rev &&
		o.FirewallError == "" && o.SSHKeysError == "" && o.RuntimeHealthy
}

// nodeObserved records what a node applied and moves its server through
// the lifecycle: provisioning (or failed) → running once converged, and
// deleting → gone once the node confirms the wipe, returning the node to
// the pool.
func (s *Server) nodeObserved(w http.ResponseWriter, r *http.Request) {
	id, e := s.authNode(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var o nodeapi.Observed
	if e := decodeJSON(r, &o); e != nil {
		writeError(w, e)
		return
	}
	if o.IP != "" {
		a, err := netip.ParseAddr(o.IP)
		if err != nil || a.Zone() != "" {
			writeError(w, invalid("ip", "ip must be an IPv4 or IPv6 address"))
			return
		}
		o.IP = a.Unmap().String()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var n nodeRec
	if err := s.st.Get(pfxNode+id, &n); err != nil {
		s.nodeInternal(w, err)
		return
	}
	m := s.begin()
	n.Observed, n.ObservedAt, n.LastSeen = &o, now, now
	if err := s.applyObserved(m, &n, o, now); err != nil {
		m.discard()
		s.nodeInternal(w, err)
		return
	}
	if err := m.put(pfxNode+n.ID, n); err != nil {
		m.discard()
		s.nodeInternal(w, err)
		return
	}
	if err := m.commit(); err != nil {
		s.nodeInternal(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) applyObserved(m *mutation, n *nodeRec, o nodeapi.Observed, now time.Time) error {
	if n.ServerID == "" {
		return nil
	}
	var srv serverRec
	if err := s.st.Get(pfxServer+n.ServerID, &srv); err != nil {
		return fmt.Errorf("load server %s: %w", n.ServerID, err)
	}
	if srv.Status == StatusDeleting {
		if !o.Wiped || o.Revision < n.Revision {
			return nil
		}
		if err := s.removeServer(m, srv); err != nil {
			return err
		}
		n.ServerID, n.Revision = "", m.nextRev()
		m.wake[n.ID] = true
		s.log.Info("server deleted", "server", srv.ID, "node", n.ID)
		return nil
	}
	changed := false
	if o.IP != "" && o.IP != srv.IP {
		srv.IP, changed = o.IP, true
	}
	if (srv.Status == StatusProvisioning || srv.Status == StatusFailed) && converged(o, n.Revision) {
		srv.Status, changed = StatusRunning, true
		s.log.Info("server running", "server", srv.ID, "node", n.ID)
	}
	if !changed {
		return nil
	}
	srv.UpdatedAt = now
	return m.put(pfxServer+srv.ID, srv)
}

// Sweep fails servers whose provisioning timed out, purges expired
// Idempotency-Key answers and persists nodes' last-seen times. Run calls it
// periodically.
func (s *Server) Sweep() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	m := s.begin()
	dirty := false
	err := store.ScanJSON(s.st, pfxServer, func(_ string, srv serverRec) (bool, error) {
		if srv.Status != StatusProvisioning || now.Sub(srv.CreatedAt) < s.cfg.ProvisionTimeout {
			return true, nil
		}
		srv.Status, srv.UpdatedAt, dirty = StatusFailed, now, true
		s.log.Warn("server failed to provision in time", "server", srv.ID, "node", srv.NodeID, "timeout", s.cfg.ProvisionTimeout)
		return true, m.put(pfxServer+srv.ID, srv)
	})
	if err == nil {
		err = store.ScanJSON(s.st, pfxIdempotency, func(key string, rec idempotencyRec) (bool, error) {
			if !rec.ExpiresAt.After(now) {
				m.b.Delete(key)
				dirty = true
			}
			return true, nil
		})
	}
	if err == nil {
		s.seenMu.Lock()
		seen := s.lastSeen
		s.lastSeen = map[string]time.Time{}
		s.seenMu.Unlock()
		for id, t := range seen {
			var n nodeRec
			if err = s.st.Get(pfxNode+id, &n); err != nil {
				if errors.Is(err, store.ErrNotFound) {
					err = nil
					continue
				}
				break
			}
			if t.After(n.LastSeen) {
				n.LastSeen, dirty = t, true
				if err = m.put(pfxNode+id, n); err != nil {
					break
				}
			}
		}
	}
	if err != nil || !dirty {
		m.discard()
		return err
	}
	return m.commit()
}
