package daemon_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/hearthd/hearth/daemon"
	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/sshkeys"
)

func pubKeyLine(t *testing.T, comment string) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sp, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sp))) + " " + comment
}

func TestParseLocalDesired(t *testing.T) {
	alice, bob := pubKeyLine(t, "alice@laptop"), pubKeyLine(t, "bob@desk")
	rules, keys, err := daemon.ParseLocalDesired([]byte(`{
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
	_, again, _ := daemon.ParseLocalDesired([]byte(`{"ssh_keys": [` + jsonString(alice) + `]}`))
	if again[0].ID != keys[0].ID {
		t.Fatalf("derived id changed: %s vs %s", again[0].ID, keys[0].ID)
	}
	// Empty object and empty lists are a valid "enforce nothing".
	if r, k, err := daemon.ParseLocalDesired([]byte(`{}`)); err != nil || len(r) != 0 || len(k) != 0 {
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
		if _, _, err := daemon.ParseLocalDesired([]byte(body)); err == nil {
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

func TestStandaloneAgent(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "desired.json")
	fw := &firewall.Fake{}
	keys := sshkeys.NewFake()
	alice := pubKeyLine(t, "alice")
	writeFile(t, path, `{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "22", "action": "allow"}],
		"ssh_keys": [{"id": "alice", "public_key": `+jsonString(alice)+`}]}`)

	agent := daemon.NewStandaloneAgentConfig(path, fw, keys, nil, daemon.StandaloneConfig{PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	applied := func(what string, cond func(rules []firewall.Rule, keys []sshkeys.Key) bool) {
		t.Helper()
		waitFor(t, 5*time.Second, what, func() bool {
			r, _ := fw.Rules()
			k, _ := keys.Keys()
			return cond(r, k)
		})
	}
	applied("first file applied", func(r []firewall.Rule, k []sshkeys.Key) bool {
		return len(r) == 1 && r[0].PortRange == "22" && len(k) == 1 && k[0].ID == "alice"
	})
	if st := agent.Status(); st.SHA256 == "" || st.Rules != 1 || st.Keys != 1 || st.FileError != "" {
		t.Fatalf("status %+v", st)
	}

	// A change is picked up.
	writeFile(t, path, `{"firewall_rules": [{"direction": "inbound", "protocol": "udp", "port_range": "53", "action": "deny"}], "ssh_keys": []}`)
	applied("second file applied", func(r []firewall.Rule, k []sshkeys.Key) bool {
		return len(r) == 1 && r[0].Protocol == "udp" && len(k) == 0
	})
	appliesBefore := len(fw.Applied())
	syncsBefore, _ := keys.Syncs()

	// An invalid file leaves the last state in force and is reported.
	writeFile(t, path, `{"firewall_rules": [{"direction": "inbound", "protocol": "tcp", "port_range": "0", "action": "allow"}]}`)
	waitFor(t, 5*time.Second, "invalid file reported", func() bool { return agent.Status().FileError != "" })
	// A missing file too.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "missing file reported", func() bool {
		return strings.Contains(agent.Status().FileError, "no such file")
	})
	time.Sleep(100 * time.Millisecond) // several polls
	if n := len(fw.Applied()); n != appliesBefore {
		t.Fatalf("a bad file caused %d firewall applies", n-appliesBefore)
	}
	if n, _ := keys.Syncs(); n != syncsBefore {
		t.Fatalf("a bad file caused %d key syncs", n-syncsBefore)
	}
	if r, _ := fw.Rules(); len(r) != 1 || r[0].Protocol != "udp" {
		t.Fatalf("rules in force changed: %+v", r)
	}

	// A failing apply is retried until it succeeds; the status says why
	// meanwhile.
	fw.FailWith(errors.New("nft: no such table"))
	keys.SetErr(errors.New("disk full"))
	writeFile(t, path, `{"firewall_rules": [], "ssh_keys": [`+jsonString(alice)+`]}`)
	waitFor(t, 5*time.Second, "apply errors reported", func() bool {
		st := agent.Status()
		return st.FileError == "" && strings.Contains(st.FirewallError, "no such table") && st.SSHKeysError == "disk full"
	})
	fw.FailWith(nil)
	waitFor(t, 5*time.Second, "firewall retried", func() bool {
		r, ok := fw.Rules()
		return ok && len(r) == 0 && agent.Status().FirewallError == ""
	})
	fwApplies := len(fw.Applied())
	keys.SetErr(nil)
	applied("keys retried", func(_ []firewall.Rule, k []sshkeys.Key) bool { return len(k) == 1 })
	waitFor(t, 5*time.Second, "errors cleared", func() bool {
		st := agent.Status()
		return st.FirewallError == "" && st.SSHKeysError == "" && st.Keys == 1
	})
	// Once both are in force nothing is re-applied, and rewriting the file
	// with the same content applies nothing either.
	time.Sleep(100 * time.Millisecond)
	writeFile(t, path, `{"firewall_rules": [], "ssh_keys": [`+jsonString(alice)+`]}`)
	time.Sleep(100 * time.Millisecond)
	if n := len(fw.Applied()); n != fwApplies {
		t.Fatalf("%d firewall applies after convergence", n-fwApplies)
	}
}

func TestStandaloneAgentWithoutFile(t *testing.T) {
	fw := &firewall.Fake{}
	keys := sshkeys.NewFake()
	path := filepath.Join(t.TempDir(), "absent.json")
	agent := daemon.NewStandaloneAgentConfig(path, fw, keys, nil, daemon.StandaloneConfig{PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	waitFor(t, 5*time.Second, "missing file reported", func() bool { return agent.Status().FileError != "" })
	if _, ok := fw.Rules(); ok {
		t.Fatal("a missing file applied firewall rules")
	}
	if _, ok := keys.Keys(); ok {
		t.Fatal("a missing file synced keys")
	}
	// The file appearing later is applied.
	writeFile(t, path, `{"firewall_rules": [{"direction": "outbound", "protocol": "icmp", "action": "deny"}]}`)
	waitFor(t, 5*time.Second, "file applied once it exists", func() bool {
		r, _ := fw.Rules()
		_, synced := keys.Keys()
		return len(r) == 1 && synced
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := daemon.NewStandaloneAgent("", fw, keys, nil).Run(context.Background()); err == nil {
		t.Fatal("Run without a path succeeded")
	}
}
