// Package adminsock is the local admin socket both daemons serve their
// admin API on (hearthd's key management, hearth-control's token
// issuing), and the client side their CLIs use to reach it.
//
// The socket's file mode is the access control, and its path is how a CLI
// finds the one process that holds the state, so Listen is careful with
// whatever is already at the path: it never deletes a file that is not a
// socket, and never takes over a socket another process still serves on
// (a second instance doing so would leave CLI commands writing into the
// wrong database).
package adminsock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

var (
	// ErrNotSocket: something other than a socket is at the path.
	ErrNotSocket = errors.New("exists and is not a socket")
	// ErrInUse: a live process accepts connections on the socket.
	ErrInUse = errors.New("another process is serving on it")
	// ErrNotRunning: no process accepts connections at the path (nothing
	// is there, or only a stale socket left by a process that died).
	ErrNotRunning = errors.New("no server is listening")
)

// probeTimeout bounds the liveness check of an existing socket: a live
// server accepts within microseconds even when busy.
const probeTimeout = time.Second

// Listen listens on a unix socket at path that only this process's user
// can connect to (mode 0600), creating its directory (0700) if needed. A
// stale socket left by a process that died is replaced. Anything else at
// path is left alone and is an error: a file that is not a socket
// (ErrNotSocket), a socket a live process accepts on (ErrInUse), or one
// whose liveness cannot be told.
//
// Two processes starting at the same instant could both find the same
// stale socket; the pair of checks here is for the common case of a second
// instance started by mistake next to a running one.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("admin socket directory: %w", err)
	}
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, fmt.Errorf("admin socket %s: %w", path, err)
	case fi.Mode().Type() != os.ModeSocket:
		return nil, fmt.Errorf("admin socket %s: %w (%s); not replacing it", path, ErrNotSocket, fi.Mode().Type())
	default:
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		c, derr := Dial(ctx, path)
		cancel()
		switch {
		case derr == nil:
			c.Close()
			return nil, fmt.Errorf("admin socket %s: %w", path, ErrInUse)
		case !errors.Is(derr, ErrNotRunning):
			return nil, fmt.Errorf("admin socket %s: cannot tell whether a process still serves on it: %w", path, derr)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale admin socket: %w", err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on admin socket: %w", err)
	}
	// bind(2) creates the socket with the process umask; tighten it before
	// anything is served. Under the usual 022 umask no other user has the
	// write permission connect(2) needs even in the meantime.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restrict admin socket: %w", err)
	}
	return ln, nil
}

// Dial connects to the admin socket at path. When no process accepts
// connections there, the error wraps ErrNotRunning, so a CLI can tell "the
// daemon is down" from "not allowed" (run as root?) or a busy server.
func Dial(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil && (errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)) {
		return nil, fmt.Errorf("%w on %s: %w", ErrNotRunning, path, err)
	}
	return c, err
}

// Client returns an HTTP client that sends every request to the server on
// the admin socket at path, whatever the URL's host. A request to a socket
// nobody serves on fails with an error wrapping ErrNotRunning. Connections
// are not kept alive: a CLI sends one or two requests.
func Client(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return Dial(ctx, path)
		},
		DisableKeepAlives: true,
	}}
}
