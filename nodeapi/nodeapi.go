// Package nodeapi is the protocol between the control plane and the hearthd
// node agent: the messages both sides speak and the node's HTTP client.
//
// A node enrolls once with an enrollment token and receives its own node
// credential. It then long-polls its desired state by revision and posts
// what it applied. Every credential travels as "Authorization: Bearer".
package nodeapi

// Paths of the node protocol, relative to the control plane's base URL.
const (
	PathEnroll   = "/v1/nodes/enroll"
	PathDesired  = "/v1/nodes/self/desired"
	PathObserved = "/v1/nodes/self/observed"
)

// DefaultWait is how long the control plane holds a desired-state long-poll
// open when nothing changes.
const DefaultWait = 30

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

// SSHKey is one authorized key; its JSON shape matches sshkeys.Key.
type SSHKey struct {
	ID          string `json:"id"`
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
}

// FirewallRule is one canonical firewall rule; its JSON shape matches
// firewall.Rule.
type FirewallRule struct {
	ID          string `json:"id,omitempty"`
	Direction   string `json:"direction"`
	Protocol    string `json:"protocol"`
	PortRange   string `json:"port_range,omitempty"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination,omitempty"`
	Action      string `json:"action"`
	Description string `json:"description,omitempty"`
}

// Desired is everything a node must enforce at one revision. A node with no
// server assigned gets no server, no keys and no rules. Wipe asks the node to
// remove the server's keys and rules and report back; the control plane then
// returns the node to the pool.
type Desired struct {
	NodeID        string         `json:"node_id"`
	Revision      uint64         `json:"revision"`
	Server        *Server        `json:"server"`
	Model         string         `json:"model,omitempty"`
	SSHKeys       []SSHKey       `json:"ssh_keys"`
	FirewallRules []FirewallRule `json:"firewall_rules"`
	Wipe          bool           `json:"wipe"`
}

// Observed is what a node reports it applied. Revision is the desired
// revision the node has processed; FirewallRevision and SSHKeysRevision are
// the last revisions applied successfully, and the *Error fields describe
// the failure of a later one.
type Observed struct {
	Revision         uint64 `json:"revision"`
	IP               string `json:"ip,omitempty"`
	RuntimeHealthy   bool   `json:"runtime_healthy"`
	RuntimeError     string `json:"runtime_error,omitempty"`
	FirewallRevision uint64 `json:"firewall_revision"`
	FirewallError    string `json:"firewall_error,omitempty"`
	SSHKeysRevision  uint64 `json:"ssh_keys_revision"`
	SSHKeysError     string `json:"ssh_keys_error,omitempty"`
	// Wiped reports that the wipe requested at Revision is done.
	Wiped bool `json:"wiped"`
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
