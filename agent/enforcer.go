// Package agent keeps the host at its desired state: the node agent follows
// the control plane (long-poll, report), the standalone agent follows a
// local file, and both hand what they want to the one Enforcer, which
// applies it concern by concern (firewall rules, SSH keys, the deployment
// API's keys, the model the runtime serves) and tracks each concern's
// applied revision and error.
package agent

import (
	"context"
	"log/slog"
	"sync"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
)

// Desired is everything the host should have in force, at one revision.
//
// Each concern is a complete set (an empty one removes everything the
// concern manages). A new concern is a field here, a Concern in Observed
// and an entry in the Enforcer's table.
type Desired struct {
	// Revision names this content; a larger revision is newer. The node
	// agent uses the control plane's revision, the standalone agent counts
	// the versions of its file.
	Revision uint64
	// FirewallRules is the complete rule set, in canonical form.
	FirewallRules []firewall.Rule
	// SSHKeys is the complete set of managed authorized keys.
	SSHKeys []sshkeys.Key
	// APIKeys is the complete set of management-issued deployment API keys.
	APIKeys []nodeapi.APIKey
	// Model is the model the deployment must serve; "" for none ordered
	// (the runtime's default).
	Model string
	// Wipe removes everything of the tenant: with empty rules and keys it
	// also removes the local API keys and all usage counters.
	Wipe bool
}

// Concerns are what the Enforcer applies desired states to. A nil one is
// not managed on this host (tests): it is in force at every revision.
type Concerns struct {
	Firewall firewall.Firewall
	SSHKeys  sshkeys.Keys
	APIKeys  APIKeys
	// Runtime converges the served model in the background; its state is
	// its own (Runtime.State), not an apply's outcome.
	Runtime *Runtime
}

// APIKeys is the deployment API's key ring as the enforcer drives it.
type APIKeys interface {
	// SetManaged replaces the whole set of management-issued keys.
	SetManaged(ctx context.Context, keys []nodeapi.APIKey) error
	// Wipe removes every key, local ones included, with its usage.
	Wipe(ctx context.Context) error
}

// Concern is what one concern of the host has in force.
type Concern struct {
	// Revision is the last desired revision this concern applied
	// successfully.
	Revision uint64
	// Error is why applying the latest desired revision failed, "" if it
	// did not. A failed concern keeps what it applied before.
	Error string
}

func (c Concern) inForce(rev uint64) bool { return c.Error == "" && c.Revision >= rev }

// Observed is what the host has in force, concern by concern.
type Observed struct {
	// Revision is the desired revision last applied, in whole or in part.
	Revision uint64
	Firewall Concern
	SSHKeys  Concern
	APIKeys  Concern
	Runtime  RuntimeState
}

// applied lists the state of every concern an apply brings about, for
// checks over all of them: the tenant's data on the host. The runtime
// converges on its own.
func (o Observed) applied() []Concern { return []Concern{o.Firewall, o.SSHKeys, o.APIKeys} }

// InForce reports whether every concern, the runtime's model included, has
// revision rev (or a newer one) in force.
func (o Observed) InForce(rev uint64) bool {
	return o.TenantInForce(rev) && o.Runtime.inForce(rev)
}

// TenantInForce reports whether rev is in force for everything that holds
// tenant data (rules, SSH keys, API keys): all a wipe needs. The model
// served is no tenant data.
func (o Observed) TenantInForce(rev uint64) bool {
	for _, c := range o.applied() {
		if !c.inForce(rev) {
			return false
		}
	}
	return true
}

// Failed reports whether a concern's last apply failed (and is retried).
// The runtime's failures are retried by the runtime itself.
func (o Observed) Failed() bool {
	for _, c := range o.applied() {
		if c.Error != "" {
			return true
		}
	}
	return false
}

// concern is one row of the Enforcer's table: how to apply it and where its
// state is kept.
type concern struct {
	name  string
	state func(*Observed) *Concern
	apply func(context.Context, Desired) error
}

// Enforcer applies desired states to the host and remembers, per concern,
// what is in force. It is safe for concurrent use; applies run one at a
// time.
type Enforcer struct {
	log      *slog.Logger
	concerns []concern
	runtime  *Runtime

	applyMu sync.Mutex // one apply at a time, over the desired state it read

	mu      sync.Mutex
	desired Desired
	applied bool // desired has been applied at least once
	obs     Observed
}

// NewEnforcer returns an enforcer over the host's concerns (fakes or no-op
// implementations where the host is not to be touched).
func NewEnforcer(c Concerns, logger *slog.Logger) *Enforcer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	e := &Enforcer{log: logger.With("component", "enforcer"), runtime: c.Runtime}
	// API keys first: a revoked key is refused before anything slower is
	// applied.
	e.concerns = []concern{{
		name:  "API keys",
		state: func(o *Observed) *Concern { return &o.APIKeys },
		apply: func(ctx context.Context, d Desired) error {
			switch {
			case c.APIKeys == nil:
				return nil
			case d.Wipe:
				return c.APIKeys.Wipe(ctx)
			}
			return c.APIKeys.SetManaged(ctx, d.APIKeys)
		},
	}, {
		name:  "firewall rules",
		state: func(o *Observed) *Concern { return &o.Firewall },
		apply: func(ctx context.Context, d Desired) error {
			if c.Firewall == nil {
				return nil
			}
			return c.Firewall.Apply(ctx, d.FirewallRules)
		},
	}, {
		name:  "SSH keys",
		state: func(o *Observed) *Concern { return &o.SSHKeys },
		apply: func(ctx context.Context, d Desired) error {
			if c.SSHKeys == nil {
				return nil
			}
			return c.SSHKeys.Sync(ctx, d.SSHKeys)
		},
	}}
	return e
}

// withRuntime returns o with the runtime's own state (in force at
// o.Revision when there is no runtime concern).
func (e *Enforcer) withRuntime(o Observed) Observed {
	if e.runtime != nil {
		o.Runtime = e.runtime.State()
	} else {
		o.Runtime = RuntimeState{Concern: Concern{Revision: o.Revision}}
	}
	return o
}

// Apply brings every concern to d and returns what is in force afterwards.
// A concern that already has d's revision in force is left alone, so
// applying the same revision again retries only what failed.
func (e *Enforcer) Apply(ctx context.Context, d Desired) Observed {
	e.applyMu.Lock()
	defer e.applyMu.Unlock()
	return e.apply(ctx, d)
}

// Retry applies the latest desired state again if a concern failed it; it
// reports whether it did. The desired state is read under the apply lock,
// so a retry never re-applies a state that a newer Apply replaced.
func (e *Enforcer) Retry(ctx context.Context) (Observed, bool) {
	e.applyMu.Lock()
	defer e.applyMu.Unlock()
	e.mu.Lock()
	d, retry := e.desired, e.applied && e.obs.Failed()
	o := e.obs
	e.mu.Unlock()
	if !retry {
		return e.withRuntime(o), false
	}
	return e.apply(ctx, d), true
}

// apply runs with applyMu held.
func (e *Enforcer) apply(ctx context.Context, d Desired) Observed {
	e.mu.Lock()
	same := e.applied && e.desired.Revision == d.Revision
	o := e.obs
	e.desired, e.applied = d, true
	e.mu.Unlock()

	o.Revision = d.Revision
	applied := false
	for _, c := range e.concerns {
		st := c.state(&o)
		if same && st.inForce(d.Revision) {
			continue
		}
		applied = true
		if err := c.apply(ctx, d); err != nil {
			st.Error = err.Error()
			e.log.Error("apply "+c.name+" failed; retrying", "revision", d.Revision, "err", err)
			continue
		}
		st.Revision, st.Error = d.Revision, ""
	}
	if e.runtime != nil {
		e.runtime.Want(d.Revision, d.Model)
	}
	if applied && o.TenantInForce(d.Revision) {
		e.log.Info("desired state applied", "revision", d.Revision, "rules", len(d.FirewallRules),
			"ssh_keys", len(d.SSHKeys), "api_keys", len(d.APIKeys), "wipe", d.Wipe)
	}
	e.mu.Lock()
	e.obs = o
	e.mu.Unlock()
	return e.withRuntime(o)
}

// Observed returns what is in force now.
func (e *Enforcer) Observed() Observed {
	e.mu.Lock()
	o := e.obs
	e.mu.Unlock()
	return e.withRuntime(o)
}

// Changed returns a channel closed at the next change the enforcer makes
// on its own, outside an apply: the runtime's model served, failing or
// pulling. The node agent reports then.
func (e *Enforcer) Changed() <-chan struct{} {
	if e.runtime == nil {
		return nil
	}
	return e.runtime.Changed()
}

// Enforced reports whether a desired state has been applied and the latest
// one is in force for every concern: the one check of "is the host where it
// should be" (hearthd holds READY=1 on it).
func (e *Enforcer) Enforced() bool {
	e.mu.Lock()
	applied, rev, o := e.applied, e.desired.Revision, e.obs
	e.mu.Unlock()
	return applied && e.withRuntime(o).InForce(rev)
}
