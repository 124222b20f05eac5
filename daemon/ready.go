package daemon

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/hearthd/hearth/llm/ollama"
	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/nodeapi"
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
		// A wedged runtime has the model loaded; loading it again would
		// not help (see recoverRuntime), and one being restarted is
		// loaded again when it is back.
		if err != nil && !errors.Is(err, ollama.ErrWedged) && !errors.Is(err, ollama.ErrRestarting) {
			nd.runtime.Lost()
		}
	}
}

// runtimeWedged is the Ollama backend's OnWedged: the runtime takes
// requests and answers none (docs/runtime-wedge.md). A supervised one is
// restarted by recoverRuntime; the backend reports another (readiness
// false, the node degraded), since hearthd cannot restart it.
func (nd *node) runtimeWedged(reason string) (restarting bool) {
	nd.m.RuntimeWedged()
	if nd.wedged == nil {
		nd.log.Error("model runtime is wedged; reporting degraded until it answers again", "reason", reason, "runtime", nd.cfg.OllamaURL)
		nd.reportNow()
		return false
	}
	nd.log.Error("model runtime is wedged; restarting it", "reason", reason, "runtime", nd.cfg.OllamaURL)
	nd.restarting("wedged: " + reason)
	select {
	case nd.wedged <- reason:
	default: // a restart is asked for already
	}
	return true
}

// restarting records a restart of the runtime that begins now, for reason:
// the backend holds requests until the model is loaded again (runtimeBack),
// and the control plane hears of it at once.
func (nd *node) restarting(reason string) {
	nd.restarts.begin(reason, time.Now())
	if r, ok := nd.rt.(interface{ Restarting() }); ok {
		r.Restarting()
	}
	nd.reportNow()
}

// runtimeBack records that the model is served again after a loss: a
// restart in progress is over.
func (nd *node) runtimeBack() {
	took, ok := nd.restarts.end(time.Now())
	if !ok {
		return
	}
	nd.m.RuntimeRecovered(took)
	nd.log.Info("model runtime restarted and the model loaded again", "took", took.Round(time.Millisecond))
	nd.reportNow()
}

// reportNow has the node agent post the runtime's state at once.
func (nd *node) reportNow() {
	if nd.agent != nil {
		nd.agent.ReportNow()
	}
}

// runtimeHealth is the runtime's state for hearth_runtime_health, from
// what is known without asking it.
func (nd *node) runtimeHealth() string {
	if restarting, _ := nd.restarts.state(); restarting {
		return nodeapi.RuntimeRestarting
	}
	if h, ok := nd.rt.(interface {
		Health() (ollama.Health, string)
	}); ok {
		if st, _ := h.Health(); st != ollama.Healthy {
			return st.String()
		}
	}
	if nd.api == nil || !nd.api.Warm() {
		return nodeapi.RuntimeDegraded
	}
	return nodeapi.RuntimeHealthy
}

// recoverRuntime restarts the supervised `ollama serve` each time it is
// found wedged. Killing only the model runner would not do: the lost slots
// are the server's, and it loads a new runner only once no request holds
// the old one. Meanwhile requests wait in the backend (and hearthd's
// admission) instead of failing; the runtime concern loads the model again,
// which ends the restart (modelServer.Serve).
func (nd *node) recoverRuntime(ctx context.Context) error {
	for {
		var reason string
		select {
		case <-ctx.Done():
			return nil
		case reason = <-nd.wedged:
		}
		nd.m.RuntimeRestarted(metrics.RestartWedged)
		nd.status("restarting the wedged model runtime")
		if err := nd.restartRuntime(ctx, reason); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			nd.log.Error("restart the wedged model runtime", "err", err)
		}
		nd.runtime.Lost()
	}
}

// runtimeRestarts is what the node knows of its runtime's restarts: one
// under way since began, and the last one's time and reason.
type runtimeRestarts struct {
	mu    sync.Mutex
	began time.Time // zero: none under way
	last  *nodeapi.RuntimeRestart
}

func (r *runtimeRestarts) begin(reason string, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.began.IsZero() {
		r.began = now
	}
	r.last = &nodeapi.RuntimeRestart{At: now.UTC(), Reason: reason}
}

// end ends the restart under way, if any, and says how long it took.
func (r *runtimeRestarts) end(now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.began.IsZero() {
		return 0, false
	}
	took := now.Sub(r.began)
	r.began = time.Time{}
	return took, true
}

// state is the node report's view: a restart under way, and the last one.
func (r *runtimeRestarts) state() (bool, *nodeapi.RuntimeRestart) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last *nodeapi.RuntimeRestart
	if r.last != nil {
		l := *r.last
		last = &l
	}
	return !r.began.IsZero(), last
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
