// Package pgtest runs a private PostgreSQL for tests: a throwaway cluster
// (initdb into a temp directory) served by its own `postgres` process on a
// loopback port the kernel picked. It never touches the system's clusters.
// PostgreSQL and its initdb come from Debian's postgresql package, which
// `make test` installs; without them the test fails and says so.
//
// PostgreSQL refuses to run as root, so under root the cluster belongs to
// the unprivileged `postgres` user the package creates, and the server runs
// as that user. The cluster is tuned for tests (no fsync): a crash of the
// server (Kill) loses nothing, a crash of the machine would.
//
// initdb takes a second or two, so a package's tests share one cluster and
// isolate themselves with a fresh database each. The shared cluster lives in
// a variable of the test files and is closed from TestMain:
//
//	var pg pgtest.Shared // one cluster for this test binary
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		pg.Close()
//		os.Exit(code)
//	}
//
//	func TestStore(t *testing.T) {
//		url := pg.Get(t).NewDatabase(t) // postgres://…/t1_teststore
//		...
//	}
//
// A test that stops or kills the server (the database lost and back) starts
// a private one with Start instead, so no other test sees the outage.
package pgtest

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
)

// BinDirEnv names the environment variable that overrides where initdb and
// postgres are found.
const BinDirEnv = "HEARTH_PG_BINDIR"

// Superuser is the cluster's superuser role, the user of URL.
const Superuser = "postgres"

// Server is a private PostgreSQL cluster and, while it runs, its server.
type Server struct {
	Dir  string // temp directory holding the cluster, socket and password
	Port int    // the loopback port, kept across Stop/Kill and Restart

	bin      string              // directory of initdb and postgres
	password string              // the superuser's, random
	cred     *syscall.Credential // whom the server runs as; nil: as us
	dbs      atomic.Int64        // databases made by NewDatabase

	mu   sync.Mutex // guards the fields below
	cmd  *exec.Cmd
	done <-chan struct{} // closed when cmd has exited
	logs proctest.LogBuffer

	closeOnce sync.Once
}

// Start creates a private cluster, starts its server and removes it all
// when the test ends. It fails the test if anything goes wrong.
func Start(t testing.TB) *Server {
	t.Helper()
	testutil.Integration(t, "PostgreSQL")
	s, err := New()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("postgres output (tail):\n%s", s.LogTail(16<<10))
		}
		s.Close()
	})
	return s
}

// New creates a cluster in a temp directory and starts its server; Close
// stops it and removes the directory.
func New() (*Server, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir, bin: bin, cred: cred, password: rand.Text()}
	if err := s.initdb(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// A free port can be taken between probing and binding; try a few.
	for attempt := 0; ; attempt++ {
		var addr string
		if addr, err = testutil.FreeAddr(); err != nil {
			break
		}
		s.Port = int(netip.MustParseAddrPort(addr).Port())
		if err = s.Restart(); err == nil || attempt == 2 {
			break
		}
	}
	if err != nil {
		err = fmt.Errorf("%w\npostgres output (tail):\n%s", err, s.LogTail(16<<10))
		s.Close()
		return nil, err
	}
	return s, nil
}

// initdb creates the cluster in s.Dir/data, owned by the server's user,
// with a random superuser password.
func (s *Server) initdb() error {
	pwfile := filepath.Join(s.Dir, "password")
	if err := os.WriteFile(pwfile, []byte(s.password+"\n"), 0o600); err != nil {
		return err
	}
	if s.cred != nil {
		for _, p := range []string{s.Dir, pwfile} {
			if err := os.Chown(p, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
				return fmt.Errorf("hand %s to the postgres user: %w", p, err)
			}
		}
	}
	cmd := exec.Command(filepath.Join(s.bin, "initdb"),
		"--pgdata="+filepath.Join(s.Dir, "data"), "--username="+Superuser, "--pwfile="+pwfile,
		"--auth=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions")
	s.prepare(cmd)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("initdb: %w\n%s", err, out)
	}
	return os.Remove(pwfile)
}

// prepare sets what every process of the cluster shares: its user, a
// clean environment and the cluster directory as working directory.
func (s *Server) prepare(cmd *exec.Cmd) {
	cmd.Dir = s.Dir
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "LANG=C", "HOME=" + s.Dir}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
}

// Restart starts the server again on the same port and data after Stop or
// Kill (New uses it for the first start too), and waits until it accepts
// connections.
func (s *Server) Restart() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		select {
		case <-s.done:
		default:
			return errors.New("pgtest: server already running")
		}
	}
	cmd := exec.Command(filepath.Join(s.bin, "postgres"),
		"-D", filepath.Join(s.Dir, "data"),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(s.Port),
		"-c", "unix_socket_directories="+s.Dir,
		// A test database: durability against a machine crash is not
		// worth the fsyncs.
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	s.prepare(cmd)
	cmd.Stdout, cmd.Stderr = &s.logs, &s.logs
	// Its own process group, so Kill reaches the backends too; SIGTERM
	// (a smart shutdown) should the test binary die without Close.
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	done, err := proctest.Start(cmd)
	if err != nil {
		return err
	}
	s.cmd, s.done = cmd, done
	return s.waitReady(cmd.Process.Pid, done)
}

// waitReady waits until the postmaster pid has written "ready" into its
// lock file, as pg_ctl does: only then does it accept connections. A stale
// lock file of a killed predecessor names another pid.
func (s *Server) waitReady(pid int, done <-chan struct{}) error {
	pidfile := filepath.Join(s.Dir, "data", "postmaster.pid")
	return proctest.WaitReady(fmt.Sprintf("postgres on port %d", s.Port), done, time.Minute, func() error {
		data, err := os.ReadFile(pidfile)
		if err != nil {
			return err
		}
		lines := strings.Split(string(data), "\n")
		// Line 1: the pid; line 8: the status (pidfile.h).
		if len(lines) < 8 || lines[0] != strconv.Itoa(pid) || strings.TrimSpace(lines[7]) != "ready" {
			return errors.New("postmaster.pid does not say ready yet")
		}
		return nil
	})
}

// Stop shuts the server down the fast way (clients disconnected, data
// kept) and waits for it. Restart brings it back.
func (s *Server) Stop() error {
	return s.signal(syscall.SIGINT)
}

// Kill ends the server and every backend with SIGKILL, as a crash would,
// and waits until they are gone. Restart brings it back (with crash
// recovery).
func (s *Server) Kill() error {
	return s.signal(syscall.SIGKILL)
}

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("pgtest: server never started")
	}
	pgid := s.cmd.Process.Pid
	target := pgid
	if sig == syscall.SIGKILL {
		target = -pgid // the backends too
	}
	if err := syscall.Kill(target, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signal postgres: %w", err)
	}
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		return errors.New("pgtest: postgres did not stop within a minute")
	}
	// Orphaned backends exit on their own once the postmaster is gone; a
	// restart must not find them still attached to the old shared memory.
	deadline := time.Now().Add(time.Minute)
	for syscall.Kill(-pgid, 0) == nil {
		if time.Now().After(deadline) {
			return fmt.Errorf("pgtest: postgres processes of group %d still running", pgid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// Close stops the server (fast shutdown, SIGKILL if that hangs) and removes
// the cluster. It is safe to call more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		if err := s.Stop(); err != nil {
			_ = s.Kill()
		}
		_ = os.RemoveAll(s.Dir)
	})
}

// PID returns the postmaster's process id (0 before the first start).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the server process is up.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// URL returns a postgres:// connection URL of the superuser to the
// `postgres` database.
func (s *Server) URL() string { return s.DatabaseURL("postgres") }

// DatabaseURL returns the connection URL of database name.
func (s *Server) DatabaseURL(name string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.UserPassword(Superuser, s.password),
		Host:     s.Addr(),
		Path:     "/" + name,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}

// NewDatabase creates an empty database for this test alone and returns its
// URL. The database is dropped when the test ends, unless the server is
// down by then.
func (s *Server) NewDatabase(t testing.TB) string {
	t.Helper()
	name := s.databaseName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := s.exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		if !s.Running() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// FORCE: connections the test left open do not keep it.
		if err := s.exec(ctx, "DROP DATABASE "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.DatabaseURL(name)
}

// databaseName makes a unique name that still says which test it is for:
// t<n>_<test name, lower case, other characters as _>, at most 63 bytes.
func (s *Server) databaseName(test string) string {
	name := []byte(fmt.Sprintf("t%d_%s", s.dbs.Add(1), strings.ToLower(test)))
	for i, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			name[i] = '_'
		}
	}
	return string(name[:min(len(name), 63)])
}

// exec runs one statement as the superuser.
func (s *Server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// Logs returns what the server printed so far (bounded).
func (s *Server) Logs() string { return s.logs.String() }

// LogTail returns the last n bytes of the output.
func (s *Server) LogTail(n int) string { return s.logs.Tail(n) }

// Shared lazily starts one Server for a whole test binary; see the package
// documentation. The zero value is ready to use.
type Shared struct {
	once sync.Once
	srv  *Server
	err  error
}

// Get returns the shared server, starting it on first use. It fails t if
// the server could not start or is not running.
func (sh *Shared) Get(t testing.TB) *Server {
	t.Helper()
	testutil.Integration(t, "PostgreSQL")
	sh.once.Do(func() { sh.srv, sh.err = New() })
	if sh.err != nil {
		t.Fatalf("pgtest: %v", sh.err)
	}
	if !sh.srv.Running() {
		t.Fatalf("pgtest: the shared postgres has exited; output:\n%s", sh.srv.LogTail(16<<10))
	}
	return sh.srv
}

// Close stops the shared server if it was started.
func (sh *Shared) Close() {
	sh.once.Do(func() { sh.err = errors.New("shared server closed") })
	if sh.srv != nil {
		sh.srv.Close()
	}
}

// binDir finds initdb and postgres: $HEARTH_PG_BINDIR, the newest Debian
// installation (/usr/lib/postgresql/<major>/bin), then PATH.
func binDir() (string, error) {
	if d := os.Getenv(BinDirEnv); d != "" {
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int {
		return majorOf(b) - majorOf(a)
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("initdb not found (looked at $" + BinDirEnv + ", /usr/lib/postgresql/*/bin and PATH): " +
		"install Debian's postgresql package (make test does)")
}

// majorOf returns the major version in /usr/lib/postgresql/<major>/bin.
func majorOf(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// serverCredential returns whom the server must run as: nil (ourselves)
// unless we are root, which PostgreSQL refuses; then the postgres user.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("PostgreSQL will not run as root and there is no postgres user to run it as: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
}
