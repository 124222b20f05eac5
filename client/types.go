package client

import "time"

// The types below are the schemas of control/openapi.json, field for field:
// a required field has no omitempty, an optional one has, a nullable one is
// a pointer. TestTypesFollowOpenAPI walks every schema of the document
// against them, so they cannot drift apart.

// ServerStatus is where a server is in its lifecycle (control/README.md).
type ServerStatus string

// Server statuses.
const (
	StatusProvisioning ServerStatus = "provisioning"
	StatusRunning      ServerStatus = "running"
	StatusUpdating     ServerStatus = "updating"
	StatusFailed       ServerStatus = "failed"
	StatusUnreachable  ServerStatus = "unreachable"
	StatusDeleting     ServerStatus = "deleting"
)

// ServerStatuses returns every status, in lifecycle order.
func ServerStatuses() []ServerStatus {
	return []ServerStatus{StatusProvisioning, StatusRunning, StatusUpdating, StatusFailed, StatusUnreachable, StatusDeleting}
}

// Stack is what a server runs: a deployment serves one model, a bare server
// none.
type Stack string

// Stacks.
const (
	StackDeployment Stack = "deployment"
	StackBare       Stack = "bare"
)

// Stacks returns every stack.
func Stacks() []Stack { return []Stack{StackDeployment, StackBare} }

// BillingMonthly is the one billing plan.
const BillingMonthly = "monthly"

// Server is a rented server.
type Server struct {
	ID      string       `json:"id"`
	Name    string       `json:"name"`
	Status  ServerStatus `json:"status"`
	Chip    string       `json:"chip"`
	RAM     int          `json:"ram"`     // GB
	Storage int          `json:"storage"` // GB
	Stack   Stack        `json:"stack"`
	// Model and DeploymentURL are set for the deployment stack only.
	Model         string   `json:"model,omitempty"`
	DeploymentURL string   `json:"deployment_url,omitempty"`
	Billing       string   `json:"billing"`
	SSHKeyIDs     []string `json:"ssh_key_ids"`
	// IP is nil until the node reports it; lists mask it.
	IP          *string     `json:"ip"`
	CreatedAt   time.Time   `json:"created_at"`
	UpdatedAt   time.Time   `json:"updated_at"`
	Enforcement Enforcement `json:"enforcement"`
	// Action is the action a create or an update started (in its answer
	// only; nil when an update changed nothing).
	Action *ServerAction `json:"action,omitempty"`
}

// Enforcement is what the server's node last reported about enforcing the
// server's firewall rules, SSH keys, API keys and model.
type Enforcement struct {
	DesiredRevision int64              `json:"desired_revision"`
	Firewall        EnforcementConcern `json:"firewall"`
	SSHKeys         EnforcementConcern `json:"ssh_keys"`
	APIKeys         EnforcementConcern `json:"api_keys"`
	Runtime         RuntimeEnforcement `json:"runtime"`
	// ReportedAt is nil until the node's first report for this server.
	ReportedAt *time.Time `json:"reported_at"`
}

// Enforcement statuses of one concern.
const (
	EnforcementPending = "pending"
	EnforcementApplied = "applied"
	EnforcementFailed  = "failed"
)

// EnforcementConcern is the state of one concern (firewall, SSH keys, API
// keys) on the node.
type EnforcementConcern struct {
	Status          string  `json:"status"`
	AppliedRevision *int64  `json:"applied_revision"`
	Error           *string `json:"error"`
}

// RuntimeEnforcement is the model runtime as the node reports it.
type RuntimeEnforcement struct {
	Status  string `json:"status"`
	Healthy bool   `json:"healthy"`
	// Model is what the deployment serves now (the old model while
	// updating).
	Model           *string       `json:"model"`
	AppliedRevision *int64        `json:"applied_revision"`
	Error           *string       `json:"error"`
	Progress        *PullProgress `json:"progress"`
	// ContextLength and Capabilities are what the runtime says of the
	// served model; nil until the node reports them.
	ContextLength *int64   `json:"context_length"`
	Capabilities  []string `json:"capabilities"`
	// Health is RuntimeHealthy, RuntimeDegraded (it does not serve) or
	// RuntimeRestarting (the node restarts it; requests wait for it).
	Health string `json:"health"`
	// LastRestart is the node's last restart of the runtime since the
	// server was created; nil if none.
	LastRestart *RuntimeRestart `json:"last_restart"`
}

// Runtime health (RuntimeEnforcement.Health).
const (
	RuntimeHealthy    = "healthy"
	RuntimeDegraded   = "degraded"
	RuntimeRestarting = "restarting"
)

// RuntimeRestart is one restart of the runtime by its node.
type RuntimeRestart struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason"`
}

// PullProgress is a model pull while it lasts, in bytes.
type PullProgress struct {
	Status    string `json:"status"`
	Completed int64  `json:"completed"`
	Total     int64  `json:"total"`
}

// CreateServerRequest is the body of CreateServer.
type CreateServerRequest struct {
	Name    string `json:"name"`
	Chip    string `json:"chip"`
	RAM     int    `json:"ram"`     // GB
	Storage int    `json:"storage"` // GB
	Stack   Stack  `json:"stack"`
	// Model is required for the deployment stack and must be empty for
	// bare.
	Model     string   `json:"model,omitempty"`
	Billing   string   `json:"billing"`
	SSHKeyIDs []string `json:"ssh_key_ids,omitempty"`
}

// UpdateServerRequest is the body of UpdateServer: set at least one field.
type UpdateServerRequest struct {
	Name  string `json:"name,omitempty"`
	Model string `json:"model,omitempty"`
}

// SSHKey is a registered SSH public key.
type SSHKey struct {
	ID          string    `json:"id"`
	Name        string    `json:"name"`
	PublicKey   string    `json:"public_key"`
	Fingerprint string    `json:"fingerprint"` // SHA256:…, as ssh-keygen -lf prints it
	Type        string    `json:"type"`
	Bits        int       `json:"bits"`
	CreatedAt   time.Time `json:"created_at"`
}

// CreateSSHKeyRequest is the body of CreateSSHKey.
type CreateSSHKeyRequest struct {
	Name      string `json:"name"`
	PublicKey string `json:"public_key"` // one authorized_keys line
}

// Direction, Protocol and Action are a firewall rule's enums.
type (
	Direction string
	Protocol  string
	Action    string
)

// Firewall rule values.
const (
	Inbound  Direction = "inbound"
	Outbound Direction = "outbound"
	TCP      Protocol  = "tcp"
	UDP      Protocol  = "udp"
	ICMP     Protocol  = "icmp"
	Allow    Action    = "allow"
	Deny     Action    = "deny"
)

// Directions returns every direction.
func Directions() []Direction { return []Direction{Inbound, Outbound} }

// Protocols returns every protocol.
func Protocols() []Protocol { return []Protocol{TCP, UDP, ICMP} }

// Actions returns every action.
func Actions() []Action { return []Action{Allow, Deny} }

// FirewallRule is one rule of a server, in canonical form.
type FirewallRule struct {
	ID        string    `json:"id"`
	ServerID  string    `json:"server_id"`
	Direction Direction `json:"direction"`
	Protocol  Protocol  `json:"protocol"`
	// PortRange, Source and Destination are nil for "all ports" and
	// "any address".
	PortRange   *string   `json:"port_range"`
	Source      *string   `json:"source"`
	Destination *string   `json:"destination"`
	Action      Action    `json:"action"`
	Description string    `json:"description"`
	CreatedAt   time.Time `json:"created_at"`
	// StartedAction is the action the rule's creation started (in its
	// answer only).
	StartedAction *ServerAction `json:"started_action,omitempty"`
}

// CreateFirewallRuleRequest is the body of CreateFirewallRule.
type CreateFirewallRuleRequest struct {
	Direction   Direction `json:"direction"`
	Protocol    Protocol  `json:"protocol"`
	PortRange   string    `json:"port_range,omitempty"`  // "22" or "8000-9000"
	Source      string    `json:"source,omitempty"`      // inbound only: address or CIDR
	Destination string    `json:"destination,omitempty"` // outbound only: address or CIDR
	Action      Action    `json:"action"`
	Description string    `json:"description,omitempty"`
}

// APIKey is a deployment API key with its usage; never its secret.
type APIKey struct {
	ID        string     `json:"id"`
	ServerID  string     `json:"server_id"`
	Name      string     `json:"name"`
	Hint      string     `json:"hint"` // hearth_live_… and the last 4 characters
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt *time.Time `json:"expires_at"` // nil: never
	// Limits enforced by the node; 0 is unlimited.
	RequestsPerMinute int `json:"requests_per_minute"`
	TokensPerMinute   int `json:"tokens_per_minute"`
	// Usage as the node last reported it (cumulative).
	Requests         int64      `json:"requests"`
	PromptTokens     int64      `json:"prompt_tokens"`
	CompletionTokens int64      `json:"completion_tokens"`
	LastUsedAt       *time.Time `json:"last_used_at"`
}

// CreatedAPIKey is the answer to CreateAPIKey: the only one that carries
// the secret. Key is nil when the answer is an Idempotency-Key replay: the
// secret was shown in the first answer and the control plane never stored
// it.
type CreatedAPIKey struct {
	APIKey
	Key *string `json:"key"`
	// Action is the action the creation started: success once the node
	// enforces the key.
	Action *ServerAction `json:"action,omitempty"`
}

// CreateAPIKeyRequest is the body of CreateAPIKey.
type CreateAPIKeyRequest struct {
	Name              string     `json:"name"`
	ExpiresAt         *time.Time `json:"expires_at,omitempty"` // nil: never expires
	RequestsPerMinute int        `json:"requests_per_minute,omitempty"`
	TokensPerMinute   int        `json:"tokens_per_minute,omitempty"`
}

// List is one page of a list. NextCursor is nil on the last page.
type List[T any] struct {
	Data       []T     `json:"data"`
	HasMore    bool    `json:"has_more"`
	NextCursor *string `json:"next_cursor"`
}

// ListParams selects a page: Limit is 1–100 (0: the API's default, 20),
// Cursor a previous page's NextCursor ("" for the first page).
type ListParams struct {
	Limit  int    `query:"limit"`
	Cursor string `query:"cursor"`
}

// ListServersParams selects a page of servers, optionally of one status.
type ListServersParams struct {
	ListParams
	Status ServerStatus `query:"status"`
}

// ActionCommand is what an action does.
type ActionCommand string

// Action commands.
const (
	CommandCreate             ActionCommand = "create"
	CommandUpdateModel        ActionCommand = "update_model"
	CommandRename             ActionCommand = "rename"
	CommandDelete             ActionCommand = "delete"
	CommandAPIKeyCreate       ActionCommand = "api_key_create"
	CommandAPIKeyDelete       ActionCommand = "api_key_delete"
	CommandFirewallRuleAdd    ActionCommand = "firewall_rule_add"
	CommandFirewallRuleDelete ActionCommand = "firewall_rule_delete"
	CommandSSHKeysUpdate      ActionCommand = "ssh_keys_update"
)

// ActionCommands returns every command.
func ActionCommands() []ActionCommand {
	return []ActionCommand{CommandCreate, CommandUpdateModel, CommandRename, CommandDelete, CommandAPIKeyCreate,
		CommandAPIKeyDelete, CommandFirewallRuleAdd, CommandFirewallRuleDelete, CommandSSHKeysUpdate}
}

// ActionStatus is where an action is.
type ActionStatus string

// Action statuses.
const (
	ActionStatusRunning ActionStatus = "running"
	ActionStatusSuccess ActionStatus = "success"
	ActionStatusError   ActionStatus = "error"
)

// ActionStatuses returns every action status.
func ActionStatuses() []ActionStatus {
	return []ActionStatus{ActionStatusRunning, ActionStatusSuccess, ActionStatusError}
}

// ServerAction is a change to a server, from the request until its node
// has done it (control/README.md, "Actions").
type ServerAction struct {
	ID      string        `json:"id"`
	Command ActionCommand `json:"command"`
	Status  ActionStatus  `json:"status"`
	// Progress is a percentage: a create's or model change's pull.
	Progress   int              `json:"progress"`
	StartedAt  time.Time        `json:"started_at"`
	FinishedAt *time.Time       `json:"finished_at"`
	Error      *ActionError     `json:"error"`
	Resources  []ActionResource `json:"resources"`
}

// ActionResource is something an action touched.
type ActionResource struct {
	Type string `json:"type"` // server, api_key, firewall_rule, ssh_key
	ID   string `json:"id"`
}

// ActionError is why an action failed.
type ActionError struct {
	Code    string `json:"code"` // timeout, apply_failed, server_deleted, superseded
	Message string `json:"message"`
}

// ListActionsParams selects a page of the project's actions, optionally
// of one status.
type ListActionsParams struct {
	ListParams
	Status ActionStatus `query:"status"`
}

// UsageGranularity is the length of a usage bucket.
type UsageGranularity string

// Usage granularities.
const (
	Hourly UsageGranularity = "hour"
	Daily  UsageGranularity = "day"
)

// UsageGranularities returns every granularity.
func UsageGranularities() []UsageGranularity { return []UsageGranularity{Hourly, Daily} }

// UsageGroupBy is what usage is grouped by.
type UsageGroupBy string

// Usage groupings.
const (
	ByServer UsageGroupBy = "server"
	ByAPIKey UsageGroupBy = "api_key"
)

// UsageGroupings returns every grouping.
func UsageGroupings() []UsageGroupBy { return []UsageGroupBy{ByServer, ByAPIKey} }

// UsageParams select a usage window: Start is required; End zero is now;
// Granularity "" is a day; GroupBy "" is ungrouped.
type UsageParams struct {
	Start       time.Time        `query:"start"`
	End         time.Time        `query:"end"`
	Granularity UsageGranularity `query:"granularity"`
	GroupBy     UsageGroupBy     `query:"group_by"`
}

// Usage is usage over a window, bucket by bucket.
type Usage struct {
	Start       time.Time        `json:"start"`
	End         time.Time        `json:"end"`
	Granularity UsageGranularity `json:"granularity"`
	GroupBy     *UsageGroupBy    `json:"group_by"`
	Data        []UsageBucket    `json:"data"`
}

// UsageBucket is one hour or day of usage: one result, or one per group.
type UsageBucket struct {
	Start   time.Time     `json:"start"`
	End     time.Time     `json:"end"`
	Results []UsageResult `json:"results"`
}

// UsageResult is what was used in a bucket, by a group if grouped.
type UsageResult struct {
	ServerID         string `json:"server_id,omitempty"`
	APIKeyID         string `json:"api_key_id,omitempty"`
	Requests         int64  `json:"requests"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	ReasoningTokens  int64  `json:"reasoning_tokens"`
	Errors           int64  `json:"errors"`
	// TTFTP50 and TTFTP95 are the median and 95th percentile of the time
	// to first token, in milliseconds; nil without a request that had one.
	TTFTP50 *float64 `json:"ttft_p50_ms"`
	TTFTP95 *float64 `json:"ttft_p95_ms"`
}

// AuditLogEntry is one mutating request of the project.
type AuditLogEntry struct {
	ID          string    `json:"id"`
	Time        time.Time `json:"time"`
	TokenID     string    `json:"token_id"`
	TokenName   string    `json:"token_name"`
	Method      string    `json:"method"`
	Path        string    `json:"path"`
	Status      int       `json:"status"`
	RequestID   string    `json:"request_id"`
	SourceIP    string    `json:"source_ip"`
	ResourceIDs []string  `json:"resource_ids"`
	ActionIDs   []string  `json:"action_ids"`
}

// ListAuditLogParams selects a page of the audit log: entries from Start
// (zero: the first) until End (zero: now), of one token or one resource.
type ListAuditLogParams struct {
	ListParams
	Start      time.Time `query:"start"`
	End        time.Time `query:"end"`
	TokenID    string    `query:"token_id"`
	ResourceID string    `query:"resource_id"`
}
