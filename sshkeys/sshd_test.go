package sshkeys

import (
	"bytes"
	"context"
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
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// lockedBuffer collects sshd's log; it is printed only if the test fails.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// addTestUser creates a throwaway system account with the given home and
// removes it when the test ends.
func addTestUser(t *testing.T, home string) *user.User {
	t.Helper()
	var rnd [3]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		t.Fatal(err)
	}
	name := "hearthkt" + hex.EncodeToString(rnd[:])
	// -p '*': no usable password but not locked ("!"), because with
	// UsePAM no sshd refuses every login to a locked account.
	out, err := exec.Command("useradd", "--system", "--no-create-home", "--no-user-group",
		"--gid", "nogroup", "--home-dir", home, "--shell", "/bin/sh", "--password", "*", name).CombinedOutput()
	if err != nil {
		t.Fatalf("useradd (apt-get install passwd): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestSSHDLogin checks the writer against the real sshd: a synced key can
// log in, an unsynced or removed one cannot, and a line a human added by hand
// keeps working through every Sync.
func TestSSHDLogin(t *testing.T) {
	requireRoot(t)
	sshd, err := exec.LookPath("/usr/sbin/sshd")
	if err != nil {
		t.Fatalf("sshd not found (apt-get install openssh-server): %v", err)
	}
	keygen, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Fatalf("ssh-keygen not found (apt-get install openssh-client): %v", err)
	}
	// sshd's privilege separation directory.
	if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
		t.Fatal(err)
	}

	// StrictModes stays on, as in production, so the test also proves sshd
	// accepts the modes and owners Sync produces. sshd checks the file and
	// every directory from it up to the user's home (inclusive), as the
	// user; so home lives in a root-owned 0755 directory, and the 0700
	// temp directories above it are opened up to 0755 for the user to
	// traverse. Nothing above home is g/o-writable-checked by sshd.
	base := t.TempDir()
	for _, d := range []string{base, filepath.Dir(base)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	home := filepath.Join(base, "home")
	u := addTestUser(t, home)
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, uid, gid); err != nil {
		t.Fatal(err)
	}

	// Keys: "human" is added by hand, "managed" through Sync, "never" is
	// never authorised.
	signer := func() (ssh.Signer, string) {
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
	humanSigner, humanLine := signer()
	managedSigner, managedLine := signer()
	otherSigner, otherLine := signer()
	neverSigner, _ := signer()

	// The human's own .ssh and authorized_keys, as a user would make them.
	sshDir := filepath.Join(home, ".ssh")
	akPath := filepath.Join(sshDir, "authorized_keys")
	if err := os.Mkdir(sshDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(akPath, []byte("# my own key\n"+humanLine+" me@home\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{sshDir, akPath} {
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}

	// Host key and config.
	hostKey := filepath.Join(base, "ssh_host_ed25519_key")
	if out, err := exec.Command(keygen, "-q", "-t", "ed25519", "-N", "", "-f", hostKey).CombinedOutput(); err != nil {
		t.Fatalf("ssh-keygen: %v: %s", err, out)
	}
	hostPubBytes, err := os.ReadFile(hostKey + ".pub")
	if err != nil {
		t.Fatal(err)
	}
	hostPub, _, _, _, err := ssh.ParseAuthorizedKey(hostPubBytes)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	conf := filepath.Join(base, "sshd_config")
	confText := fmt.Sprintf(`ListenAddress 127.0.0.1:%d
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
`, port, hostKey, filepath.Join(base, "sshd.pid"), akPath, u.Username)
	if err := os.WriteFile(conf, []byte(confText), 0o600); err != nil {
		t.Fatal(err)
	}

	logs := &lockedBuffer{}
	cmd := exec.Command(sshd, "-D", "-e", "-f", conf)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("sshd log:\n%s", logs.String())
		}
	})

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("sshd exited: %v\n%s", err, logs.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sshd not listening on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// login runs "id -u" as the test user with the given key.
	login := func(s ssh.Signer) error {
		client, err := ssh.Dial("tcp", addr, &ssh.ClientConfig{
			User:            u.Username,
			Auth:            []ssh.AuthMethod{ssh.PublicKeys(s)},
			HostKeyCallback: ssh.FixedHostKey(hostPub),
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
		if got := strings.TrimSpace(string(out)); got != u.Uid {
			return fmt.Errorf("logged in as uid %s, want %s", got, u.Uid)
		}
		return nil
	}
	expect := func(step string, s ssh.Signer, name string, ok bool) {
		t.Helper()
		err := login(s)
		switch {
		case ok && err != nil:
			t.Fatalf("%s: %s key cannot log in: %v", step, name, err)
		case !ok && err == nil:
			t.Fatalf("%s: %s key logged in but must not", step, name)
		case !ok && !strings.Contains(err.Error(), "unable to authenticate"):
			t.Fatalf("%s: %s key failed for the wrong reason: %v", step, name, err)
		}
	}

	f, err := New(Config{User: u.Username})
	if err != nil {
		t.Fatal(err)
	}
	if f.Path() != akPath {
		t.Fatalf("Path = %q, want %q", f.Path(), akPath)
	}
	ctx := context.Background()
	managed := Key{ID: "sk_managed", PublicKey: managedLine + " managed"}
	other := Key{ID: "sk_other", PublicKey: otherLine}

	expect("before sync", humanSigner, "hand-added", true)
	expect("before sync", managedSigner, "managed", false)

	if err := f.Sync(ctx, []Key{managed}); err != nil {
		t.Fatal(err)
	}
	expect("after adding", managedSigner, "managed", true)
	expect("after adding", humanSigner, "hand-added", true)
	expect("after adding", neverSigner, "unknown", false)

	if err := f.Sync(ctx, []Key{other}); err != nil {
		t.Fatal(err)
	}
	expect("after replacing", managedSigner, "managed", false)
	expect("after replacing", otherSigner, "other", true)
	expect("after replacing", humanSigner, "hand-added", true)

	if err := f.Sync(ctx, nil); err != nil {
		t.Fatal(err)
	}
	expect("after removing all", otherSigner, "other", false)
	expect("after removing all", humanSigner, "hand-added", true)

	got, err := os.ReadFile(akPath)
	if err != nil {
		t.Fatal(err)
	}
	if want := "# my own key\n" + humanLine + " me@home\n"; string(got) != want {
		t.Fatalf("hand-written file not restored exactly:\n%s", got)
	}
}
