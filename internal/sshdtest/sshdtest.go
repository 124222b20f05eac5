// Package sshdtest runs a private OpenSSH server for tests that check what a
// real sshd accepts: a throwaway system user, an sshd on a loopback port with
// its own config and host key, in-process client keys, and logins as that
// user. It needs root, openssh-server, openssh-client and passwd.
package sshdtest

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
)

// AddUser creates a throwaway system account with the given home (not
// created) and removes it when the test ends.
func AddUser(t testing.TB, home string) *user.User {
	t.Helper()
	testutil.Integration(t, "sshd")
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	name := "hearthsshd" + hex.EncodeToString(rnd[:])
	// --password '*': no usable password but not locked ("!"): sshd
	// refuses every login to a locked account.
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--no-user-group",
		"--gid", "nogroup", "--home-dir", home, "--shell", "/bin/sh", "--password", "*", name).CombinedOutput()
	if err != nil {
		t.Fatalf("useradd (apt-get install passwd): %v: %s", err, out)
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The session processes sshd started for the user end a moment
		// after their connection does, and userdel refuses a user who
		// still runs any.
		uid := u.Uid
		testutil.WaitFor(t, 10*time.Second, "the processes of "+name+" to end", func() bool {
			return len(processesOf(uid)) == 0
		})
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	return u
}

// processesOf returns the pids of the processes whose real uid is uid.
func processesOf(uid string) []int {
	var pids []int
	dirs, _ := filepath.Glob("/proc/[0-9]*/status")
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] == uid {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// Home is a throwaway user with a home directory sshd's StrictModes
// accepts.
type Home struct {
	User *user.User
	Dir  string // the home: mode 0755, owned by the user
	// Base is the root-owned 0755 directory holding Dir; Start can keep
	// sshd's own files there.
	Base string
}

// NewHome creates a throwaway user (see AddUser) and its home. StrictModes
// checks the authorized_keys file and every directory from it up to the
// home, as the user, so the home lives in a root-owned 0755 directory and
// the 0700 temp directories above that are opened up for the user to
// traverse; nothing above the home is checked for group or other write.
func NewHome(t testing.TB) *Home {
	t.Helper()
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h := &Home{Dir: filepath.Join(base, "home"), Base: base}
	h.User = AddUser(t, h.Dir)
	if err := os.Mkdir(h.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.chown(t, h.Dir)
	return h
}

// WriteFile writes data to name (relative to the home) as the user would:
// the file mode 0600 and missing directories 0700, all owned by the user.
// It returns the file's path.
func (h *Home) WriteFile(t testing.TB, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(h.Dir, name)
	var missing []string
	for d := filepath.Dir(path); d != h.Dir; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o700); err != nil {
			t.Fatal(err)
		}
		h.chown(t, missing[i])
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	h.chown(t, path)
	return path
}

func (h *Home) chown(t testing.TB, path string) {
	t.Helper()
	uid, _ := strconv.Atoi(h.User.Uid)
	gid, _ := strconv.Atoi(h.User.Gid)
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
}

// NewSigner returns a fresh ed25519 key and its authorized_keys line
// (without a comment), made in-process: ssh-keygen per key would dominate
// tests that need hundreds.
func NewSigner(t testing.TB) (ssh.Signer, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return s, strings.TrimSpace(string(ssh.MarshalAuthorizedKey(s.PublicKey())))
}

// Server is a running private sshd.
type Server struct {
	Addr    string        // host:port it listens on
	HostKey ssh.PublicKey // its host key, the only one a login accepts
	User    *user.User    // the only user who may log in
}

// Start runs sshd with its own config and host key, written to dir, on a
// free loopback port: only u may log in, only with a key from akPath, with
// StrictModes on as in production. It returns once sshd listens; sshd is
// killed when the test ends, and its log printed if the test failed.
func Start(t testing.TB, dir string, u *user.User, akPath string) *Server {
	t.Helper()
	testutil.Integration(t, "sshd")
	sshd, err := exec.LookPath("/usr/sbin/sshd")
	if err != nil {
		t.Fatalf("sshd not found (apt-get install openssh-server): %v", err)
	}
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Fatalf("ssh-keygen not found (apt-get install openssh-client): %v", err)
	}
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil { // privilege separation directory
		t.Fatal(err)
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if out, err := exec.Command(keygen, "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	b, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	hostPub, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	conf := filepath.Join(dir, "sshd_config")
	text := fmt.Sprintf(`ListenAddress 127.0.0.1:%d
HostKey %s
PidFile %s
AuthorizedKeysFile %s
StrictModes yes
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers %s
MaxAuthTries 3
LogLevel VERBOSE
`, port, hostKey, filepath.Join(dir, "sshd.pid"), akPath, u.Username)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), HostKey: hostPub, User: u}

	// The log goes straight to a file: sshd's session children inherit
	// it, and no copy of the output then holds up Wait.
	logPath := filepath.Join(dir, "sshd.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close() // sshd has its own copy
	logs := func() string {
		b, _ := os.ReadFile(logPath)
		return string(b)
	}
	cmd := exec.Command(sshd, "-D", "-e", "-f", conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Killed should the test binary die without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	exited, err := proctest.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("sshd log:\n%s", logs())
		}
	})
	err = proctest.WaitReady("sshd on "+s.Addr, exited, 15*time.Second, func() error {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, logs())
	}
	return s
}

// Login logs in as the server's user with key and runs `id -u`, which must
// print the user's uid.
func (s *Server) Login(key ssh.Signer) error {
	client, err := ssh.Dial("tcp", s.Addr, &ssh.ClientConfig{
		User:            s.User.Username,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.FixedHostKey(s.HostKey),
		Timeout:         10 * time.Second,
	})
	if err != nil {
		return err
	}
	defer client.Close()
	sess, err := client.NewSession()
	if err != nil {
		return fmt.Errorf("session: %w", err)
	}
	defer sess.Close()
	out, err := sess.Output("id -u")
	if err != nil {
		return fmt.Errorf("id -u: %w", err)
	}
	if got := strings.TrimSpace(string(out)); got != s.User.Uid {
		return fmt.Errorf("logged in as uid %s, want %s", got, s.User.Uid)
	}
	return nil
}

// ExpectLogin fails the test unless logging in with key succeeds (ok) or is
// refused for want of an authorised key (!ok). step and name say when and
// which key, for the failure message.
func (s *Server) ExpectLogin(t testing.TB, step, name string, key ssh.Signer, ok bool) {
	t.Helper()
	err := s.Login(key)
	switch {
	case ok && err != nil:
		t.Fatalf("%s: %s key cannot log in: %v", step, name, err)
	case !ok && err == nil:
		t.Fatalf("%s: %s key logged in but must not", step, name)
	case !ok && !strings.Contains(err.Error(), "unable to authenticate"):
		t.Fatalf("%s: %s key failed for the wrong reason: %v", step, name, err)
	}
}
