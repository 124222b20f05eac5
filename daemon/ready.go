package daemon

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/hearthd/hearth/llm/ollama"
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
		// A stuck runtime has the model loaded; loading it again would
		// not help (see recoverRuntime).
		if err != nil && !errors.Is(err, ollama.ErrStuck) {
			nd.runtime.Lost()
		}
	}
}

// runtimeStuck is the Ollama backend's OnStuck: the runtime takes
// generations and answers none (ollama/ollama#17131 leaves it so). A
// supervised one is restarted by recoverRuntime; the backend reports
// another (readiness false, an error in the log), since hearthd cannot
// restart it.
func (nd *node) runtimeStuck(reason string) (restarting bool) {
	nd.m.RuntimeStuck()
	if nd.stuck == nil {
		return false
	}
	select {
	case nd.stuck <- reason:
	default: // a restart is asked for already
	}
	return true
}

// recoverRuntime restarts the supervised `ollama serve` each time it is
// found stuck. Killing the model runner would not do: the lost slot is the
// server's. Meanwhile the deployment is out of service as while the model
// first loads (/readyz false, requests 503); the runtime concern loads the
// model again, which puts it back in service (modelServer.Serve).
func (nd *node) recoverRuntime(ctx context.Context) error {
	for {
		var reason string
		select {
		case <-ctx.Done():
			return nil
		case reason = <-nd.stuck:
		}
		nd.log.Warn("model runtime is stuck; restarting it", "reason", reason, "runtime", nd.cfg.OllamaURL)
		nd.m.RuntimeRestarted()
		nd.api.SetWarm(false)
		nd.status("restarting the stuck model runtime")
		if err := nd.restartRuntime(ctx, reason); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			nd.log.Error("restart the stuck model runtime", "err", err)
		}
		nd.runtime.Lost()
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
