package sshkeys

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/crypto/ssh"
	"golang.org/x/sys/unix"
)

// The authorized_keys layout.
//
// Every managed key is written as two lines, a marker and the key:
//
//	# hearth-managed: sk_123 SHA256:abc...
//	ssh-ed25519 AAAA... laptop
//
// Everything else in the file belongs to whoever put it there and is kept
// byte for byte, in place. On each Sync:
//   - a marker claims the first later line that is not itself a marker and
//     whose key has the marker's fingerprint (normally the very next line;
//     lines a human inserted in between are skipped and kept, and a claimed
//     line keeps being recognised if a human added options to it, so revoking
//     the key still removes it);
//   - a marker whose key is still wanted is rewritten in place with the
//     canonical key line; one whose key is no longer wanted is removed along
//     with its claimed line; a marker that claims nothing is dropped;
//   - wanted keys with no marker yet are appended at the end, in the order
//     given.
//
// A per-key marker (rather than a begin/end block) was chosen so that a human
// adding lines anywhere in the file can never have them swallowed by a block
// and deleted on the next Sync.
const markerPrefix = "# hearth-managed:"

// maxFileSize bounds how much of an existing authorized_keys is read.
const maxFileSize = 1 << 20

// ErrSymlink is returned when the .ssh directory or authorized_keys file is a
// symbolic link. They are refused, never followed: the directory is under the
// user's control and a link could point a root-privileged write anywhere.
var ErrSymlink = errors.New("refusing to follow symlink")

// Config configures a File.
type Config struct {
	// User is the account whose ~/.ssh/authorized_keys is managed. Its home
	// directory, uid and gid come from the user database; the file and a
	// created .ssh directory are owned by it.
	User string
	// Path overrides the file location (tests, development). With Path and
	// no User, files are left owned by the running process.
	Path string
	// Logger receives one line per change; nil means slog.Default().
	Logger *slog.Logger
	// OnSync, if set, is called after every Sync with its outcome, so the
	// caller can count syncs and failures in its own metrics.
	OnSync func(SyncResult)
}

// SyncResult describes one Sync call.
type SyncResult struct {
	Keys    int   // managed keys desired
	Written bool  // the file was replaced
	Err     error // nil on success
}

// Stats are running totals for a File.
type Stats struct {
	Syncs    uint64 // Sync calls
	Writes   uint64 // times the file was replaced
	Failures uint64 // Sync calls that returned an error
}

// File keeps the managed keys of one authorized_keys file. It is safe for
// concurrent use; concurrent Syncs are serialised. It assumes it is the only
// writer of managed entries (one hearthd per machine).
//
// What is guaranteed against a user who controls their own home directory:
// the parent of .ssh (normally the home directory, from the user database)
// is trusted and opened by path; .ssh is then opened relative to it with
// O_NOFOLLOW, and every later step (read, temporary file, rename, fsync)
// works relative to that open directory. So swapping .ssh or authorized_keys
// for a symlink at any moment cannot redirect a read or write outside that
// directory: a link present when looked at is refused, and one that appears
// later is replaced by the rename, not followed. An authorized_keys with more
// than one hard link is refused, so a link to another file is never read
// back into the user's file.
type File struct {
	path   string // full path, for messages
	parent string // directory containing the .ssh directory
	dir    string // base name of the .ssh directory
	name   string // base name of the file
	uid    int    // -1: do not chown
	gid    int
	log    *slog.Logger
	onSync func(SyncResult)

	mu                      sync.Mutex
	syncs, writes, failures atomic.Uint64
}

var _ Keys = (*File)(nil)

// New returns a File for cfg. It does not touch the file system beyond
// looking up the user.
func New(cfg Config) (*File, error) {
	f := &File{uid: -1, gid: -1, log: cfg.Logger, onSync: cfg.OnSync}
	if f.log == nil {
		f.log = slog.Default()
	}
	path := cfg.Path
	if cfg.User != "" {
		u, err := user.Lookup(cfg.User)
		if err != nil {
			return nil, fmt.Errorf("sshkeys: look up user %q: %w", cfg.User, err)
		}
		uid, err := strconv.Atoi(u.Uid)
		if err != nil {
			return nil, fmt.Errorf("sshkeys: user %q: uid %q: %w", cfg.User, u.Uid, err)
		}
		gid, err := strconv.Atoi(u.Gid)
		if err != nil {
			return nil, fmt.Errorf("sshkeys: user %q: gid %q: %w", cfg.User, u.Gid, err)
		}
		f.uid, f.gid = uid, gid
		if path == "" {
			if !filepath.IsAbs(u.HomeDir) {
				return nil, fmt.Errorf("sshkeys: user %q has no absolute home directory (%q)", cfg.User, u.HomeDir)
			}
			path = filepath.Join(u.HomeDir, ".ssh", "authorized_keys")
		}
	}
	if path == "" {
		return nil, errors.New("sshkeys: Config needs User or Path")
	}
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("sshkeys: path %q is not absolute", path)
	}
	path = filepath.Clean(path)
	dir := filepath.Dir(path)
	f.path = path
	f.name = filepath.Base(path)
	f.dir = filepath.Base(dir)
	f.parent = filepath.Dir(dir)
	if dir == "/" || f.parent == dir {
		return nil, fmt.Errorf("sshkeys: path %q needs a directory of its own", path)
	}
	return f, nil
}

// Path is the managed file.
func (f *File) Path() string { return f.path }

// Stats returns running totals.
func (f *File) Stats() Stats {
	return Stats{Syncs: f.syncs.Load(), Writes: f.writes.Load(), Failures: f.failures.Load()}
}

// Sync makes keys the exact set of managed keys in the file. All keys are
// validated with Parse first; one invalid key fails the call (wrapping
// ErrInvalidKey) and leaves the file untouched. When the resulting content,
// mode and owner are already right the file is not rewritten.
func (f *File) Sync(ctx context.Context, keys []Key) error {
	written, err := f.sync(ctx, keys)
	f.syncs.Add(1)
	if written {
		f.writes.Add(1)
	}
	if err != nil {
		f.failures.Add(1) // logged by the caller, which gets the error
	}
	if f.onSync != nil {
		f.onSync(SyncResult{Keys: len(keys), Written: written, Err: err})
	}
	return err
}

func (f *File) sync(ctx context.Context, keys []Key) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	pks, err := validate(keys)
	if err != nil {
		return false, err
	}
	want := make([]managedKey, len(keys))
	for i := range keys {
		want[i] = managedKey{id: keys[i].ID, pk: pks[i]}
	}

	f.mu.Lock()
	defer f.mu.Unlock()

	parentFD, err := unix.Open(f.parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("sshkeys: open %s: %w", f.parent, err)
	}
	defer unix.Close(parentFD)
	dirPath := filepath.Join(f.parent, f.dir)

	dirFD, err := openDirNoFollow(parentFD, f.dir, dirPath)
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return false, err
	}
	if dirFD >= 0 {
		defer unix.Close(dirFD)
		f.checkDir(dirFD, dirPath)
	}

	var (
		old    []byte
		exists bool
		st     unix.Stat_t
	)
	if dirFD >= 0 {
		old, st, exists, err = f.readExisting(dirFD)
		if err != nil {
			return false, err
		}
	}
	content := render(old, want)

	if exists && bytes.Equal(content, old) && f.attrsOK(&st) {
		return false, nil
	}
	if !exists && len(content) == 0 {
		return false, nil
	}

	if dirFD < 0 {
		dirFD, err = f.makeDir(parentFD, dirPath)
		if err != nil {
			return false, err
		}
		defer unix.Close(dirFD)
	}
	if err := f.replace(dirFD, content); err != nil {
		return false, err
	}
	f.log.Info("authorized_keys updated", "path", f.path, "managed_keys", len(want))
	return true, nil
}

// openDirNoFollow opens name in parentFD as a directory, refusing symlinks.
// A missing directory returns -1 and an error wrapping ENOENT.
func openDirNoFollow(parentFD int, name, fullPath string) (int, error) {
	fd, err := unix.Openat(parentFD, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		return fd, nil
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		return -1, fmt.Errorf("sshkeys: open %s: %w", fullPath, err)
	case errors.Is(err, unix.ELOOP):
		return -1, fmt.Errorf("sshkeys: %s: %w", fullPath, ErrSymlink)
	case errors.Is(err, unix.ENOTDIR):
		var st unix.Stat_t
		if unix.Fstatat(parentFD, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return -1, fmt.Errorf("sshkeys: %s: %w", fullPath, ErrSymlink)
		}
		return -1, fmt.Errorf("sshkeys: %s is not a directory", fullPath)
	}
	return -1, fmt.Errorf("sshkeys: open %s: %w", fullPath, err)
}

// checkDir warns about an existing .ssh directory that sshd's StrictModes
// would refuse. It is left as it is: it belongs to the user.
func (f *File) checkDir(dirFD int, dirPath string) {
	var st unix.Stat_t
	if err := unix.Fstat(dirFD, &st); err != nil {
		return
	}
	badOwner := f.uid >= 0 && int(st.Uid) != f.uid && st.Uid != 0
	if badOwner || st.Mode&0o022 != 0 {
		f.log.Warn("ssh directory has modes or owner sshd may refuse", "path", dirPath,
			"mode", fmt.Sprintf("%04o", st.Mode&0o7777), "uid", st.Uid)
	}
}

// readExisting reads the current file, if any, through dirFD.
func (f *File) readExisting(dirFD int) ([]byte, unix.Stat_t, bool, error) {
	var st unix.Stat_t
	// O_NONBLOCK so a FIFO planted in place of the file cannot hang Sync;
	// it is refused by the type check below.
	fd, err := unix.Openat(dirFD, f.name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, st, false, nil
	case errors.Is(err, unix.ELOOP):
		return nil, st, false, fmt.Errorf("sshkeys: %s: %w", f.path, ErrSymlink)
	case err != nil:
		return nil, st, false, fmt.Errorf("sshkeys: open %s: %w", f.path, err)
	}
	file := os.NewFile(uintptr(fd), f.path)
	defer file.Close()
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, st, false, fmt.Errorf("sshkeys: stat %s: %w", f.path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, false, fmt.Errorf("sshkeys: %s is not a regular file", f.path)
	}
	if st.Nlink != 1 {
		return nil, st, false, fmt.Errorf("sshkeys: %s has %d hard links; refusing to read it", f.path, st.Nlink)
	}
	data, err := io.ReadAll(io.LimitReader(file, maxFileSize+1))
	if err != nil {
		return nil, st, false, fmt.Errorf("sshkeys: read %s: %w", f.path, err)
	}
	if len(data) > maxFileSize {
		return nil, st, false, fmt.Errorf("sshkeys: %s is larger than %d bytes", f.path, maxFileSize)
	}
	return data, st, true, nil
}

// attrsOK reports whether an existing file already has the mode and owner a
// write would give it.
func (f *File) attrsOK(st *unix.Stat_t) bool {
	if st.Mode&0o7777 != 0o600 {
		return false
	}
	if f.uid >= 0 && (int(st.Uid) != f.uid || int(st.Gid) != f.gid) {
		return false
	}
	return true
}

// makeDir creates the .ssh directory 0700, owned by the user, and returns it
// opened.
func (f *File) makeDir(parentFD int, dirPath string) (int, error) {
	if err := unix.Mkdirat(parentFD, f.dir, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("sshkeys: create %s: %w", dirPath, err)
	}
	// Open again with O_NOFOLLOW: if something else appeared under the name
	// in the meantime, a symlink is still refused.
	dirFD, err := openDirNoFollow(parentFD, f.dir, dirPath)
	if err != nil {
		return -1, err
	}
	if f.uid >= 0 {
		if err := unix.Fchown(dirFD, f.uid, f.gid); err != nil {
			unix.Close(dirFD)
			return -1, fmt.Errorf("sshkeys: chown %s: %w", dirPath, err)
		}
	}
	// Explicit chmod: Mkdirat's mode is filtered by the umask.
	if err := unix.Fchmod(dirFD, 0o700); err != nil {
		unix.Close(dirFD)
		return -1, fmt.Errorf("sshkeys: chmod %s: %w", dirPath, err)
	}
	if err := unix.Fsync(parentFD); err != nil {
		unix.Close(dirFD)
		return -1, fmt.Errorf("sshkeys: fsync %s: %w", f.parent, err)
	}
	return dirFD, nil
}

// replace atomically replaces the file with content: a temporary file in the
// same directory is written, fsynced and renamed over it, then the directory
// is fsynced so the rename itself survives a crash.
func (f *File) replace(dirFD int, content []byte) error {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("sshkeys: temp name: %w", err)
	}
	tmp := "." + f.name + ".hearth-tmp-" + hex.EncodeToString(rnd[:])
	tmpPath := filepath.Join(filepath.Dir(f.path), tmp)
	fd, err := unix.Openat(dirFD, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("sshkeys: create %s: %w", tmpPath, err)
	}
	file := os.NewFile(uintptr(fd), tmpPath)
	renamed := false
	defer func() {
		if !renamed {
			_ = unix.Unlinkat(dirFD, tmp, 0)
		}
	}()
	err = func() error {
		defer file.Close()
		if f.uid >= 0 {
			if err := unix.Fchown(fd, f.uid, f.gid); err != nil {
				return fmt.Errorf("sshkeys: chown %s: %w", tmpPath, err)
			}
		}
		if err := unix.Fchmod(fd, 0o600); err != nil {
			return fmt.Errorf("sshkeys: chmod %s: %w", tmpPath, err)
		}
		if _, err := file.Write(content); err != nil {
			return fmt.Errorf("sshkeys: write %s: %w", tmpPath, err)
		}
		if err := file.Sync(); err != nil {
			return fmt.Errorf("sshkeys: fsync %s: %w", tmpPath, err)
		}
		return file.Close()
	}()
	if err != nil {
		return err
	}
	if err := unix.Renameat(dirFD, tmp, dirFD, f.name); err != nil {
		return fmt.Errorf("sshkeys: rename %s to %s: %w", tmpPath, f.path, err)
	}
	renamed = true
	if err := unix.Fsync(dirFD); err != nil {
		return fmt.Errorf("sshkeys: fsync %s: %w", filepath.Dir(f.path), err)
	}
	return nil
}

type managedKey struct {
	id string
	pk PublicKey
}

func markerLine(k managedKey) string {
	return markerPrefix + " " + k.id + " " + k.pk.Fingerprint
}

// parseMarker recognises a marker line and returns its id and fingerprint
// (either may be empty if a human mangled it).
func parseMarker(line string) (id, fp string, ok bool) {
	s := strings.TrimRight(strings.TrimLeft(line, " \t"), " \t\r")
	rest, ok := strings.CutPrefix(s, markerPrefix)
	if !ok {
		return "", "", false
	}
	fields := strings.Fields(rest)
	if len(fields) > 0 {
		id = fields[0]
	}
	if len(fields) > 1 {
		fp = fields[1]
	}
	return id, fp, true
}

// lineFingerprint returns the fingerprint of the key on an authorized_keys
// line, options or not, or "" if the line holds no key.
func lineFingerprint(line string) string {
	k, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return ""
	}
	return ssh.FingerprintSHA256(k)
}

// render computes the new file content from the old one and the wanted
// managed keys, following the layout described at markerPrefix.
func render(old []byte, want []managedKey) []byte {
	var lines []string
	if len(old) > 0 {
		lines = strings.Split(strings.TrimSuffix(string(old), "\n"), "\n")
	}
	endsWithNewline := len(old) == 0 || old[len(old)-1] == '\n'

	// Index every key line by fingerprint once, so claiming stays linear
	// in practice even for large files.
	claimed := make([]bool, len(lines))
	markerID := make(map[int]string)
	byFP := make(map[string][]int) // fingerprint → non-marker line indexes, ascending
	for i, l := range lines {
		if id, _, ok := parseMarker(l); ok {
			markerID[i] = id
			claimed[i] = true // marker lines are always ours
			continue
		}
		if fp := lineFingerprint(l); fp != "" {
			byFP[fp] = append(byFP[fp], i)
		}
	}
	for i, l := range lines {
		if _, ok := markerID[i]; !ok {
			continue
		}
		_, fp, _ := parseMarker(l)
		if fp == "" {
			continue
		}
		for _, j := range byFP[fp] {
			if j > i && !claimed[j] {
				claimed[j] = true
				break
			}
		}
	}

	wantByID := make(map[string]int, len(want))
	for i, k := range want {
		wantByID[k.id] = i
	}
	emitted := make(map[string]bool, len(want))
	out := make([]string, 0, len(lines)+2*len(want))
	lastManaged := false
	emit := func(k managedKey) {
		out = append(out, markerLine(k), k.pk.Line)
		emitted[k.id] = true
		lastManaged = true
	}
	for i, l := range lines {
		if !claimed[i] {
			out = append(out, l)
			lastManaged = false
			continue
		}
		id, ok := markerID[i]
		if !ok {
			continue // a claimed key line: re-emitted at its marker
		}
		if w, ok := wantByID[id]; ok && !emitted[id] {
			emit(want[w])
		}
	}
	for _, k := range want {
		if !emitted[k.id] {
			emit(k)
		}
	}
	if len(out) == 0 {
		return nil
	}
	s := strings.Join(out, "\n")
	// A last foreign line without a newline is kept that way; anything we
	// write ends with one.
	if endsWithNewline || lastManaged {
		s += "\n"
	}
	return []byte(s)
}
