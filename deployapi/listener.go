package deployapi

import (
	"errors"
	"log/slog"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hearthd/hearth/internal/backoff"
)

// retryListener keeps accepting through transient accept errors. fasthttp
// treats every accept error but a timeout as fatal, so running out of file
// descriptors under a connection flood would stop the whole API; here the
// accept loop waits and tries again, and the connections already open go on
// being served.
type retryListener struct {
	net.Listener
	log   *slog.Logger
	sleep func(time.Duration) // time.Sleep; replaced in tests
}

// NewRetryListener wraps ln so that transient accept errors (out of file
// descriptors, buffers or memory) are waited out instead of ending Serve.
func NewRetryListener(ln net.Listener, log *slog.Logger) net.Listener {
	return &retryListener{Listener: ln, log: log, sleep: time.Sleep}
}

func (l *retryListener) Accept() (net.Conn, error) {
	bo := backoff.Backoff{Min: 5 * time.Millisecond, Max: time.Second}
	var warned time.Time
	for {
		c, err := l.Listener.Accept()
		if err == nil || !transientAcceptError(err) {
			return c, err
		}
		if time.Since(warned) > 10*time.Second {
			l.log.Warn("accept failed; retrying (raise the open-file limit or lower max-concurrent/max-queue)", "err", err)
			warned = time.Now()
		}
		l.sleep(bo.Next())
	}
}

func transientAcceptError(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// CheckFileLimit warns when the open-file limit cannot hold every admitted
// connection (maxConcurrent generations and maxQueue waiting) with its
// upstream connection to the runtime. (Go raises the soft limit to the hard
// limit at start, so the hard limit is what counts.)
func CheckFileLimit(maxConcurrent, maxQueue int, log *slog.Logger) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return
	}
	need := uint64(2*(maxConcurrent+maxQueue) + 256)
	if rl.Cur < need {
		log.Warn("open-file limit is low for the configured concurrency", "limit", rl.Cur, "want_at_least", need)
	}
}
