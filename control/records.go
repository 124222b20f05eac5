package control

import (
	"fmt"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
)

// Server statuses.
const (
	StatusProvisioning = "provisioning"
	StatusRunning      = "running"
	StatusFailed       = "failed"
	StatusDeleting     = "deleting"
	// StatusUpdating: a PATCH changed the model and the node does not
	// serve the new one yet.
	StatusUpdating = "updating"
	// StatusUnreachable: the node has not called in for NodeTimeout; the
	// status it hides is kept in serverRec.PrevStatus.
	StatusUnreachable = "unreachable"
)

// Stacks a server can run.
const (
	StackDeployment = "deployment"
	StackBare       = "bare"
)

// Store key space. Every key of the control plane starts with "ctl/". The
// "seq" indexes order records by creation: seq is the global revision at
// which the record was made, zero-padded so byte order is numeric order.
//
// A project's servers and SSH keys, with their indexes, live under the
// project's own prefix, ctl/p/<project id>/ (see projectKeys): a request
// reads only its token's project, so another project's ID is not found by
// the very read that finds no unknown ID, and a list is a scan of one
// project's index. Rules and API keys hang under their server's ID, which
// a request resolves within its project first.
const (
	keyRevision    = "ctl/meta/rev"
	keySchema      = "ctl/meta/schema"    // the layout version, see migrate.go
	keyCursorKey   = "ctl/meta/cursorkey" // the secret list cursors are sealed with
	pfxProject     = "ctl/proj/"          // <project id> → projectRec
	pfxProjectName = "ctl/projname/"      // <name> → project id
	pfxProjectData = "ctl/p/"             // <project id>/…: the project's records (projectKeys)
	pfxRule        = "ctl/fw/"            // ctl/fw/<server id>/<seq>/<rule id>
	pfxRuleID      = "ctl/fwid/"          // <server id>/<rule id> → its record's key
	pfxNode        = "ctl/node/"
	pfxNodeCred    = "ctl/nodecred/"
	pfxNodeSeen    = "ctl/nodeseen/" // <node id> → seenRec, persisted by the sweep
	pfxAPIToken    = "ctl/tok/"      // <hash of the secret> → tokenRec
	pfxAPITokenID  = "ctl/tokid/"    // <token id> → hash of the secret
	pfxEnrollment  = "ctl/enr/"
	pfxIdempotency = "ctl/idem/"  // <token id>/<Idempotency-Key>
	pfxAPIKey      = "ctl/dk/"    // ctl/dk/<server id>/<seq>/<key id>: the record, per server in creation order
	pfxAPIKeyID    = "ctl/dkid/"  // <server id>/<key id> → its record's key
	pfxAPIKeyExp   = "ctl/dkexp/" // <expiry, unix seconds, zero-padded>/<key id> → its record's key, for the expiry sweep
	pfxAPIKeyUsage = "ctl/dkuse/" // <key id> → its usage as the node last reported it
)

// projectKeys is one project's key space, ctl/p/<project id>/.
type projectKeys string

func keysOf(project string) projectKeys { return projectKeys(pfxProjectData + project + "/") }

func (k projectKeys) servers() string               { return string(k) + "srv/" }
func (k projectKeys) server(id string) string       { return k.servers() + id }
func (k projectKeys) serverSeq() string             { return string(k) + "srvseq/" }
func (k projectKeys) serverName(name string) string { return string(k) + "srvname/" + name }
func (k projectKeys) sshKeys() string               { return string(k) + "sk/" }
func (k projectKeys) sshKey(id string) string       { return k.sshKeys() + id }
func (k projectKeys) sshKeySeq() string             { return string(k) + "skseq/" }
func (k projectKeys) sshKeyFP(fp string) string     { return string(k) + "skfp/" + fp }
func (k projectKeys) tokens() string                { return string(k) + "tok/" }

func seqKey(seq uint64, id string) string { return fmt.Sprintf("%020d/%s", seq, id) }

type serverRec struct {
	ID        string    `json:"id"`
	Project   string    `json:"project"`
	Name      string    `json:"name"`
	Status    string    `json:"status"`
	Chip      string    `json:"chip"`
	RAM       int       `json:"ram"`
	Storage   int       `json:"storage"`
	Stack     string    `json:"stack"`
	Model     string    `json:"model,omitempty"`
	Billing   string    `json:"billing"`
	SSHKeyIDs []string  `json:"ssh_key_ids"`
	IP        string    `json:"ip,omitempty"`
	NodeID    string    `json:"node_id"`
	Seq       uint64    `json:"seq"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// PrevStatus is the status an unreachable server returns to when its
	// node calls in again; empty unless Status is unreachable.
	PrevStatus string `json:"prev_status,omitempty"`
	// RevBase is its node's revision just before the server was made: the
	// server's revisions on the node are those above it, and the API shows
	// them counted from it (its creation is 1), each node counting only
	// its own changes, so no revision tells a customer how busy anyone
	// else is. Zero in records made when nodes took global revisions.
	RevBase uint64 `json:"rev_base,omitempty"`
	// StatusSince is when the server entered its lifecycle state
	// (provisioning, updating, deleting): the timeouts count from it.
	// Becoming unreachable does not move it. Zero in records written
	// before it existed: CreatedAt or UpdatedAt stand in.
	StatusSince time.Time `json:"status_since,omitzero"`
	// Actions are the server's running actions (actions.go).
	Actions []runningAction `json:"actions,omitempty"`
}

func (r serverRec) key() string { return keysOf(r.Project).server(r.ID) }

// firstRev is the first revision of the server on its node: what a node
// reports of revisions before it is about its previous tenant.
func (r serverRec) firstRev() uint64 {
	if r.RevBase > 0 {
		return r.RevBase + 1
	}
	return r.Seq
}

// lifecycle is the status the server is in apart from reachability: the
// one it returns to when its node calls in again.
func (r serverRec) lifecycle() string {
	if r.Status == StatusUnreachable {
		return r.PrevStatus
	}
	return r.Status
}

// setLifecycle moves the server to a lifecycle status, behind
// "unreachable" if that is what it shows.
func (r *serverRec) setLifecycle(status string, at time.Time) {
	if r.Status == StatusUnreachable {
		r.PrevStatus = status
	} else {
		r.Status = status
	}
	r.StatusSince = at
}

// restore ends "unreachable": the server shows its lifecycle status again.
func (r *serverRec) restore() {
	r.Status, r.PrevStatus = r.PrevStatus, ""
	if r.Status == "" { // never written so; a safe reading if it were
		r.Status = StatusProvisioning
	}
}

// since is when the server entered its lifecycle status.
func (r serverRec) since() time.Time {
	switch {
	case !r.StatusSince.IsZero():
		return r.StatusSince
	case r.Status == StatusDeleting:
		return r.UpdatedAt
	default:
		return r.CreatedAt
	}
}

type sshKeyRec struct {
	ID          string    `json:"id"`
	Project     string    `json:"project"`
	Name        string    `json:"name"`
	PublicKey   string    `json:"public_key"`
	Fingerprint string    `json:"fingerprint"`
	Type        string    `json:"type"`
	Bits        int       `json:"bits"`
	Comment     string    `json:"comment,omitempty"`
	Seq         uint64    `json:"seq"`
	CreatedAt   time.Time `json:"created_at"`
}

type ruleRec struct {
	ID        string        `json:"id"`
	Project   string        `json:"project"`
	ServerID  string        `json:"server_id"`
	Rule      firewall.Rule `json:"rule"`
	Seq       uint64        `json:"seq"`
	CreatedAt time.Time     `json:"created_at"`
}

func (r ruleRec) key() string { return pfxRule + r.ServerID + "/" + seqKey(r.Seq, r.ID) }

func (r ruleRec) idKey() string { return pfxRuleID + r.ServerID + "/" + r.ID }

type nodeRec struct {
	ID             string           `json:"id"`
	Hostname       string           `json:"hostname"`
	Hardware       nodeapi.Hardware `json:"hardware"`
	CredentialHash string           `json:"credential_hash"`
	ServerID       string           `json:"server_id,omitempty"`
	ServerProject  string           `json:"server_project,omitempty"` // the project of ServerID
	Revision       uint64           `json:"revision"`
	// RevisionAt is when Revision was issued (zero in records older than
	// it), for the propagation delay.
	RevisionAt time.Time         `json:"revision_at,omitzero"`
	Observed   *nodeapi.Observed `json:"observed,omitempty"`
	ObservedAt time.Time         `json:"observed_at,omitzero"`
	LastSeen   time.Time         `json:"last_seen"`
	CreatedAt  time.Time         `json:"created_at"`
	// WipePending: the node's server was removed (after DeleteTimeout)
	// before the node reported the wipe. The node keeps being told to wipe
	// and stays out of the pool until it reports it.
	WipePending bool `json:"wipe_pending,omitempty"`
}

// seenRec holds a node's last request and last report that changed
// nothing, as the sweep persists them. They live apart from the node
// record, which every long-poll, report and credential check reads: on a
// database each write of a record invalidates it in every replica's read
// cache, and these times change with every request. A node's times are
// the later of its record's and these.
type seenRec struct {
	LastSeen   time.Time `json:"last_seen"`
	ObservedAt time.Time `json:"observed_at,omitzero"`
}

// overlay moves n's times up to sr's.
func (n *nodeRec) overlay(sr seenRec) {
	if sr.LastSeen.After(n.LastSeen) {
		n.LastSeen = sr.LastSeen
	}
	if sr.ObservedAt.After(n.ObservedAt) {
		n.ObservedAt = sr.ObservedAt
	}
}

// apiKeyRec is a deployment API key issued by the management API. Only the
// hash of the secret is kept.
type apiKeyRec struct {
	ID                string     `json:"id"`
	Project           string     `json:"project"`
	ServerID          string     `json:"server_id"`
	Name              string     `json:"name"`
	Hash              string     `json:"hash"`
	Hint              string     `json:"hint"`
	ExpiresAt         *time.Time `json:"expires_at,omitempty"`
	RequestsPerMinute int        `json:"requests_per_minute"`
	TokensPerMinute   int        `json:"tokens_per_minute"`
	Seq               uint64     `json:"seq"`
	CreatedAt         time.Time  `json:"created_at"`
}

func (k apiKeyRec) key() string { return pfxAPIKey + k.ServerID + "/" + seqKey(k.Seq, k.ID) }

func (k apiKeyRec) idKey() string { return pfxAPIKeyID + k.ServerID + "/" + k.ID }

// expKey is the key's entry in the expiry index; "" if it never expires.
func (k apiKeyRec) expKey() string {
	if k.ExpiresAt == nil {
		return ""
	}
	return fmt.Sprintf("%s%020d/%s", pfxAPIKeyExp, k.ExpiresAt.Unix(), k.ID)
}

// expired reports whether the key has expired at now.
func (k apiKeyRec) expired(now time.Time) bool {
	return k.ExpiresAt != nil && !now.Before(*k.ExpiresAt)
}

// Token scopes: a read-only token may only read (GET) its project.
const (
	ScopeReadWrite = "read_write"
	ScopeReadOnly  = "read_only"
)

// tokenRec is a management API token, stored under the hash of its secret
// (the lookup of every request) and indexed by ID and per project.
type tokenRec struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Hash    string `json:"hash"`
	Project string `json:"project"`
	Scope   string `json:"scope"`
	// LastUsedAt is persisted by the sweep from what requests noted in
	// memory, so a request costs no write.
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
}

// projectRec is a project: the tenant that tokens act for and that owns
// servers, SSH keys, firewall rules and API keys. Projects are never
// renamed, so their names can be cached.
type projectRec struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

type enrollmentRec struct {
	ID        string    `json:"id"`
	Hash      string    `json:"hash"`
	UsesLeft  int       `json:"uses_left"`
	ExpiresAt time.Time `json:"expires_at"`
	CreatedAt time.Time `json:"created_at"`
}

type idempotencyRec struct {
	RequestHash string    `json:"request_hash"`
	Status      int       `json:"status"`
	Body        []byte    `json:"body"`
	ExpiresAt   time.Time `json:"expires_at"`
}
