package control

import (
	"github.com/hearthd/hearth/internal/textcheck"
	"github.com/hearthd/hearth/nodeapi"
)

// MaxReportText bounds every free-text field of a node's report (errors,
// the served model's name, a pull's status): longer ones are cut to this
// many bytes plus "…". A node's error is shown in every GET and list of its
// server, so it must not be able to make those answers large.
const MaxReportText = 1024

// maxReportUsage bounds the usage entries of one report: one per API key
// of the server, with room to spare.
const maxReportUsage = 2 * MaxAPIKeysPerServer

// maxCapabilities and maxCapabilityText bound the served model's
// capabilities in a report (Ollama names a handful, each a word).
const (
	maxCapabilities   = 32
	maxCapabilityText = 64
)

// checkReport refuses a report that claims a revision the control plane
// never issued to the node (issued is the node's current revision; a node
// cannot have applied a later one, so such a report is forged or corrupt
// and must not move its server), and bounds its text fields and the pull's
// progress in place.
func checkReport(o *nodeapi.Observed, issued uint64) *apiError {
	for _, r := range []struct {
		name string
		rev  uint64
	}{
		{"revision", o.Revision}, {"runtime_revision", o.RuntimeRevision}, {"firewall_revision", o.FirewallRevision},
		{"ssh_keys_revision", o.SSHKeysRevision}, {"api_keys_revision", o.APIKeysRevision},
	} {
		if r.rev > issued {
			return invalid(r.name, "%s %d was never issued to this node (its latest is %d)", r.name, r.rev, issued)
		}
	}
	if len(o.Usage) > maxReportUsage {
		return invalid("usage", "usage lists %d keys; at most %d", len(o.Usage), maxReportUsage)
	}
	for _, s := range []*string{&o.RuntimeError, &o.FirewallError, &o.SSHKeysError, &o.APIKeysError, &o.RuntimeModel} {
		*s = textcheck.Clip(*s, MaxReportText)
	}
	if p := o.RuntimeProgress; p != nil {
		// Clamped rather than refused: the runtime's numbers, passed on,
		// must not cost the node the rest of its report.
		p.Status = textcheck.Clip(p.Status, MaxReportText)
		p.Total = max(p.Total, 0)
		p.Completed = max(p.Completed, 0)
		if p.Total > 0 {
			p.Completed = min(p.Completed, p.Total)
		}
	}
	if len(o.RuntimeCapabilities) > maxCapabilities {
		return invalid("runtime_capabilities", "runtime_capabilities lists %d; at most %d", len(o.RuntimeCapabilities), maxCapabilities)
	}
	for i, c := range o.RuntimeCapabilities {
		o.RuntimeCapabilities[i] = textcheck.Clip(c, maxCapabilityText)
	}
	if o.RuntimeContextLength < 0 {
		return invalid("runtime_context_length", "runtime_context_length must not be negative")
	}
	switch o.RuntimeState {
	case "", nodeapi.RuntimeHealthy, nodeapi.RuntimeDegraded, nodeapi.RuntimeRestarting:
	default:
		return invalid("runtime_state", "runtime_state must be healthy, degraded or restarting")
	}
	if r := o.RuntimeLastRestart; r != nil {
		if r.At.IsZero() {
			return invalid("runtime_last_restart", "runtime_last_restart needs its time")
		}
		r.Reason = textcheck.Clip(r.Reason, MaxReportText)
	}
	return nil
}
