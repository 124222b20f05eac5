package sshkeys

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/hearthd/hearth/internal/testutil"
)

type fixture struct {
	dir  string // the .ssh directory
	path string // authorized_keys
	f    *File
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	dir := filepath.Join(t.TempDir(), ".ssh")
	path := filepath.Join(dir, "authorized_keys")
	f, err := New(Config{Path: path})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: dir, path: path, f: f}
}

func (x *fixture) write(t *testing.T, content string) {
	t.Helper()
	if err := os.MkdirAll(x.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(x.path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (x *fixture) read(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(x.path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func (x *fixture) sync(t *testing.T, keys ...Key) {
	t.Helper()
	if err := x.f.Sync(context.Background(), keys); err != nil {
		t.Fatalf("Sync: %v", err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// testKey returns a fresh key with the given id and comment.
func testKey(t *testing.T, id string) (Key, PublicKey) {
	t.Helper()
	pk, err := Parse(newEd25519Line(t) + " " + id + "@test")
	if err != nil {
		t.Fatal(err)
	}
	return Key{ID: id, PublicKey: pk.Line, Fingerprint: pk.Fingerprint}, pk
}

func block(k Key) string {
	return "# hearth-managed: " + k.ID + " " + k.Fingerprint + "\n" + k.PublicKey + "\n"
}

func TestSyncKeepsForeignLines(t *testing.T) {
	x := newFixture(t)
	human := newEd25519Line(t) + " human@desk"
	foreign := "# keys added by hand\n" +
		human + "\n" +
		"\n" +
		`from="10.0.0.1",no-pty ` + newEd25519Line(t) + " restricted\n" +
		"not a key at all\r\n"
	x.write(t, foreign)

	a, _ := testKey(t, "sk_a")
	b, _ := testKey(t, "sk_b")
	x.sync(t, a, b)
	if got, want := x.read(t), foreign+block(a)+block(b); got != want {
		t.Fatalf("after adding a,b:\n%s\nwant:\n%s", got, want)
	}

	x.sync(t, b)
	if got, want := x.read(t), foreign+block(b); got != want {
		t.Fatalf("after removing a:\n%s\nwant:\n%s", got, want)
	}

	x.sync(t)
	if got := x.read(t); got != foreign {
		t.Fatalf("after removing all:\n%q\nwant:\n%q", got, foreign)
	}
}

func TestSyncKeepsManagedKeysInPlace(t *testing.T) {
	x := newFixture(t)
	a, _ := testKey(t, "sk_a")
	b, _ := testKey(t, "sk_b")
	c, _ := testKey(t, "sk_c")
	x.write(t, "# top\n")
	x.sync(t, a, b)
	// A human appends below the managed keys; they stay where they are and
	// a new key goes to the end.
	content := x.read(t) + "# bottom\n"
	x.write(t, content)
	x.sync(t, a, b, c)
	if got, want := x.read(t), "# top\n"+block(a)+block(b)+"# bottom\n"+block(c); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestSyncLastLineWithoutNewline(t *testing.T) {
	x := newFixture(t)
	x.write(t, "# no newline")
	x.sync(t)
	if got := x.read(t); got != "# no newline" {
		t.Fatalf("untouched file changed to %q", got)
	}
	a, _ := testKey(t, "sk_a")
	x.sync(t, a)
	if got, want := x.read(t), "# no newline\n"+block(a); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestSyncHumanEditsAroundMarkers(t *testing.T) {
	a, _ := testKey(t, "sk_a")
	b, _ := testKey(t, "sk_b")
	aKeyLine := a.PublicKey + "\n"
	aMarker := strings.TrimSuffix(block(a), aKeyLine)
	human := newEd25519Line(t) + " human\n"

	tests := []struct {
		name   string
		before string // file content, built around a's block
		keys   []Key
		want   string
	}{
		{
			name:   "line inserted between marker and key is kept, key not duplicated",
			before: aMarker + human + aKeyLine,
			keys:   []Key{a},
			want:   aMarker + aKeyLine + human,
		},
		{
			name:   "line inserted between marker and key survives removal",
			before: aMarker + human + aKeyLine,
			keys:   nil,
			want:   human,
		},
		{
			name:   "key line deleted by hand is restored at its marker",
			before: "# x\n" + aMarker + "# y\n",
			keys:   []Key{a},
			want:   "# x\n" + block(a) + "# y\n",
		},
		{
			name:   "orphaned marker of an unwanted key is dropped",
			before: "# x\n" + aMarker + human,
			keys:   nil,
			want:   "# x\n" + human,
		},
		{
			name:   "options added by hand to a managed line do not survive revocation",
			before: aMarker + `from="192.0.2.1" ` + aKeyLine + human,
			keys:   []Key{b},
			want:   human + block(b),
		},
		{
			name:   "options added by hand are reset to the canonical line",
			before: aMarker + `command="/bin/false" ` + aKeyLine,
			keys:   []Key{a},
			want:   block(a),
		},
		{
			name:   "duplicated block collapses to one",
			before: block(a) + human + block(a),
			keys:   []Key{a},
			want:   block(a) + human,
		},
		{
			name:   "block moved to the top stays there",
			before: block(a) + human,
			keys:   []Key{a, b},
			want:   block(a) + human + block(b),
		},
		{
			name:   "mangled marker is dropped, the line after it is kept",
			before: "# hearth-managed:\n" + human,
			keys:   nil,
			want:   human,
		},
		{
			name:   "a marker never claims a foreign key with another fingerprint",
			before: aMarker + human,
			keys:   []Key{a},
			want:   block(a) + human,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			x := newFixture(t)
			x.write(t, tc.before)
			x.sync(t, tc.keys...)
			if got := x.read(t); got != tc.want {
				t.Fatalf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestSyncAtomicReplaceAndNoChurn(t *testing.T) {
	var results []SyncResult
	x := newFixture(t)
	var err error
	x.f, err = New(Config{Path: x.path, OnSync: func(r SyncResult) { results = append(results, r) }})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := testKey(t, "sk_a")
	b, _ := testKey(t, "sk_b")

	x.sync(t, a)
	ino1 := inode(t, x.path)
	x.sync(t, a)
	if ino := inode(t, x.path); ino != ino1 {
		t.Fatal("an unchanged Sync rewrote the file")
	}
	x.sync(t, a, b)
	if ino := inode(t, x.path); ino == ino1 {
		t.Fatal("file changed in place; want a new inode from rename")
	}
	entries, err := os.ReadDir(x.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "authorized_keys" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf(".ssh holds %v, want only authorized_keys", names)
	}
	if got, want := x.f.Stats(), (Stats{Syncs: 3, Writes: 2}); got != want {
		t.Fatalf("Stats = %+v, want %+v", got, want)
	}
	wantWritten := []bool{true, false, true}
	if len(results) != 3 {
		t.Fatalf("OnSync called %d times, want 3", len(results))
	}
	for i, r := range results {
		if r.Written != wantWritten[i] || r.Err != nil {
			t.Errorf("result %d = %+v, want Written=%v", i, r, wantWritten[i])
		}
	}
}

func TestSyncNothingToDoCreatesNothing(t *testing.T) {
	x := newFixture(t)
	x.sync(t)
	if _, err := os.Lstat(x.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf(".ssh exists after an empty Sync (err=%v)", err)
	}
}

func TestSyncModes(t *testing.T) {
	x := newFixture(t)
	a, _ := testKey(t, "sk_a")
	// A permissive umask must not leak into the modes.
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	x.sync(t, a)
	fi, err := os.Lstat(x.dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 {
		t.Fatalf(".ssh mode %v, want drwx------", fi.Mode())
	}
	fi, err = os.Lstat(x.path)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("authorized_keys mode %v, want -rw-------", fi.Mode())
	}

	// A loosened mode is repaired even though the content is unchanged.
	if err := os.Chmod(x.path, 0o644); err != nil {
		t.Fatal(err)
	}
	x.sync(t, a)
	fi, _ = os.Lstat(x.path)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode after repair %v, want 0600", fi.Mode())
	}
}

func TestSyncInvalidKeysLeaveFileUntouched(t *testing.T) {
	a, _ := testKey(t, "sk_a")
	b, bpk := testKey(t, "sk_b")
	bad := []struct {
		name string
		key  Key
	}{
		{"options", Key{ID: "sk_x", PublicKey: `command="sh" ` + bpk.Line}},
		{"newline", Key{ID: "sk_x", PublicKey: bpk.Line + "\n" + a.PublicKey}},
		{"trailing newline", Key{ID: "sk_x", PublicKey: bpk.Line + "\n"}},
		{"private key", Key{ID: "sk_x", PublicKey: "-----BEGIN OPENSSH PRIVATE KEY-----"}},
		{"garbage", Key{ID: "sk_x", PublicKey: "hello"}},
		{"fingerprint mismatch", Key{ID: "sk_x", PublicKey: bpk.Line, Fingerprint: a.Fingerprint}},
		{"duplicate id", Key{ID: "sk_a", PublicKey: bpk.Line}},
		{"id with space", Key{ID: "sk x", PublicKey: bpk.Line}},
		{"id with newline", Key{ID: "sk\nx", PublicKey: bpk.Line}},
		{"empty id", Key{ID: "", PublicKey: bpk.Line}},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			x := newFixture(t)
			x.write(t, "# mine\n")
			x.sync(t, a)
			before := x.read(t)
			ino := inode(t, x.path)
			err := x.f.Sync(context.Background(), []Key{a, b, tc.key})
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("Sync error = %v, want ErrInvalidKey", err)
			}
			if got := x.read(t); got != before {
				t.Fatalf("file changed:\n%s", got)
			}
			if inode(t, x.path) != ino {
				t.Fatal("file was replaced")
			}
			if s := x.f.Stats(); s.Failures != 1 {
				t.Fatalf("Stats = %+v, want one failure", s)
			}
		})
	}
}

func TestSyncRefusesSymlinkedDir(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "elsewhere")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "authorized_keys"), []byte("# target\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(base, ".ssh")); err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{Path: filepath.Join(base, ".ssh", "authorized_keys")})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := testKey(t, "sk_a")
	if err := f.Sync(context.Background(), []Key{a}); !errors.Is(err, ErrSymlink) {
		t.Fatalf("Sync error = %v, want ErrSymlink", err)
	}
	entries, _ := os.ReadDir(target)
	if len(entries) != 1 {
		t.Fatalf("target dir now has %d entries", len(entries))
	}
	if b, _ := os.ReadFile(filepath.Join(target, "authorized_keys")); string(b) != "# target\n" {
		t.Fatalf("target file changed: %q", b)
	}
}

func TestSyncRefusesSymlinkedFile(t *testing.T) {
	x := newFixture(t)
	if err := os.Mkdir(x.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(t.TempDir(), "shadow")
	if err := os.WriteFile(target, []byte("root:secret\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, x.path); err != nil {
		t.Fatal(err)
	}
	a, _ := testKey(t, "sk_a")
	for _, keys := range [][]Key{{a}, nil} {
		if err := x.f.Sync(context.Background(), keys); !errors.Is(err, ErrSymlink) {
			t.Fatalf("Sync(%d keys) error = %v, want ErrSymlink", len(keys), err)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "root:secret\n" {
		t.Fatalf("target changed: %q", b)
	}
	if fi, err := os.Lstat(x.path); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("symlink replaced (err=%v)", err)
	}
	if fi, _ := os.Stat(target); fi.Mode().Perm() != 0o640 {
		t.Fatalf("target mode changed to %v", fi.Mode())
	}
}

func TestSyncRefusesHardLink(t *testing.T) {
	x := newFixture(t)
	if err := os.Mkdir(x.dir, 0o700); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(x.dir, "..", "secret")
	if err := os.WriteFile(other, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(other, x.path); err != nil {
		t.Fatal(err)
	}
	a, _ := testKey(t, "sk_a")
	if err := x.f.Sync(context.Background(), []Key{a}); err == nil || !strings.Contains(err.Error(), "hard links") {
		t.Fatalf("Sync error = %v, want a hard link refusal", err)
	}
	if b, _ := os.ReadFile(other); string(b) != "secret\n" {
		t.Fatalf("linked file changed: %q", b)
	}
}

func TestSyncRefusesNonDirectory(t *testing.T) {
	x := newFixture(t)
	if err := os.WriteFile(x.dir, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, _ := testKey(t, "sk_a")
	if err := x.f.Sync(context.Background(), []Key{a}); err == nil || errors.Is(err, ErrSymlink) {
		t.Fatalf("Sync error = %v, want a not-a-directory error", err)
	}
}

func TestSyncOwnedByUser(t *testing.T) {
	testutil.RequireRoot(t, "HEARTH_SKIP_ROOT_TESTS")
	u, err := user.Lookup("nobody")
	if err != nil {
		t.Fatalf("need the nobody user: %v", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if uid == 0 {
		t.Fatal("nobody is root?")
	}

	dir := filepath.Join(t.TempDir(), ".ssh")
	path := filepath.Join(dir, "authorized_keys")
	f, err := New(Config{User: "nobody", Path: path})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := testKey(t, "sk_a")
	if err := f.Sync(context.Background(), []Key{a}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, path} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != uid || int(st.Gid) != gid {
			t.Fatalf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
		}
	}

	// A file with the right content but the wrong owner is repaired.
	if err := os.Chown(path, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(context.Background(), []Key{a}); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Lstat(path)
	if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid {
		t.Fatalf("owner not repaired: %d", st.Uid)
	}
	if s := f.Stats(); s.Writes != 2 {
		t.Fatalf("Stats = %+v, want 2 writes", s)
	}
}

func TestNewResolvesHome(t *testing.T) {
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	f, err := New(Config{User: u.Username})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(u.HomeDir, ".ssh", "authorized_keys"); f.Path() != want {
		t.Fatalf("Path = %q, want %q", f.Path(), want)
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("New with neither User nor Path succeeded")
	}
	if _, err := New(Config{Path: "relative/authorized_keys"}); err == nil {
		t.Fatal("relative path accepted")
	}
	if _, err := New(Config{User: "no-such-user-hearth"}); err == nil {
		t.Fatal("unknown user accepted")
	}
}

func TestSyncConcurrent(t *testing.T) {
	x := newFixture(t)
	x.write(t, "# mine\n")
	keys := make([]Key, 4)
	for i := range keys {
		keys[i], _ = testKey(t, fmt.Sprintf("sk_%d", i))
	}
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				if err := x.f.Sync(context.Background(), keys[:1+(g+i)%len(keys)]); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	x.sync(t, keys[1], keys[3])
	if got, want := x.read(t), "# mine\n"+block(keys[1])+block(keys[3]); got != want {
		t.Fatalf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestSyncCancelledContext(t *testing.T) {
	x := newFixture(t)
	a, _ := testKey(t, "sk_a")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := x.f.Sync(ctx, []Key{a}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Sync error = %v, want context.Canceled", err)
	}
	if _, err := os.Lstat(x.dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("cancelled Sync touched the file system")
	}
}

func TestFake(t *testing.T) {
	f := NewFake()
	if _, ok := f.Keys(); ok {
		t.Fatal("fresh Fake reports a sync")
	}
	a, _ := testKey(t, "sk_a")
	var seen int
	f.OnSync(func(keys []Key, err error) { seen++ })
	if err := f.Sync(context.Background(), []Key{a}); err != nil {
		t.Fatal(err)
	}
	if got, ok := f.Keys(); !ok || len(got) != 1 || got[0] != a {
		t.Fatalf("Keys = %v, %v", got, ok)
	}
	boom := errors.New("boom")
	f.SetErr(boom)
	if err := f.Sync(context.Background(), nil); !errors.Is(err, boom) {
		t.Fatalf("Sync error = %v, want boom", err)
	}
	f.SetErr(nil)
	if err := f.Sync(context.Background(), []Key{{ID: "sk_b", PublicKey: "ssh-dss AAAA"}}); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("Sync error = %v, want ErrInvalidKey", err)
	}
	if got, _ := f.Keys(); len(got) != 1 || got[0] != a {
		t.Fatalf("failed syncs changed the recorded set: %v", got)
	}
	if calls, failures := f.Syncs(); calls != 3 || failures != 2 || seen != 3 {
		t.Fatalf("calls=%d failures=%d callbacks=%d, want 3 2 3", calls, failures, seen)
	}
}
