package control

import (
	"errors"
	"fmt"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// Per-concern enforcement states shown on a server.
const (
	EnforcementPending = "pending" // the node has not yet applied the current revision
	EnforcementApplied = "applied" // the current revision is in force
	EnforcementFailed  = "failed"  // the node's last attempt failed; it retries on its own
)

// enforcementJSON is the "enforcement" object of a server: what its node
// last reported about applying the server's firewall rules, SSH keys, API
// keys and model, so a customer sees what did not take effect, and why.
type enforcementJSON struct {
	// DesiredRevision is the revision of the server's latest change
	// (rules, keys, lifecycle); a concern is applied once its
	// applied_revision reaches it.
	DesiredRevision uint64      `json:"desired_revision"`
	Firewall        concernJSON `json:"firewall"`
	SSHKeys         concernJSON `json:"ssh_keys"`
	APIKeys         concernJSON `json:"api_keys"`
	Runtime         runtimeJSON `json:"runtime"`
	ReportedAt      *string     `json:"reported_at"`
}

type concernJSON struct {
	Status          string  `json:"status"`
	AppliedRevision *uint64 `json:"applied_revision"`
	Error           *string `json:"error"`
}

// runtimeJSON is the model runtime as the node reports it. Its status is
// applied once the node serves the ordered model, answering, at the
// desired revision (for a bare server: once the runtime is healthy).
type runtimeJSON struct {
	Status  string  `json:"status"`
	Healthy bool    `json:"healthy"`
	Model   *string `json:"model"` // served now
	// AppliedRevision is the last revision at which the node served the
	// model ordered then.
	AppliedRevision *uint64       `json:"applied_revision"`
	Error           *string       `json:"error"`
	Progress        *progressJSON `json:"progress"` // while a pull runs
	// What the runtime says of the served model; null until the node
	// reports it.
	ContextLength *int     `json:"context_length"`
	Capabilities  []string `json:"capabilities"`
	// Health is the runtime's health: healthy, degraded (it does not
	// serve: wedged, unreachable, the model not loaded) or restarting (the
	// node restarts it).
	Health string `json:"health"`
	// LastRestart is the node's last restart of the runtime since the
	// server was created; null if none.
	LastRestart *restartJSON `json:"last_restart"`
}

type restartJSON struct {
	At     string `json:"at"`
	Reason string `json:"reason"`
}

type progressJSON struct {
	Status    string `json:"status"`
	Completed int64  `json:"completed"`
	Total     int64  `json:"total"`
}

// enforcement builds a server's enforcement object from its node's last
// report, its revisions counted from the server's creation (RevBase).
// Reports from before the server existed (the node's previous tenant) are
// ignored: they say nothing about this server.
func enforcement(srv serverRec, n nodeRec) *enforcementJSON {
	e := &enforcementJSON{
		DesiredRevision: n.Revision - srv.RevBase,
		Firewall:        concernJSON{Status: EnforcementPending},
		SSHKeys:         concernJSON{Status: EnforcementPending},
		APIKeys:         concernJSON{Status: EnforcementPending},
		Runtime:         runtimeJSON{Status: EnforcementPending, Health: nodeapi.RuntimeDegraded},
	}
	o := n.Observed
	if o == nil || o.Revision < srv.firstRev() {
		return e
	}
	e.Firewall = concern(o.FirewallRevision, o.FirewallError, srv, n.Revision)
	e.SSHKeys = concern(o.SSHKeysRevision, o.SSHKeysError, srv, n.Revision)
	e.APIKeys = concern(o.APIKeysRevision, o.APIKeysError, srv, n.Revision)
	e.Runtime = runtimeState(srv, n.Revision, o)
	if !n.ObservedAt.IsZero() {
		at := formatTime(n.ObservedAt)
		e.ReportedAt = &at
	}
	return e
}

func runtimeState(srv serverRec, desired uint64, o *nodeapi.Observed) runtimeJSON {
	rt := runtimeJSON{Status: EnforcementPending, Healthy: o.RuntimeHealthy, Model: optional(o.RuntimeModel),
		Error: optional(o.RuntimeError), Health: runtimeHealth(o)}
	if r := o.RuntimeLastRestart; r != nil && !r.At.Before(srv.CreatedAt) {
		rt.LastRestart = &restartJSON{At: formatTime(r.At), Reason: r.Reason}
	}
	if o.RuntimeRevision >= srv.firstRev() {
		rev := o.RuntimeRevision - srv.RevBase
		rt.AppliedRevision = &rev
	}
	if p := o.RuntimeProgress; p != nil {
		rt.Progress = &progressJSON{Status: p.Status, Completed: p.Completed, Total: p.Total}
	}
	if n := o.RuntimeContextLength; n > 0 {
		rt.ContextLength = &n
	}
	rt.Capabilities = o.RuntimeCapabilities
	serving := o.RuntimeHealthy
	if srv.Stack == StackDeployment {
		serving = serving && o.RuntimeRevision >= desired && o.RuntimeModel == srv.Model
	}
	switch {
	case o.RuntimeError != "":
		rt.Status = EnforcementFailed
	case serving:
		rt.Status = EnforcementApplied
	}
	return rt
}

// runtimeHealth is the runtime's health as o reports it; a node that does
// not say is healthy or degraded as its runtime_healthy says.
func runtimeHealth(o *nodeapi.Observed) string {
	switch o.RuntimeState {
	case nodeapi.RuntimeHealthy, nodeapi.RuntimeDegraded, nodeapi.RuntimeRestarting:
		return o.RuntimeState
	}
	if o.RuntimeHealthy {
		return nodeapi.RuntimeHealthy
	}
	return nodeapi.RuntimeDegraded
}

func concern(applied uint64, errMsg string, srv serverRec, desired uint64) concernJSON {
	c := concernJSON{Status: EnforcementPending}
	if applied >= srv.firstRev() {
		rev := applied - srv.RevBase
		c.AppliedRevision = &rev
	}
	switch {
	case errMsg != "":
		c.Status, c.Error = EnforcementFailed, &errMsg
	case applied >= desired:
		c.Status = EnforcementApplied
	}
	return c
}

// withEnforcement adds the enforcement object to a server answer.
func (s *Server) withEnforcement(out serverJSON, srv serverRec) (serverJSON, error) {
	var n nodeRec
	if err := s.st.Get(pfxNode+srv.NodeID, &n); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return out, nil
		}
		return out, fmt.Errorf("load node %s: %w", srv.NodeID, err)
	}
	var sr seenRec
	if err := s.st.Get(pfxNodeSeen+srv.NodeID, &sr); err != nil && !errors.Is(err, store.ErrNotFound) {
		return out, fmt.Errorf("load node %s: %w", srv.NodeID, err)
	}
	n.overlay(sr)
	s.overlayReported(&n)
	out.Enforcement = enforcement(srv, n)
	return out, nil
}

// overlayReported moves a node's report time up to a report that changed
// nothing and is not persisted yet (the sweep writes it).
func (s *Server) overlayReported(n *nodeRec) {
	s.seenMu.Lock()
	t, ok := s.reported[n.ID]
	s.seenMu.Unlock()
	if ok && t.After(n.ObservedAt) {
		n.ObservedAt = t
	}
}
