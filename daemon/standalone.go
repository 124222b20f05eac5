package daemon

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

// StandaloneConfig tunes a StandaloneAgent; the zero value is usable.
type StandaloneConfig struct {
	// PollInterval is how often the file's metadata is checked and failed
	// applies are retried. Default 2 s.
	PollInterval time.Duration
}

// StandaloneStatus is what a StandaloneAgent has in force.
type StandaloneStatus struct {
	// SHA256 is the hash of the file content in force; empty until a valid
	// file was read.
	SHA256 string
	// LoadedAt is when that content was read.
	LoadedAt time.Time
	// Rules and Keys count what the file asks for.
	Rules, Keys int
	// FileError is why the current file is not in force (unreadable,
	// invalid); the previous content stays applied.
	FileError string
	// FirewallError and SSHKeysError are the last apply failures of the
	// content in force; they are retried every poll.
	FirewallError, SSHKeysError string
}

// StandaloneAgent keeps the firewall and SSH keys at what a local file says,
// for a node that has no control plane.
type StandaloneAgent struct {
	path string
	fw   firewall.Firewall
	keys sshkeys.Keys
	log  *slog.Logger
	cfg  StandaloneConfig

	mu     sync.Mutex
	status StandaloneStatus
}

// NewStandaloneAgent returns an agent enforcing the desired-state file at
// path (format: LocalDesired) with fw and keys.
func NewStandaloneAgent(path string, fw firewall.Firewall, keys sshkeys.Keys, logger *slog.Logger) *StandaloneAgent {
	return NewStandaloneAgentConfig(path, fw, keys, logger, StandaloneConfig{})
}

// NewStandaloneAgentConfig is NewStandaloneAgent with tuning.
func NewStandaloneAgentConfig(path string, fw firewall.Firewall, keys sshkeys.Keys, logger *slog.Logger, cfg StandaloneConfig) *StandaloneAgent {
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 2 * time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &StandaloneAgent{path: path, fw: fw, keys: keys, cfg: cfg,
		log: logger.With("component", "standalone", "path", path)}
}

// Status returns what is in force.
func (a *StandaloneAgent) Status() StandaloneStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.status
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
func (a *StandaloneAgent) Run(ctx context.Context) error {
	if a.path == "" {
		return errors.New("standalone: desired-state file path is required")
	}
	a.log.Info("enforcing the local desired-state file", "poll", a.cfg.PollInterval)
	var (
		last       fileStamp
		haveStamp  bool
		rules      []firewall.Rule
		keys       []sshkeys.Key
		haveWanted bool
		fwOK       bool
		keysOK     bool
	)
	tick := time.NewTicker(a.cfg.PollInterval)
	defer tick.Stop()
	for {
		st, err := stat(a.path)
		switch {
		case err != nil:
			if !haveStamp || last != (fileStamp{}) {
				a.fileProblem(err)
			}
			last, haveStamp = fileStamp{}, true
		case !haveStamp || st != last:
			last, haveStamp = st, true
			r, k, sum, err := a.load()
			if err != nil {
				a.fileProblem(err)
				break
			}
			a.mu.Lock()
			same := sum == a.status.SHA256
			a.status.FileError = ""
			a.mu.Unlock()
			if same {
				break // touched or rewritten with the same content
			}
			rules, keys, haveWanted, fwOK, keysOK = r, k, true, false, false
			a.mu.Lock()
			a.status = StandaloneStatus{SHA256: sum, LoadedAt: time.Now(), Rules: len(r), Keys: len(k)}
			a.mu.Unlock()
			a.log.Info("desired-state file changed", "sha256", sum[:12], "rules", len(r), "keys", len(k))
		}
		if haveWanted && (!fwOK || !keysOK) {
			fwOK, keysOK = a.apply(ctx, rules, keys, fwOK, keysOK)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// apply enforces what is not yet in force and records the outcome.
func (a *StandaloneAgent) apply(ctx context.Context, rules []firewall.Rule, keys []sshkeys.Key, fwOK, keysOK bool) (bool, bool) {
	var fwErr, keysErr error
	if !fwOK {
		if fwErr = a.fw.Apply(ctx, rules); fwErr != nil {
			a.log.Error("apply firewall rules; retrying", "err", fwErr, "in", a.cfg.PollInterval)
		}
	}
	if !keysOK {
		if keysErr = a.keys.Sync(ctx, keys); keysErr != nil {
			a.log.Error("sync SSH keys; retrying", "err", keysErr, "in", a.cfg.PollInterval)
		}
	}
	a.mu.Lock()
	if !fwOK {
		a.status.FirewallError = errString(fwErr)
	}
	if !keysOK {
		a.status.SSHKeysError = errString(keysErr)
	}
	a.mu.Unlock()
	fwOK, keysOK = fwOK || fwErr == nil, keysOK || keysErr == nil
	if fwOK && keysOK {
		a.log.Info("desired-state file applied", "rules", len(rules), "keys", len(keys))
	}
	return fwOK, keysOK
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func (a *StandaloneAgent) fileProblem(err error) {
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
func (a *StandaloneAgent) load() ([]firewall.Rule, []sshkeys.Key, string, error) {
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
