package deployapi

import (
	"io"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"
)

type flakyListener struct {
	net.Listener
	errs []error
}

func (f *flakyListener) Accept() (net.Conn, error) {
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		return nil, err
	}
	c1, _ := net.Pipe()
	return c1, nil
}

func TestRetryListenerSurvivesFileExhaustion(t *testing.T) {
	var slept []time.Duration
	fl := &flakyListener{errs: []error{
		&net.OpError{Op: "accept", Err: syscall.EMFILE},
		&net.OpError{Op: "accept", Err: syscall.ENFILE},
	}}
	l := &retryListener{Listener: fl, log: slog.New(slog.NewTextHandler(io.Discard, nil)), sleep: func(d time.Duration) { slept = append(slept, d) }}
	c, err := l.Accept()
	if err != nil || c == nil {
		t.Fatalf("Accept after EMFILE, ENFILE: %v", err)
	}
	c.Close()
	if len(slept) != 2 || slept[1] <= slept[0] {
		t.Fatalf("backoff %v", slept)
	}

	fl.errs = []error{net.ErrClosed}
	if _, err := l.Accept(); err != net.ErrClosed {
		t.Fatalf("a closed listener must end the accept loop, got %v", err)
	}
}
