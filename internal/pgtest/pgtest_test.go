package pgtest

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

var pg Shared // one cluster for this test binary

func TestMain(m *testing.M) {
	code := m.Run()
	pg.Close()
	os.Exit(code)
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func queryString(t *testing.T, c *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	var s string
	if err := c.QueryRow(context.Background(), sql, args...).Scan(&s); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return s
}

func TestDatabasesAreIsolated(t *testing.T) {
	srv := pg.Get(t)
	a, b := srv.NewDatabase(t), srv.NewDatabase(t)
	if a == b {
		t.Fatalf("two NewDatabase calls gave the same URL %s", a)
	}
	ca, cb := connect(t, a), connect(t, b)
	if v := queryString(t, ca, "SHOW server_version"); !strings.HasPrefix(v, "1") {
		t.Fatalf("server_version %q", v)
	}
	if _, err := ca.Exec(context.Background(), "CREATE TABLE t (v text); INSERT INTO t VALUES ('a')"); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, ca, "SELECT v FROM t"); got != "a" {
		t.Fatalf("read back %q", got)
	}
	var pgErr *pgconn.PgError
	if _, err := cb.Exec(context.Background(), "SELECT * FROM t"); !errors.As(err, &pgErr) || pgErr.Code != "42P01" {
		t.Fatalf("the other database sees table t: %v", err)
	}
	u, _ := url.Parse(a)
	if db := queryString(t, ca, "SELECT current_database()"); "/"+db != u.Path || !strings.Contains(db, "testdatabasesareisolated") {
		t.Fatalf("connected to %q via %s", db, a)
	}
}

func TestDatabaseDroppedAfterTest(t *testing.T) {
	srv := pg.Get(t)
	var name string
	t.Run("user", func(t *testing.T) {
		u, _ := url.Parse(srv.NewDatabase(t))
		name = strings.TrimPrefix(u.Path, "/")
		// A connection the test forgets to close does not keep it.
		c, err := pgx.Connect(context.Background(), u.String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c
	})
	var n int
	c := connect(t, srv.URL())
	if err := c.QueryRow(context.Background(), "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Fatalf("database %q still there after its test (%d, %v)", name, n, err)
	}
}

func TestPasswordRequired(t *testing.T) {
	srv := pg.Get(t)
	u, _ := url.Parse(srv.URL())
	u.User = url.User(Superuser)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgx.Connect(ctx, u.String())
	if err == nil {
		c.Close(ctx)
		t.Fatal("connected without the password")
	}
	u.User = url.UserPassword(Superuser, "wrong")
	if c, err := pgx.Connect(ctx, u.String()); err == nil {
		c.Close(ctx)
		t.Fatal("connected with a wrong password")
	}
}

func TestServerIsNotRoot(t *testing.T) {
	srv := pg.Get(t)
	status, err := os.ReadFile("/proc/" + strconv.Itoa(srv.PID()) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if f, ok := strings.CutPrefix(line, "Uid:"); ok {
			uids := strings.Fields(f)
			if uids[0] == "0" || uids[1] == "0" {
				t.Fatalf("postgres runs as root: Uid %v", uids)
			}
			if os.Geteuid() != 0 && uids[0] != strconv.Itoa(os.Geteuid()) {
				t.Fatalf("postgres runs as uid %s, not as us (%d)", uids[0], os.Geteuid())
			}
			return
		}
	}
	t.Fatal("no Uid line")
}

// TestLostAndBack is what a fault test does: the database goes away (a
// clean stop, then a crash) and comes back on the same address with its
// data.
func TestLostAndBack(t *testing.T) {
	srv := Start(t)
	dsn := srv.NewDatabase(t)
	c := connect(t, dsn)
	ctx := context.Background()
	if _, err := c.Exec(ctx, "CREATE TABLE t (v int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	port := srv.Port
	for _, fault := range []struct {
		name string
		do   func() error
	}{{"stop", srv.Stop}, {"kill", srv.Kill}} {
		pid := srv.PID()
		if err := fault.do(); err != nil {
			t.Fatalf("%s: %v", fault.name, err)
		}
		if srv.Running() || syscall.Kill(-pid, 0) == nil {
			t.Fatalf("%s: postgres processes still running", fault.name)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err == nil {
			t.Fatalf("%s: query on the old connection succeeded", fault.name)
		}
		if _, err := pgx.Connect(ctx, dsn); err == nil {
			t.Fatalf("%s: connected while the server is down", fault.name)
		}
		if err := srv.Restart(); err != nil {
			t.Fatalf("restart after %s: %v", fault.name, err)
		}
		if srv.Port != port || srv.PID() == pid {
			t.Fatalf("after %s: port %d (was %d), pid %d (was %d)", fault.name, srv.Port, port, srv.PID(), pid)
		}
		c = connect(t, dsn)
		var n int
		if err := c.QueryRow(ctx, "SELECT sum(v) FROM t").Scan(&n); err != nil || n != 1 {
			t.Fatalf("after %s: sum %d, %v", fault.name, n, err)
		}
	}
	if err := srv.Restart(); err == nil {
		t.Fatal("Restart of a running server succeeded")
	}
}

func TestCloseRemovesEverything(t *testing.T) {
	srv, err := New()
	if err != nil {
		t.Fatal(err)
	}
	pid, dir := srv.PID(), srv.Dir
	srv.Close()
	srv.Close() // idempotent
	if syscall.Kill(-pid, 0) == nil {
		t.Errorf("postgres process group %d still running after Close", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s not removed: %v", dir, err)
	}
}
