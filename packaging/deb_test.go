// Package packaging_test builds the Debian package with build-deb.sh, runs
// lintian on it, and installs, upgrades, removes and purges it in a scratch
// root. It needs root and dpkg, lintian, init-system-helpers, systemd
// (systemd-tmpfiles) and util-linux (unshare, mount).
package packaging_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

const (
	v1 = "1.0.0~test1"
	v2 = "1.0.0~test2"
)

func need(t *testing.T, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed (apt-get install dpkg lintian init-system-helpers systemd util-linux): %v", tool, err)
		}
	}
	if os.Geteuid() != 0 {
		t.Fatal("installing into a scratch root needs root")
	}
}

// buildDeb runs build-deb.sh like `make deb` does and returns the package.
func buildDeb(t *testing.T, version, outdir string) string {
	t.Helper()
	cmd := exec.Command("./build-deb.sh", version, outdir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("build-deb.sh %s: %v\n%s", version, err, stderr.String())
	}
	deb := strings.TrimSpace(string(out))
	if want := filepath.Join(outdir, "hearth_"+version+"_amd64.deb"); deb != want {
		t.Fatalf("build-deb.sh printed %q, want %q", deb, want)
	}
	if _, err := os.Stat(deb); err != nil {
		t.Fatal(err)
	}
	return deb
}

var lintianLine = regexp.MustCompile(`^([EWIPX]): hearth: (\S+)`)

func lintian(t *testing.T, deb string) {
	t.Helper()
	out, err := exec.Command("lintian", "--tag-display-limit", "0", deb).CombinedOutput()
	readme, rerr := os.ReadFile("README.md")
	if rerr != nil {
		t.Fatal(rerr)
	}
	var errs, undocumented []string
	for _, line := range strings.Split(string(out), "\n") {
		m := lintianLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		switch m[1] {
		case "E":
			errs = append(errs, line)
		case "W":
			// Every warning we live with is explained in README.md.
			if !bytes.Contains(readme, []byte("`"+m[2]+"`")) {
				undocumented = append(undocumented, line)
			}
		}
	}
	if len(errs) > 0 || err != nil {
		t.Errorf("lintian errors (%v):\n%s", err, strings.Join(errs, "\n"))
	}
	if len(undocumented) > 0 {
		t.Errorf("lintian warnings not explained in packaging/README.md:\n%s", strings.Join(undocumented, "\n"))
	}
	t.Logf("lintian:\n%s", out)
}

// scratchRoot is an empty system for dpkg --root: a dpkg database and the
// directories a systemd host already has.
func scratchRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"var/lib/dpkg/info", "var/lib/dpkg/updates", "var/lib/dpkg/triggers",
		"var/log", "var/lib/systemd", "var/lib/private", "tmp", "root"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"var/lib/dpkg/status", "var/lib/dpkg/available"} {
		if err := os.WriteFile(filepath.Join(root, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(root, "root"), 0o700); err != nil {
		t.Fatal(err)
	}
	return root
}

// dpkg runs dpkg on root with the maintainer scripts run outside a chroot
// (the root has no shell or perl of its own) and DPKG_ROOT set. It runs in
// a private mount namespace where everything but the scratch root is
// read-only, so a script that ignored DPKG_ROOT and touched the host fails
// the test instead of changing this machine.
func dpkg(t *testing.T, root string, args ...string) string {
	t.Helper()
	script := `set -e
mount --bind "$ROOT" "$ROOT"
mount -o remount,bind,ro /
exec dpkg --root="$ROOT" --log="$ROOT/var/log/dpkg.log" --force-script-chrootless --force-depends "$@"`
	cmd := exec.Command("unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "dpkg"}, args...)...)
	cmd.Env = append(os.Environ(), "ROOT="+root, "TMPDIR="+filepath.Join(root, "tmp"))
	cmd.Stdin = nil // a conffile prompt would read EOF and fail
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func dpkgQuery(t *testing.T, root, format string) string {
	t.Helper()
	out, err := exec.Command("dpkg-query", "--admindir="+filepath.Join(root, "var/lib/dpkg"), "-W", "-f="+format, "hearth").CombinedOutput()
	if err != nil {
		return "not installed: " + strings.TrimSpace(string(out))
	}
	return string(out)
}

// tree lists every path under root except dpkg's database and log.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "var/lib/dpkg" || rel == "var/log" || rel == "tmp" {
			return fs.SkipDir
		}
		paths = append(paths, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(paths)
	return paths
}

func mode(t *testing.T, p string) fs.FileMode {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode()
}

func TestDebPackage(t *testing.T) {
	need(t, "dpkg", "dpkg-deb", "dpkg-query", "lintian", "deb-systemd-helper", "systemd-tmpfiles", "unshare", "mount", "go")
	out := t.TempDir()
	deb1 := buildDeb(t, v1, out)
	deb2 := buildDeb(t, v2, out)

	t.Run("lintian", func(t *testing.T) { lintian(t, deb1) })

	root := scratchRoot(t)
	before := tree(t, root)
	at := func(p string) string { return filepath.Join(root, p) }

	// Install.
	dpkg(t, root, "-i", deb1)
	if got := dpkgQuery(t, root, "${Status} ${Version}"); got != "install ok installed "+v1 {
		t.Fatalf("after install: %q", got)
	}
	for _, bin := range []string{"usr/bin/hearthd", "usr/bin/hearth-control", "usr/bin/hearth"} {
		if m := mode(t, at(bin)); !m.IsRegular() || m.Perm() != 0o755 {
			t.Errorf("%s: mode %v, want an executable file", bin, m)
		}
	}
	for _, u := range []string{"hearthd.service", "hearthd.socket", "hearth-control.service", "hearth-control.socket"} {
		got, err := os.ReadFile(at("usr/lib/systemd/system/" + u))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("..", "systemd", u))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("installed %s differs from systemd/%s", u, u)
		}
	}
	for _, f := range []string{"usr/lib/tmpfiles.d/hearth.conf", "usr/share/doc/hearth/copyright", "usr/share/doc/hearth/grafana-dashboard.json",
		"usr/share/doc/hearth/changelog.gz", "usr/share/man/man8/hearthd.8.gz", "usr/share/man/man8/hearth-control.8.gz"} {
		if m := mode(t, at(f)); !m.IsRegular() || m.Perm() != 0o644 {
			t.Errorf("%s: mode %v, want a 0644 file", f, m)
		}
	}
	for _, c := range []string{"etc/hearth/hearthd.toml", "etc/hearth/control.toml"} {
		if m := mode(t, at(c)); !m.IsRegular() || m.Perm() != 0o600 {
			t.Errorf("%s: mode %v, want a root-only (0600) file", c, m)
		}
	}
	conffiles := dpkgQuery(t, root, "${Conffiles}")
	for _, c := range []string{"/etc/hearth/hearthd.toml", "/etc/hearth/control.toml"} {
		if !strings.Contains(conffiles, c) {
			t.Errorf("%s is not a conffile; dpkg lists %q", c, conffiles)
		}
	}
	// postinst ran systemd-tmpfiles for /root/.ssh ...
	if m := mode(t, at("root/.ssh")); !m.IsDir() || m.Perm() != 0o700 {
		t.Errorf("root/.ssh: mode %v, want a 0700 directory from tmpfiles.d", m)
	}
	// ... and recorded the units with deb-systemd-helper, enabling none.
	for _, u := range []string{"hearthd.service", "hearth-control.service"} {
		if _, err := os.Stat(at("var/lib/systemd/deb-systemd-helper-enabled/" + u + ".dsh-also")); err != nil {
			t.Errorf("deb-systemd-helper state for %s: %v", u, err)
		}
	}
	if _, err := os.Stat(at("etc/systemd/system/multi-user.target.wants/hearthd.service")); err == nil {
		t.Error("hearthd.service was enabled at installation")
	}

	// The services create their state at run time; purge must remove it.
	edit := []byte("\n# edited by the operator\nlisten = \"0.0.0.0:8443\"\n")
	f, err := os.OpenFile(at("etc/hearth/hearthd.toml"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(edit); err != nil {
		t.Fatal(err)
	}
	f.Close()
	edited, _ := os.ReadFile(at("etc/hearth/hearthd.toml"))
	for _, d := range []string{"var/lib/hearth/db", "var/lib/private/hearth-control/db"} {
		if err := os.MkdirAll(at(d), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(at(d+"/000001.log"), []byte("state"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("private/hearth-control", at("var/lib/hearth-control")); err != nil {
		t.Fatal(err)
	}

	// Upgrade: the operator's edit survives.
	dpkg(t, root, "-i", deb2)
	if got := dpkgQuery(t, root, "${Status} ${Version}"); got != "install ok installed "+v2 {
		t.Fatalf("after upgrade: %q", got)
	}
	if got, _ := os.ReadFile(at("etc/hearth/hearthd.toml")); !bytes.Equal(got, edited) {
		t.Fatalf("upgrade changed the edited hearthd.toml:\n%s", got)
	}
	if _, err := os.Stat(at("var/lib/hearth/db/000001.log")); err != nil {
		t.Fatalf("upgrade lost state: %v", err)
	}

	// Remove: programs go, configuration and state stay.
	dpkg(t, root, "-r", "hearth")
	if _, err := os.Stat(at("usr/bin/hearthd")); err == nil {
		t.Error("usr/bin/hearthd left after remove")
	}
	if got, _ := os.ReadFile(at("etc/hearth/hearthd.toml")); !bytes.Equal(got, edited) {
		t.Error("remove did not keep the edited configuration")
	}

	// Purge: nothing of ours is left. /root/.ssh is root's and stays.
	dpkg(t, root, "--purge", "hearth")
	if got := dpkgQuery(t, root, "${Status}"); strings.HasPrefix(got, "install ") || strings.HasSuffix(got, " config-files") {
		t.Errorf("after purge dpkg reports %q", got)
	}
	after := tree(t, root)
	want := append(append([]string(nil), before...), "root/.ssh")
	sort.Strings(want)
	if strings.Join(after, "\n") != strings.Join(want, "\n") {
		t.Fatalf("after purge the root holds:\n%s\nwant:\n%s", strings.Join(after, "\n"), strings.Join(want, "\n"))
	}
}
