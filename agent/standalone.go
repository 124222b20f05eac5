package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/sshkeys"
)

// LocalDesired is the desired-state file of a node without a control plane
// (--desired-state-file). Its two fields have the names and shapes of
// nodeapi.Desired's, so a desired state fetched from a control plane can be
// trimmed into one:
//
//	{
//	  "firewall_rules": [
//	    {"direction": "inbound", "protocol": "tcp", "port_range": "22", "action": "allow"}
//	  ],
//	  "ssh_keys": [
//	    "ssh-ed25519 AAAA… alice@laptop",
//	    {"id": "bob", "public_key": "ssh-ed25519 AAAA… bob@desk"}
//	  ]
//	}
//
// A key is either an authorized_keys line or an object; a key without an id
// gets one derived from its fingerprint, so the same key keeps its id across
// edits. Unknown fields are an error, so a misspelt field never silently
// leaves a firewall open.
type LocalDesired struct {
	FirewallRules []firewall.Rule `json:"firewall_rules"`
	SSHKeys       []LocalKey      `json:"ssh_keys"`
}

// LocalKey is one entry of LocalDesired.SSHKeys.
type LocalKey sshkeys.Key

// UnmarshalJSON accepts a bare authorized_keys line or a key object.
func (k *LocalKey) UnmarshalJSON(b []byte) error {
	var line string
	if err := json.Unmarshal(b, &line); err == nil {
		*k = LocalKey{PublicKey: line}
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var key sshkeys.Key
	if err := dec.Decode(&key); err != nil {
		return err
	}
	*k = LocalKey(key)
	return nil
}

// maxDesiredFile bounds how much of the desired-state file is read.
const maxDesiredFile = 4 << 20

// keyIDPattern is the id alphabet the authorized_keys writer accepts
// (checked here too, so a bad id rejects the whole file before anything is
// applied).
var keyIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,128}$`)

// ParseLocalDesired decodes and validates a desired-state file. It returns
// the canonical firewall rules and the keys, with ids filled in, exactly as
// they will be applied.
func ParseLocalDesired(data []byte) ([]firewall.Rule, []sshkeys.Key, error) {
	var d LocalDesired
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return nil, nil, fmt.Errorf("decode: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, nil, errors.New("decode: trailing data after the JSON object")
	}
	rules, err := firewall.CanonicalizeAll(d.FirewallRules)
	if err != nil {
		return nil, nil, fmt.Errorf("firewall_rules: %w", err)
	}
	keys := make([]sshkeys.Key, 0, len(d.SSHKeys))
	seen := map[string]int{}
	for i, lk := range d.SSHKeys {
		k := sshkeys.Key(lk)
		pk, err := sshkeys.Parse(k.PublicKey)
		if err != nil {
			return nil, nil, fmt.Errorf("ssh_keys[%d]: %w", i, err)
		}
		if k.Fingerprint != "" && k.Fingerprint != pk.Fingerprint {
			return nil, nil, fmt.Errorf("ssh_keys[%d]: fingerprint %s does not match the key (%s)", i, k.Fingerprint, pk.Fingerprint)
		}
		k.Fingerprint = pk.Fingerprint
		if k.ID == "" {
			k.ID = localKeyID(pk.Fingerprint)
		}
		if !keyIDPattern.MatchString(k.ID) {
			return nil, nil, fmt.Errorf("ssh_keys[%d]: id must be 1 to 128 letters, digits, '_', '-' or '.'", i)
		}
		if j, dup := seen[k.ID]; dup {
			return nil, nil, fmt.Errorf("ssh_keys[%d]: id %s is already used by ssh_keys[%d] (the same key listed twice?)", i, k.ID, j)
		}
		seen[k.ID] = i
		keys = append(keys, k)
	}
	return rules, keys, nil
}

// localKeyID derives a stable id from a fingerprint ("SHA256:<base64>"):
// the base64 alphabet's '+' and '/' are not allowed in ids.
func localKeyID(fingerprint string) string {
	fp := strings.TrimPrefix(fingerprint, "SHA256:")
	fp = strings.NewReplacer("+", "-", "/", "_").Replace(fp)
	return "local-" + fp[:min(len(fp), 24)]
}

// StandaloneConfig tunes a Standalone agent; the zero value is usable.
type StandaloneConfig struct {
	// PollInterval is how often the file's metadata is checked and failed
	// applies are retried. Default 2 s.
	PollInterval time.Duration
}

// StandaloneStatus is what a Standalone agent has read and has in force.
type StandaloneStatus struct {
	// SHA256 is the hash of the file content in force; empty until a valid
	// file was read.
	SHA256 string
	// Revision counts the contents read, starting at 1: the revision of
	// that content for the enforcer.
	Revision uint64
	// LoadedAt is when that content was read.
	LoadedAt time.Time
	// Rules and Keys count what the file asks for.
	Rules, Keys int
	// FileError is why the current file is not in force (unreadable,
	// invalid); the previous content stays applied.
	FileError string
	// Observed is what the enforcer has in force, concern by concern; a
	// failed concern is retried every poll.
	Observed Observed
}

// Standalone keeps the host at what a local file says, through its
// Enforcer, for a node that has no control plane.
type Standalone struct {
	path string
	enf  *Enforcer
	log  *slog.Logger
	cfg  StandaloneConfig

	mu     sync.Mutex
	status StandaloneStatus // all but Observed
}

// NewStandalone returns an agent enforcing the desired-state file at path
// (format: LocalDesired) through enf.
func NewStandalone(path string, enf *Enforcer, logger *slog.Logger, cfg StandaloneConfig) *Standalone {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 2 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Standalone{path: path, enf: enf, cfg: cfg,
		log: logger.With("component", "standalone", "path", path)}
}

// Status returns what is read and what is in force.
func (a *Standalone) Status() StandaloneStatus {
	a.mu.Lock()
	st := a.status
	a.mu.Unlock()
	st.Observed = a.enf.Observed()
	return st
}

// fileStamp identifies one version of the file without reading it. The
// inode is part of it because editors and atomic writers replace the file
// by rename, possibly within the mtime's resolution.
type fileStamp struct {
	mtime time.Time
	size  int64
	ino   uint64
}

// Run applies the file at once, then polls it every PollInterval until ctx
// ends. A file that cannot be read or does not validate changes nothing: the
// last applied state stays in force and the problem is logged (once per
// version of the file). A failed apply is retried every poll.
func (a *Standalone) Run(ctx context.Context) error {
	if a.path == "" {
		return errors.New("standalone: desired-state file path is required")
	}
	a.log.Info("enforcing the local desired-state file", "poll", a.cfg.PollInterval)
	var (
		last      fileStamp
		haveStamp bool
	)
	tick := time.NewTicker(a.cfg.PollInterval)
	defer tick.Stop()
	for {
		st, err := stat(a.path)
		applied := false
		switch {
		case err != nil:
			if !haveStamp || last != (fileStamp{}) {
				a.fileProblem(err)
			}
			last, haveStamp = fileStamp{}, true
		case !haveStamp || st != last:
			last, haveStamp = st, true
			if d, ok := a.read(); ok {
				a.enf.Apply(ctx, d)
				applied = true
			}
		}
		if !applied {
			a.enf.Retry(ctx) // what is in force stays; what failed is tried again
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// read loads the file after a change and returns its content as a new
// desired state, or false when it is invalid or unchanged.
func (a *Standalone) read() (Desired, bool) {
	rules, keys, sum, err := a.load()
	if err != nil {
		a.fileProblem(err)
		return Desired{}, false
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.status.FileError = ""
	if sum == a.status.SHA256 {
		return Desired{}, false // touched or rewritten with the same content
	}
	rev := a.status.Revision + 1
	a.status = StandaloneStatus{SHA256: sum, Revision: rev, LoadedAt: time.Now(), Rules: len(rules), Keys: len(keys)}
	a.log.Info("desired-state file changed", "sha256", sum[:12], "revision", rev, "rules", len(rules), "keys", len(keys))
	return Desired{Revision: rev, FirewallRules: rules, SSHKeys: keys}, true
}

func (a *Standalone) fileProblem(err error) {
	a.mu.Lock()
	inForce := a.status.SHA256 != ""
	a.status.FileError = err.Error()
	a.mu.Unlock()
	if inForce {
		a.log.Error("desired-state file not applied; the previous state stays in force", "err", err)
	} else {
		a.log.Error("desired-state file not applied; nothing is enforced yet", "err", err)
	}
}

// load reads and validates the file.
func (a *Standalone) load() ([]firewall.Rule, []sshkeys.Key, string, error) {
	f, err := os.Open(a.path)
	if err != nil {
		return nil, nil, "", fmt.Errorf("open desired-state file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxDesiredFile+1))
	if err != nil {
		return nil, nil, "", fmt.Errorf("read desired-state file: %w", err)
	}
	if len(data) > maxDesiredFile {
		return nil, nil, "", fmt.Errorf("desired-state file is larger than %d bytes", maxDesiredFile)
	}
	rules, keys, err := ParseLocalDesired(data)
	if err != nil {
		return nil, nil, "", fmt.Errorf("desired-state file %s: %w", a.path, err)
	}
	sum := sha256.Sum256(data)
	return rules, keys, hex.EncodeToString(sum[:]), nil
}

func stat(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, fmt.Errorf("stat desired-state file: %w", err)
	}
	s := fileStamp{mtime: fi.ModTime(), size: fi.Size()}
	if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.ino = sys.Ino
	}
	return s, nil
}
