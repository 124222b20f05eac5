package daemon

import (
	"context"
	"log/slog"
	"time"
)

// enforcementWait caps how long READY=1 waits for the desired state to be
// applied: a control plane that is away at first boot must not keep the
// deployment down.
const enforcementWait = 30 * time.Second

// readiness reports ready once the first model is served (the runtime
// concern loads it; see modelServer): systemd gets READY=1 once the
// desired state is in force too (or enforcementWait passed).
func (nd *node) readiness(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return nil
	case <-nd.models.first:
	}
	nd.becomeReady(ctx)
	return nil
}

// becomeReady tells systemd, once the desired state is in force (or
// enforcementWait passed).
func (nd *node) becomeReady(ctx context.Context) {
	if nd.enf != nil {
		nd.status("applying firewall rules and SSH keys")
		waitEnforced(ctx, nd.enf.Enforced, enforcementWait, nd.log)
	}
	if err := nd.notify.Ready(); err != nil {
		nd.log.Warn("sd_notify READY", "err", err)
	}
	model := nd.api.Model()
	nd.status("serving " + model)
	nd.log.Info("ready", "model", model, "url", nd.url)
}

// watchRuntime tells the runtime concern when the runtime stops reporting
// the served model loaded (restarted outside hearthd, or the model
// evicted), checking every few seconds; it is then loaded again.
func (nd *node) watchRuntime(ctx context.Context) error {
	every := nd.opts.watchEvery
	if every <= 0 {
		every = 3 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if !nd.api.Warm() {
			continue // the first load is under way
		}
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := nd.api.Healthy(rctx)
		cancel()
		if err != nil {
			nd.runtime.Lost()
		}
	}
}

// waitEnforced holds READY=1 until enforced reports true, or until timeout.
func waitEnforced(ctx context.Context, enforced func() bool, timeout time.Duration, log *slog.Logger) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !enforced() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			log.Warn("desired state not applied yet; reporting ready anyway", "waited", timeout)
			return
		case <-tick.C:
		}
	}
}
