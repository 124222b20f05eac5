// Package nodeapi is the protocol between the control plane and the hearthd
// node agent: the messages both sides speak and the node's HTTP client.
//
// A node enrolls once with an enrollment token and receives its own node
// credential. It then long-polls its desired state by revision and posts
// what it applied. Every credential travels as "Authorization: Bearer".
package nodeapi

import (
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/sshkeys"
)

// Paths of the node protocol, relative to the control plane's base URL.
const (
	PathEnroll   = "/v1/nodes/enroll"
	PathDesired  = "/v1/nodes/self/desired"
	PathObserved = "/v1/nodes/self/observed"
)

// DefaultWait is how long the control plane holds a desired-state long-poll
// open when nothing changes, and how long the node asks it to.
const DefaultWait = 30 * time.Second

// Hardware is what a node offers to the capacity pool. RAM and Storage are in
// GB, so they compare directly with a server request's ram and storage.
type Hardware struct {
	Chip    string `json:"chip"`
	RAM     int    `json:"ram"`
	Storage int    `json:"storage"`
}

// EnrollRequest is the body of POST /v1/nodes/enroll; the enrollment token
// is the bearer credential.
type EnrollRequest struct {
	Hostname string   `json:"hostname"`
	Hardware Hardware `json:"hardware"`
}

// EnrollResponse carries the node's own credential. It is shown once; the
// control plane keeps only its hash.
type EnrollResponse struct {
	NodeID     string `json:"node_id"`
	Credential string `json:"credential"`
}

// Server is the part of a server record a node needs.
type Server struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	Stack         string `json:"stack"`
	Model         string `json:"model,omitempty"`
	DeploymentURL string `json:"deployment_url,omitempty"`
}

// Desired is everything a node must enforce at one revision. Keys and rules
// are the very types the node enforces and the control plane validates, so
// both sides of the wire share one definition (and one canonical form). A node with no
// server assigned gets no server, no keys and no rules. Wipe asks the node to
// remove the server's keys and rules and report back; the control plane then
// returns the node to the pool.
type Desired struct {
	NodeID        string          `json:"node_id"`
	Revision      uint64          `json:"revision"`
	Server        *Server         `json:"server"`
	Model         string          `json:"model,omitempty"`
	SSHKeys       []sshkeys.Key   `json:"ssh_keys"`
	FirewallRules []firewall.Rule `json:"firewall_rules"`
	// APIKeys are the deployment API keys the management API issued for
	// the server; the node replaces its whole set of managed keys with
	// them at each revision. Only hashes travel, never secrets.
	APIKeys []APIKey `json:"api_keys"`
	Wipe    bool     `json:"wipe"`
}

// APIKey is one management-issued deployment API key as the node enforces
// it. Hash is the hex SHA-256 of the whole secret ("hearth_live_…"). Zero
// limits mean unlimited.
type APIKey struct {
	ID                string     `json:"id"`
	Name              string     `json:"name"`
	Hash              string     `json:"hash"`
	ExpiresAt         *time.Time `json:"expires_at,omitempty"`
	RequestsPerMinute int        `json:"requests_per_minute,omitempty"`
	TokensPerMinute   int        `json:"tokens_per_minute,omitempty"`
}

// KeyUsage is what one managed key has been used for on this node since it
// arrived there (cumulative; a wipe resets it).
type KeyUsage struct {
	ID               string     `json:"id"`
	Requests         uint64     `json:"requests"`
	PromptTokens     uint64     `json:"prompt_tokens"`
	CompletionTokens uint64     `json:"completion_tokens"`
	LastUsedAt       *time.Time `json:"last_used_at,omitempty"`
}

// PullProgress is the state of a model pull while it lasts, as the runtime
// reports it.
type PullProgress struct {
	Status    string `json:"status"`
	Completed int64  `json:"completed,omitempty"`
	Total     int64  `json:"total,omitempty"`
}

// Observed is what a node reports it applied. Revision is the desired
// revision the node has processed; FirewallRevision and SSHKeysRevision are
// the last revisions applied successfully, and the *Error fields describe
// the failure of a later one.
type Observed struct {
	Revision       uint64 `json:"revision"`
	IP             string `json:"ip,omitempty"`
	RuntimeHealthy bool   `json:"runtime_healthy"`
	RuntimeError   string `json:"runtime_error,omitempty"`
	// RuntimeRevision is the last desired revision at which the node served
	// exactly Desired.Model and the model answered; RuntimeModel is the
	// model the deployment API serves now; RuntimeProgress is set while a
	// pull of the ordered model runs.
	RuntimeRevision uint64        `json:"runtime_revision"`
	RuntimeModel    string        `json:"runtime_model,omitempty"`
	RuntimeProgress *PullProgress `json:"runtime_progress,omitempty"`
	// RuntimeContextLength and RuntimeCapabilities are what the runtime
	// says of the served model (Ollama's /api/show): tokens of one
	// context, and what it can do ("completion", "tools", "vision", …).
	// Zero and nil when it does not say.
	RuntimeContextLength int      `json:"runtime_context_length,omitempty"`
	RuntimeCapabilities  []string `json:"runtime_capabilities,omitempty"`
	// RuntimeState is the runtime's health: RuntimeHealthy,
	// RuntimeDegraded (it does not serve: wedged and not restarted by
	// hearthd, unreachable, the model not loaded) or RuntimeRestarting
	// (hearthd restarts it). Empty from a node that does not say.
	RuntimeState string `json:"runtime_state,omitempty"`
	// RuntimeLastRestart is hearthd's last restart of the runtime, if any.
	RuntimeLastRestart *RuntimeRestart `json:"runtime_last_restart,omitempty"`
	FirewallRevision   uint64          `json:"firewall_revision"`
	FirewallError      string          `json:"firewall_error,omitempty"`
	SSHKeysRevision    uint64          `json:"ssh_keys_revision"`
	SSHKeysError       string          `json:"ssh_keys_error,omitempty"`
	APIKeysRevision    uint64          `json:"api_keys_revision"`
	APIKeysError       string          `json:"api_keys_error,omitempty"`
	// Usage is the cumulative use of each managed API key.
	Usage []KeyUsage `json:"usage,omitempty"`
	// UsageBuckets are the node's usage buckets not yet accepted, oldest
	// first (increasing Seq), at most MaxUsageBuckets.
	UsageBuckets []UsageBucket `json:"usage_buckets,omitempty"`
	// Wiped reports that the wipe requested at Revision is done.
	Wiped bool `json:"wiped"`
}

// Runtime states (Observed.RuntimeState).
const (
	RuntimeHealthy    = "healthy"
	RuntimeDegraded   = "degraded"
	RuntimeRestarting = "restarting"
)

// RuntimeRestart is one restart of the runtime by hearthd: when it began,
// and why (the wedge found, or the exit).
type RuntimeRestart struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// ErrorBody is the control plane's error envelope.
type ErrorBody struct {
	Error struct {
		Code      string `json:"code"`
		Message   string `json:"message"`
		Param     string `json:"param,omitempty"`
		RequestID string `json:"request_id"`
	} `json:"error"`
}
