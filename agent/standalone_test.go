package agent_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/agent"
	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/internal/sshdtest"
	"github.com/hearthd/hearth/sshkeys"
)

func pubKeyLine(t *testing.T, comment string) string {
	t.Helper()
	_, line := sshdtest.NewSigner(t)
	return line + " " + comment
}

func TestParseLocalDesired(t *testing.T) {
	alice, bob := pubKeyLine(t, "alice@laptop"), pubKeyLine(t, "bob@desk")
	rules, keys, err := agent.ParseLocalDesired([]byte(`{
		"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "22", "source": "10.0.0.7", "action": "allow"}],
		"ssh_keys": [` + jsonString(alice) + `, {"id": "bob", "public_key": ` + jsonString(bob) + `}]}`))
	if err != nil {
		t.Fatal(err)
	}
	// Rules come back canonical: a bare address is a /32.
	if len(rules) != 1 || rules[0].Source != "10.0.0.7/32" {
		t.Fatalf("rules %+v", rules)
	}
	pa, _ := sshkeys.Parse(alice)
	if len(keys) != 2 || keys[1].ID != "bob" || keys[0].Fingerprint != pa.Fingerprint ||
		!strings.HasPrefix(keys[0].ID, "local-") || strings.ContainsAny(keys[0].ID, "+/=:") {
		t.Fatalf("keys %+v", keys)
	}
	// The derived id is stable.
	_, again, _ := agent.ParseLocalDesired([]byte(`{"ssh_keys": [` + jsonString(alice) + `]}`))
	if again[0].ID != keys[0].ID {
		t.Fatalf("derived id changed: %s vs %s", again[0].ID, keys[0].ID)
	}
	// Empty object and empty lists are a valid "enforce nothing".
	if r, k, err := agent.ParseLocalDesired([]byte(`{}`)); err != nil || len(r) != 0 || len(k) != 0 {
		t.Fatalf("empty: %v %v %v", r, k, err)
	}

	for name, body := range map[string]string{
		"not json":            `{`,
		"trailing data":       `{} {}`,
		"unknown field":       `{"firewall_rule": []}`,
		"unknown key field":   `{"ssh_keys": [{"id": "a", "key": "x"}]}`,
		"bad rule":            `{"firewall_rules": [{"direction": "sideways", "protocol": "tcp", "action": "allow"}]}`,
		"bad port":            `{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "70000", "action": "allow"}]}`,
		"bad key":             `{"ssh_keys": ["ssh-ed25519 notbase64"]}`,
		"bad id":              `{"ssh_keys": [{"id": "a b", "public_key": ` + jsonString(alice) + `}]}`,
		"duplicate key":       `{"ssh_keys": [` + jsonString(alice) + `, ` + jsonString(alice) + `]}`,
		"fingerprint differs": `{"ssh_keys": [{"id": "a", "public_key": ` + jsonString(alice) + `, "fingerprint": "SHA256:nope"}]}`,
	} {
		if _, _, err := agent.ParseLocalDesired([]byte(body)); err == nil {
			t.Errorf("%s: accepted %s", name, body)
		}
	}
}

func jsonString(s string) string { return `"` + s + `"` }

// writeFile replaces path atomically, as a config tool would, and makes the
// change visible to a poller even within one mtime tick.
func writeFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The standalone agent's tests run in a synctest bubble: each poll is one
// PollInterval of bubble time, so "after the next poll" is exact.
const standalonePoll = 20 * time.Millisecond

type standaloneRun struct {
	sa   *agent.Standalone
	enf  *agent.Enforcer
	fw   *firewall.Fake
	keys *sshkeys.Fake
	stop func() error
}

func startStandalone(t *testing.T, path string) *standaloneRun {
	r := &standaloneRun{fw: &firewall.Fake{}, keys: sshkeys.NewFake()}
	r.enf = agent.NewEnforcer(agent.Concerns{Firewall: r.fw, SSHKeys: r.keys}, nil)
	r.sa = agent.NewStandalone(path, r.enf, nil, agent.StandaloneConfig{PollInterval: standalonePoll})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.sa.Run(ctx) }()
	var once sync.Once
	var err error
	r.stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = r.stop() })
	synctest.Wait() // the file is read and applied at once
	return r
}

// poll lets one poll interval pass.
func poll() { pass(standalonePoll) }

func TestStandaloneAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "desired.json")
		alice := pubKeyLine(t, "alice")
		writeFile(t, path, `{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "22", "action": "allow"}],
		"ssh_keys": [{"id": "alice", "public_key": `+jsonString(alice)+`}]}`)
		r := startStandalone(t, path)
		fw, keys := r.fw, r.keys

		applied := func(what string, cond func(rules []firewall.Rule, keys []sshkeys.Key) bool) {
			t.Helper()
			rules, _ := fw.Rules()
			k, _ := keys.Keys()
			if !cond(rules, k) {
				t.Fatalf("%s: rules %v, keys %v", what, rules, k)
			}
		}
		applied("first file applied", func(r []firewall.Rule, k []sshkeys.Key) bool {
			return len(r) == 1 && r[0].PortRange == "22" && len(k) == 1 && k[0].ID == "alice"
		})
		if st := r.sa.Status(); st.SHA256 == "" || st.Revision != 1 || st.Rules != 1 || st.Keys != 1 || st.FileError != "" ||
			!st.Observed.InForce(1) || !r.enf.Enforced() {
			t.Fatalf("status %+v", st)
		}

		// A change is picked up at the next poll.
		writeFile(t, path, `{"firewall_rules": [{"direction": "inbound", "protocol": "udp", "port_range": "53", "action": "deny"}], "ssh_keys": []}`)
		poll()
		applied("second file applied", func(r []firewall.Rule, k []sshkeys.Key) bool {
			return len(r) == 1 && r[0].Protocol == "udp" && len(k) == 0
		})
		if st := r.sa.Status(); st.Revision != 2 || !st.Observed.InForce(2) {
			t.Fatalf("status %+v", st)
		}
		appliesBefore := len(fw.Applied())
		syncsBefore, _ := keys.Syncs()

		// An invalid file leaves the last state in force and is reported.
		writeFile(t, path, `{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "0", "action": "allow"}]}`)
		poll()
		if st := r.sa.Status(); st.FileError == "" || !r.enf.Enforced() {
			t.Fatalf("invalid file: status %+v", st)
		}
		// A missing file too.
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		poll()
		if st := r.sa.Status(); !strings.Contains(st.FileError, "no such file") {
			t.Fatalf("missing file: status %+v", st)
		}
		pass(5 * standalonePoll)
		if n := len(fw.Applied()); n != appliesBefore {
			t.Fatalf("a bad file caused %d firewall applies", n-appliesBefore)
		}
		if n, _ := keys.Syncs(); n != syncsBefore {
			t.Fatalf("a bad file caused %d key syncs", n-syncsBefore)
		}
		if rules, _ := fw.Rules(); len(rules) != 1 || rules[0].Protocol != "udp" {
			t.Fatalf("rules in force changed: %+v", rules)
		}

		// A failing apply is retried every poll until it succeeds; the
		// status says why meanwhile.
		fw.FailWith(errors.New("nft: no such table"))
		keys.SetErr(errors.New("disk full"))
		writeFile(t, path, `{"firewall_rules": [], "ssh_keys": [`+jsonString(alice)+`]}`)
		poll()
		st := r.sa.Status()
		if st.FileError != "" || !strings.Contains(st.Observed.Firewall.Error, "no such table") || st.Observed.SSHKeys.Error != "disk full" ||
			r.enf.Enforced() {
			t.Fatalf("apply errors: status %+v", st)
		}
		syncsBefore, _ = keys.Syncs()
		pass(3 * standalonePoll)
		if n, _ := keys.Syncs(); n != syncsBefore+3 {
			t.Fatalf("%d key syncs in 3 polls, want 3 retries", n-syncsBefore)
		}
		fw.FailWith(nil)
		poll()
		if rules, ok := fw.Rules(); !ok || len(rules) != 0 || r.sa.Status().Observed.Firewall.Error != "" {
			t.Fatalf("firewall retried: rules %v, status %+v", rules, r.sa.Status())
		}
		fwApplies := len(fw.Applied())
		keys.SetErr(nil)
		poll()
		applied("keys retried", func(_ []firewall.Rule, k []sshkeys.Key) bool { return len(k) == 1 })
		if st := r.sa.Status(); st.Observed.Failed() || st.Keys != 1 || !r.enf.Enforced() {
			t.Fatalf("errors not cleared: %+v", st)
		}
		// Once both are in force nothing is re-applied, and rewriting the
		// file with the same content applies nothing either.
		pass(5 * standalonePoll)
		writeFile(t, path, `{"firewall_rules": [], "ssh_keys": [`+jsonString(alice)+`]}`)
		pass(5 * standalonePoll)
		if n := len(fw.Applied()); n != fwApplies {
			t.Fatalf("%d firewall applies after convergence", n-fwApplies)
		}
		if st := r.sa.Status(); st.Revision != 3 {
			t.Fatalf("the same content made revision %d", st.Revision)
		}
	})
}

func TestStandaloneAgentWithoutFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "absent.json")
		r := startStandalone(t, path)
		if st := r.sa.Status(); st.FileError == "" || r.enf.Enforced() {
			t.Fatalf("missing file: status %+v", st)
		}
		if _, ok := r.fw.Rules(); ok {
			t.Fatal("a missing file applied firewall rules")
		}
		if _, ok := r.keys.Keys(); ok {
			t.Fatal("a missing file synced keys")
		}
		// The file appearing later is applied.
		writeFile(t, path, `{"firewall_rules": [{"direction": "outbound", "protocol": "icmp", "action": "deny"}]}`)
		poll()
		rules, _ := r.fw.Rules()
		if _, synced := r.keys.Keys(); len(rules) != 1 || !synced || !r.enf.Enforced() {
			t.Fatalf("file not applied once it exists: rules %v, keys synced %v", rules, synced)
		}
		if err := r.stop(); err != nil {
			t.Fatal(err)
		}
	})
	enf := agent.NewEnforcer(agent.Concerns{Firewall: &firewall.Fake{}, SSHKeys: sshkeys.NewFake()}, nil)
	if err := agent.NewStandalone("", enf, nil, agent.StandaloneConfig{}).Run(context.Background()); err == nil {
		t.Fatal("Run without a path succeeded")
	}
}
