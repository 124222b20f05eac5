package systemd

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
)

// WatchdogTimeout returns the watchdog timeout systemd set for this process
// (WatchdogSec= in the unit, passed as $WATCHDOG_USEC), or 0 when the
// watchdog is off or meant for another process ($WATCHDOG_PID).
func WatchdogTimeout() (time.Duration, error) {
	d, err := daemon.SdWatchdogEnabled(false)
	if err != nil {
		return 0, fmt.Errorf("systemd: watchdog settings: %w", err)
	}
	return d, nil
}

// Watchdog feeds systemd's watchdog while the daemon is healthy. When the
// unit sets WatchdogSec=, it runs probe every half timeout and sends
// WATCHDOG=1 only after probe returns nil, until ctx ends. When the
// watchdog is off it returns nil at once.
//
// probe should exercise the real serving path (a request to the daemon's own
// listener), so that a wedged server — accept loop stuck, handlers
// deadlocked — stops the pings and systemd restarts the service, rather than
// a ticker goroutine that keeps pinging no matter what.
func Watchdog(ctx context.Context, n Notifier, probe func(context.Context) error, log *slog.Logger) error {
	timeout, err := WatchdogTimeout()
	if err != nil {
		return err
	}
	if timeout == 0 {
		return nil
	}
	return WatchdogEvery(ctx, n, timeout, probe, log)
}

// WatchdogEvery is Watchdog with the timeout given instead of read from the
// environment. Each probe gets a deadline of a quarter of the timeout, so a
// slow-but-healthy probe still leaves a ping inside every timeout window. A
// probe that ignores its context blocks the loop, which withholds the pings
// — the intended outcome for a hung daemon — and delays the return after
// ctx ends until it returns.
func WatchdogEvery(ctx context.Context, n Notifier, timeout time.Duration, probe func(context.Context) error, log *slog.Logger) error {
	if timeout <= 0 {
		return fmt.Errorf("systemd: watchdog timeout must be positive, got %s", timeout)
	}
	if log == nil {
		log = slog.Default()
	}
	every, probeTimeout := timeout/2, timeout/4
	log.Info("systemd watchdog enabled", "timeout", timeout, "ping_every", every)

	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		err := probe(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			// No ping: if this persists for the whole timeout, systemd
			// kills and restarts the service.
			log.Warn("systemd watchdog: health probe failed, not pinging", "err", err)
		default:
			if err := n.WatchdogPing(); err != nil {
				log.Warn("systemd watchdog: ping failed", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// HTTPProbe returns a watchdog probe that GETs url and wants 200, so the
// watchdog is fed only while the service really answers requests. Each
// probe uses a fresh connection: a wedged accept loop must fail it. TLS
// certificates are not verified: the probe checks liveness of our own
// listener on loopback, whose certificate names the public host.
func HTTPProbe(url string) func(context.Context) error {
	client := &http.Client{Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // liveness of our own listener
		DisableKeepAlives: true,
	}}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return fmt.Errorf("health probe: %w", err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("health probe: %w", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("health probe: %s answered %d", url, resp.StatusCode)
		}
		return nil
	}
}

// LoopbackAddr turns a listener's address into one the probe can dial: an
// unspecified host (0.0.0.0, ::) becomes 127.0.0.1.
func LoopbackAddr(a net.Addr) string {
	host, port, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
