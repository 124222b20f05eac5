package control

import (
	"errors"
	"fmt"

	"github.com/hearthd/hearth/store"
)

// Per-concern enforcement states shown on a server.
const (
	EnforcementPending = "pending" // the node has not yet applied the current revision
	EnforcementApplied = "applied" // the current revision is in force
	EnforcementFailed  = "failed"  // the node's last attempt failed; it retries on its own
)

// enforcementJSON is the "enforcement" object of a server: what its node
// last reported about applying the server's firewall rules and SSH keys,
// so a customer sees a rule or key that did not take effect, and why.
type enforcementJSON struct {
	// DesiredRevision is the revision of the server's latest change
	// (rules, keys, lifecycle); a concern is applied once its
	// applied_revision reaches it.
	DesiredRevision uint64      `json:"desired_revision"`
	Firewall        concernJSON `json:"firewall"`
	SSHKeys         concernJSON `json:"ssh_keys"`
	Runtime         runtimeJSON `json:"runtime"`
	ReportedAt      *string     `json:"reported_at"`
}

type concernJSON struct {
	Status          string  `json:"status"`
	AppliedRevision *uint64 `json:"applied_revision"`
	Error           *string `json:"error"`
}

type runtimeJSON struct {
	Healthy bool    `json:"healthy"`
	Error   *string `json:"error"`
}

// enforcement builds a server's enforcement object from its node's last
// report. Reports from before the server existed (the node's previous
// tenant) are ignored: they say nothing about this server.
func enforcement(srv serverRec, n nodeRec) *enforcementJSON {
	e := &enforcementJSON{
		DesiredRevision: n.Revision,
		Firewall:        concernJSON{Status: EnforcementPending},
		SSHKeys:         concernJSON{Status: EnforcementPending},
	}
	o := n.Observed
	if o == nil || o.Revision < srv.Seq {
		return e
	}
	e.Firewall = concern(o.FirewallRevision, o.FirewallError, srv.Seq, n.Revision)
	e.SSHKeys = concern(o.SSHKeysRevision, o.SSHKeysError, srv.Seq, n.Revision)
	e.Runtime.Healthy = o.RuntimeHealthy
	if o.RuntimeError != "" {
		msg := o.RuntimeError
		e.Runtime.Error = &msg
	}
	if !n.ObservedAt.IsZero() {
		at := formatTime(n.ObservedAt)
		e.ReportedAt = &at
	}
	return e
}

func concern(applied uint64, errMsg string, since, desired uint64) concernJSON {
	c := concernJSON{Status: EnforcementPending}
	if applied >= since {
		rev := applied
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
	out.Enforcement = enforcement(srv, n)
	return out, nil
}
