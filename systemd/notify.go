// Package systemd is the glue between the hearth daemons and the service
// manager: readiness and status notifications (sd_notify), the watchdog, and
// socket activation. Everything degrades to a no-op or a plain listen when
// the process is not started by systemd, so the same binary runs under a
// unit, in a container, or from a shell.
//
// The unit files (hearthd.service, hearthd.socket, hearth-control.service,
// hearth-control.socket) live beside this code; see README.md.
package systemd

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/sys/unix"
)

// Notifier tells the service manager about the daemon's life cycle.
type Notifier interface {
	// Ready reports that start-up is complete (READY=1): for Type=notify
	// units, systemd holds dependent units and reports "activating" until
	// then.
	Ready() error
	// Status sets the free-form status line systemctl status shows.
	Status(string) error
	// Stopping reports that shutdown (draining) has begun (STOPPING=1).
	Stopping() error
	// Reloading reports that configuration is being reloaded; call Ready
	// when the reload is done.
	Reloading() error
	// WatchdogPing resets the watchdog timer (WATCHDOG=1). Use Watchdog
	// rather than calling it directly: it pings only while the daemon is
	// healthy.
	WatchdogPing() error
}

// SdNotifier sends notifications over $NOTIFY_SOCKET with daemon.SdNotify.
// Without $NOTIFY_SOCKET (not started by systemd) every method is a no-op.
// The variable is read on every call and left in the environment: children
// (a supervised ollama) inherit it, but NotifyAccess=main makes systemd
// ignore anything but the main process.
type SdNotifier struct{}

var _ Notifier = SdNotifier{}

// Ready sends READY=1.
func (SdNotifier) Ready() error { return send(daemon.SdNotifyReady) }

// Status sends STATUS=s. Newlines are replaced by spaces: the protocol is
// newline-separated assignments, so a newline inside the text would start a
// new assignment (for example a forged READY=1).
func (SdNotifier) Status(s string) error { return send(statusMessage(s)) }

// Stopping sends STOPPING=1.
func (SdNotifier) Stopping() error { return send(daemon.SdNotifyStopping) }

// Reloading sends RELOADING=1 with MONOTONIC_USEC, which systemd ≥ 253
// requires to match the reload to the request (Type=notify-reload) and
// older versions ignore.
func (SdNotifier) Reloading() error {
	msg, err := reloadingMessage()
	if err != nil {
		return err
	}
	return send(msg)
}

// WatchdogPing sends WATCHDOG=1.
func (SdNotifier) WatchdogPing() error { return send(daemon.SdNotifyWatchdog) }

func send(state string) error {
	if _, err := daemon.SdNotify(false, state); err != nil {
		return fmt.Errorf("systemd: notify %q: %w", firstLine(state), err)
	}
	return nil
}

func statusMessage(s string) string {
	return "STATUS=" + strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

func reloadingMessage() (string, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return "", fmt.Errorf("systemd: read monotonic clock: %w", err)
	}
	usec := ts.Nano() / 1000
	return fmt.Sprintf("%s\nMONOTONIC_USEC=%d", daemon.SdNotifyReloading, usec), nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// Fake is a Notifier that records the messages it would have sent, in the
// wire format (READY=1, STATUS=…, STOPPING=1, RELOADING=1, WATCHDOG=1), for
// tests of the code that drives the life cycle. Safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	msgs    []string
	changed chan struct{} // closed and replaced on every message
	// Err, if set before use, is returned by every method (the message is
	// still recorded), to test that callers tolerate notify failures.
	Err error
}

var _ Notifier = (*Fake)(nil)

func (f *Fake) record(msg string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.msgs = append(f.msgs, msg)
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
	return f.Err
}

// Ready records READY=1.
func (f *Fake) Ready() error { return f.record(daemon.SdNotifyReady) }

// Status records STATUS=s, sanitised as SdNotifier sends it.
func (f *Fake) Status(s string) error { return f.record(statusMessage(s)) }

// Stopping records STOPPING=1.
func (f *Fake) Stopping() error { return f.record(daemon.SdNotifyStopping) }

// Reloading records RELOADING=1 (without the timestamp, so tests can compare).
func (f *Fake) Reloading() error { return f.record(daemon.SdNotifyReloading) }

// WatchdogPing records WATCHDOG=1.
func (f *Fake) WatchdogPing() error { return f.record(daemon.SdNotifyWatchdog) }

// Messages returns a copy of the messages recorded so far, oldest first.
func (f *Fake) Messages() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.msgs...)
}

// Count returns how many recorded messages equal msg.
func (f *Fake) Count(msg string) int {
	n := 0
	for _, m := range f.Messages() {
		if m == msg {
			n++
		}
	}
	return n
}

// WaitFor blocks until a message equal to msg has been recorded or ctx ends.
func (f *Fake) WaitFor(ctx context.Context, msg string) error {
	for {
		f.mu.Lock()
		for _, m := range f.msgs {
			if m == msg {
				f.mu.Unlock()
				return nil
			}
		}
		if f.changed == nil {
			f.changed = make(chan struct{})
		}
		ch := f.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("systemd: waiting for %q: %w", msg, ctx.Err())
		}
	}
}
