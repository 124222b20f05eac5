package systemd

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The unit files shipped in the package, and the most exposure each may
// have by `systemd-analyze security` (0 = fully locked down, 10 = none).
var units = []struct {
	name        string
	maxExposure float64
}{
	{"hearthd.service", 5.0},
	{"hearthd.socket", 0},
	{"hearth-control.service", 3.0},
	{"hearth-control.socket", 0},
}

func systemdAnalyze(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatalf("systemd-analyze is needed to check the unit files (apt-get install systemd): %v", err)
	}
	return p
}

// verifyRoot builds a root directory for `systemd-analyze verify --root`:
// the host's units (for the targets ours depend on), ours, and stand-ins
// for the binaries ExecStart= names, since verify checks they exist.
func verifyRoot(t *testing.T, binaries ...string) string {
	t.Helper()
	root := t.TempDir()
	unitDir := filepath.Join(root, "usr/lib/systemd/system")
	if err := os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "usr/lib/systemd"), 0o755); err != nil {
		t.Fatal(err)
	}
	// The host's unit directory supplies sysinit.target and friends.
	if out, err := exec.Command("cp", "-a", "/usr/lib/systemd/system", filepath.Join(root, "usr/lib/systemd/")).CombinedOutput(); err != nil {
		t.Fatalf("copy host units: %v: %s", err, out)
	}
	for _, u := range units {
		b, err := os.ReadFile(u.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(unitDir, u.name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range binaries {
		if err := os.WriteFile(filepath.Join(root, "usr/bin", b), []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// verify runs systemd-analyze verify on our units in root and returns its
// complaints: any output at all counts, since unknown keys and bad values
// are only warnings to systemd (and silently ignored at run time).
func verify(t *testing.T, root string) string {
	t.Helper()
	args := []string{"verify", "--root=" + root, "--man=no"}
	for _, u := range units {
		args = append(args, u.name)
	}
	cmd := exec.Command(systemdAnalyze(t), args...)
	cmd.Dir = filepath.Join(root, "usr/lib/systemd/system")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return strings.TrimSpace(string(out)) + " (" + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

func TestUnitFilesVerify(t *testing.T) {
	root := verifyRoot(t, "hearthd", "hearth-control")
	if complaints := verify(t, root); complaints != "" {
		t.Fatalf("systemd-analyze verify:\n%s", complaints)
	}
}

// The check above must be able to fail: a missing binary and an unknown key
// are both reported.
func TestUnitFilesVerifyCatchesMistakes(t *testing.T) {
	root := verifyRoot(t, "hearth-control") // no hearthd
	if c := verify(t, root); !strings.Contains(c, "/usr/bin/hearthd") {
		t.Fatalf("missing /usr/bin/hearthd not reported; got %q", c)
	}

	root = verifyRoot(t, "hearthd", "hearth-control")
	p := filepath.Join(root, "usr/lib/systemd/system/hearth-control.service")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Replace(b, []byte("ProtectSystem=strict"), []byte("ProtectSytsem=strict"), 1)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if c := verify(t, root); !strings.Contains(c, "ProtectSytsem") {
		t.Fatalf("misspelt key not reported; got %q", c)
	}
}

var exposureRe = regexp.MustCompile(`Overall exposure level for \S+: ([0-9.]+)`)

func TestServiceExposure(t *testing.T) {
	for _, u := range units {
		if !strings.HasSuffix(u.name, ".service") {
			continue
		}
		t.Run(u.name, func(t *testing.T) {
			// --threshold makes the command fail above the limit; the score
			// is also parsed so the failure says by how much.
			cmd := exec.Command(systemdAnalyze(t), "security", "--offline=true", "--no-pager",
				"--threshold="+strconv.Itoa(int(u.maxExposure*10)), "./"+u.name)
			out, err := cmd.CombinedOutput()
			m := exposureRe.FindSubmatch(out)
			if m == nil {
				t.Fatalf("no exposure level in output (%v):\n%s", err, out)
			}
			score, perr := strconv.ParseFloat(string(m[1]), 64)
			if perr != nil {
				t.Fatal(perr)
			}
			t.Logf("%s exposure %.1f (limit %.1f)", u.name, score, u.maxExposure)
			if score > u.maxExposure || err != nil {
				t.Fatalf("%s exposure %.1f, limit %.1f (%v):\n%s", u.name, score, u.maxExposure, err, out)
			}
		})
	}
}

// Settings the daemons' code relies on; a unit edit that drops one breaks
// readiness, the watchdog or socket activation without any other test
// noticing.
func TestUnitContracts(t *testing.T) {
	want := map[string][]string{
		"hearthd.service": {
			"Type=notify", "NotifyAccess=main", "WatchdogSec=30s",
			"ExecStart=/usr/bin/hearthd serve --config /etc/hearth/hearthd.toml",
			"StateDirectory=hearth", "RuntimeDirectory=hearth",
			"CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_BIND_SERVICE CAP_DAC_OVERRIDE CAP_CHOWN CAP_FOWNER",
			"RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
			"Restart=on-failure", "StartLimitIntervalSec=0",
		},
		"hearthd.socket": {"FileDescriptorName=api", "Service=hearthd.service"},
		"hearth-control.service": {"Type=notify", "DynamicUser=yes", "StateDirectory=hearth-control", "CapabilityBoundingSet=\n",
			"Restart=on-failure", "StartLimitIntervalSec=0"},
		"hearth-control.socket": {"FileDescriptorName=api", "Service=hearth-control.service"},
	}
	for name, lines := range want {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			if !bytes.Contains(b, []byte(l)) {
				t.Errorf("%s lacks %q", name, l)
			}
		}
	}
	// The stop timeout must outlast the drain (shutdown_timeout, 30s).
	b, _ := os.ReadFile("hearthd.service")
	m := regexp.MustCompile(`(?m)^TimeoutStopSec=(\d+)s$`).FindSubmatch(b)
	if m == nil {
		t.Fatal("hearthd.service has no TimeoutStopSec=<n>s")
	}
	if n, _ := strconv.Atoi(string(m[1])); n <= 30 {
		t.Fatalf("TimeoutStopSec=%ds does not outlast the 30s drain", n)
	}
}

// What hearthd.service and hearth-control.service set in their daemons'
// environment reaches the benchmarks (HearthdEnvironment,
// ControlEnvironment), written so that splitting at spaces
// reads it as systemd does.
func TestUnitEnvironment(t *testing.T) {
	for unit, env := range map[string][]string{"hearthd.service": HearthdEnvironment(), "hearth-control.service": ControlEnvironment()} {
		for _, kv := range env {
			// The daemons run with Go's runtime as it comes: a tuning that
			// only a benchmark sees is not shipped.
			if strings.HasPrefix(kv, "GODEBUG=") {
				t.Errorf("%s sets %s", unit, kv)
			}
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsAny(kv, "\"'\\$%") {
				t.Errorf("%s: Environment= assignment %q: write it as NAME=value, unquoted", unit, kv)
			}
		}
	}
	got := unitEnvironment("[Service]\nEnvironment=A=1 B=2\n  Environment=C=3\nEnvironmentFile=/x\n# Environment=D=4\n")
	if want := []string{"A=1", "B=2", "C=3"}; !slices.Equal(got, want) {
		t.Fatalf("unitEnvironment = %q, want %q", got, want)
	}
}
