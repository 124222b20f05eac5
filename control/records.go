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
)

// Stacks a server can run.
const (
	StackDeployment = "deployment"
	StackBare       = "bare"
)

// Store key space. Every key of the control plane starts with "ctl/". The
// "seq" indexes order records by creation: seq is the global revision at
// which the record was made, zero-padded so byte order is numeric order.
const (
	keyRevision    = "ctl/meta/rev"
	pfxServer      = "ctl/srv/"
	pfxServerSeq   = "ctl/srvseq/"
	pfxServerName  = "ctl/srvname/"
	pfxSSHKey      = "ctl/sk/"
	pfxSSHKeySeq   = "ctl/skseq/"
	pfxSSHKeyFP    = "ctl/skfp/"
	pfxRule        = "ctl/fw/" // ctl/fw/<server id>/<seq>/<rule id>
	pfxRuleID      = "ctl/fwid/"
	pfxNode        = "ctl/node/"
	pfxNodeCred    = "ctl/nodecred/"
	pfxAPIToken    = "ctl/tok/"
	pfxEnrollment  = "ctl/enr/"
	pfxIdempotency = "ctl/idem/"
)

func seqKey(seq uint64, id string) string { return fmt.Sprintf("%020d/%s", seq, id) }

type serverRec struct {
	ID        string    `json:"id"`
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
}

type sshKeyRec struct {
	ID          string    `json:"id"`
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
	ServerID  string        `json:"server_id"`
	Rule      firewall.Rule `json:"rule"`
	Seq       uint64        `json:"seq"`
	CreatedAt time.Time     `json:"created_at"`
}

func (r ruleRec) key() string { return pfxRule + r.ServerID + "/" + seqKey(r.Seq, r.ID) }

type nodeRec struct {
	ID             string            `json:"id"`
	Hostname       string            `json:"hostname"`
	Hardware       nodeapi.Hardware  `json:"hardware"`
	CredentialHash string            `json:"credential_hash"`
	ServerID       string            `json:"server_id,omitempty"`
	Revision       uint64            `json:"revision"`
	Observed       *nodeapi.Observed `json:"observed,omitempty"`
	ObservedAt     time.Time         `json:"observed_at,omitzero"`
	LastSeen       time.Time         `json:"last_seen"`
	CreatedAt      time.Time         `json:"created_at"`
}

type tokenRec struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Hash      string    `json:"hash"`
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
