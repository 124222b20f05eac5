package agent

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/hearthd/hearth/internal/backoff"
)

// Progress is a model pull's progress as the runtime reports it; the zero
// value means no pull is under way.
type Progress struct {
	Status           string
	Completed, Total int64
}

// ModelServer serves one model at a time: the model runtime and the
// deployment API in front of it.
type ModelServer interface {
	// Serve makes model the deployment's model: present in the runtime
	// (pulled by name when missing, reporting progress), loaded and warm,
	// then switched to, with requests in flight on the previous model
	// finishing first. Asked for the model it serves already, it loads it
	// again (the runtime lost it). It is one attempt; Runtime retries.
	Serve(ctx context.Context, model string, progress func(Progress)) error
}

// RuntimeConfig configures a Runtime.
type RuntimeConfig struct {
	// Default is the model served when none is ordered: a node without a
	// deployment (or with a bare server), a standalone node.
	Default string
	// Backoff paces the retries of a failed Serve. Zero Min and Max: 500 ms
	// doubling to 30 s, jittered.
	Backoff backoff.Backoff
	// ProgressEvery bounds how often pull progress is announced; a new
	// pull status always is. Default 1 s.
	ProgressEvery time.Duration
}

// RuntimeState is the runtime concern as the node reports it.
type RuntimeState struct {
	// Concern: Revision is the last desired revision at which the ordered
	// model was served and answered; Error says why the ordered model is
	// not served (pull, create or load failure), kept while retrying.
	Concern
	// Model is the model the deployment serves now ("" until the first).
	Model string
	// Progress is the pull under way, if any.
	Progress Progress
}

// Runtime is the enforcer's runtime concern: it converges the model the
// deployment serves to the one wanted, in the background — a pull may take
// minutes, and keys or rules must not wait for it — retrying failures with
// backoff, and announces every change of its state (Changed).
type Runtime struct {
	srv ModelServer
	cfg RuntimeConfig
	log *slog.Logger

	mu      sync.Mutex
	want    string // the model to serve: the ordered one, or Default
	wantRev uint64
	wanted  bool   // a desired state has said what to serve
	served  string // what the last successful Serve made the deployment serve
	lost    bool   // the served model must be loaded again
	state   RuntimeState
	// attempt cancels the Serve under way; attemptFor is its model.
	attempt    context.CancelFunc
	attemptFor string
	lastNote   time.Time     // when progress was last announced
	kick       chan struct{} // wakes the loop; buffered 1
	changed    chan struct{} // closed (and replaced) on every change
}

// NewRuntime returns the runtime concern over srv. It serves cfg.Default
// until a desired state orders a model; Run does the work.
func NewRuntime(srv ModelServer, cfg RuntimeConfig, logger *slog.Logger) *Runtime {
	if cfg.Backoff.Min <= 0 && cfg.Backoff.Max <= 0 {
		cfg.Backoff = backoff.Backoff{Min: 500 * time.Millisecond, Max: 30 * time.Second, Jitter: true}
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = time.Second
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Runtime{srv: srv, cfg: cfg, log: logger.With("component", "runtime"), want: cfg.Default,
		kick: make(chan struct{}, 1), changed: make(chan struct{})}
}

// Want orders model ("" for the default) at desired revision rev. A model
// already served, and answering, is in force at rev at once (a revision
// that changed only rules or keys); another is served in the background,
// and a Serve of a model no longer wanted is abandoned.
func (r *Runtime) Want(rev uint64, model string) {
	if model == "" {
		model = r.cfg.Default
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	prev := r.state
	moved := model != r.want
	r.want, r.wantRev, r.wanted = model, rev, true
	if r.attempt != nil && r.attemptFor != model {
		r.attempt()
	}
	if model == r.served && !r.lost {
		r.state.Revision, r.state.Error, r.state.Progress = rev, "", Progress{}
	} else if moved {
		r.state.Error, r.state.Progress = "", Progress{}
		r.wake()
	}
	if r.state != prev {
		r.announce()
	}
}

// Lost says the runtime no longer has the served model loaded (it
// restarted, or evicted it): it is loaded again.
func (r *Runtime) Lost() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.served != "" && !r.lost {
		r.lost = true
		r.wake()
	}
}

// State returns what the concern has in force.
func (r *Runtime) State() RuntimeState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// Changed returns a channel closed at the next change of State.
func (r *Runtime) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

// wake and announce run with mu held.
func (r *Runtime) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Runtime) announce() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Run serves the wanted model until ctx ends: whenever it is not the
// served one (or the served one was lost), Serve is tried, and retried
// with backoff while it fails.
func (r *Runtime) Run(ctx context.Context) error {
	bo := r.cfg.Backoff
	for {
		r.mu.Lock()
		model, need := r.want, r.want != r.served || r.lost
		if !need {
			r.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil
			case <-r.kick:
				continue
			}
		}
		actx, cancel := context.WithCancel(ctx)
		r.attempt, r.attemptFor = cancel, model
		r.mu.Unlock()

		r.log.Info("serving model", "model", model)
		err := r.srv.Serve(actx, model, r.progress)
		abandoned := actx.Err() != nil
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if r.finish(model, err, abandoned) {
			bo.Reset()
			continue
		}
		wait := bo.Next()
		r.log.Error("model not served; retrying", "model", model, "err", err, "in", wait)
		r.pause(ctx, model, wait)
	}
}

// finish records the outcome of a Serve of model and reports whether the
// loop goes on at once (success, or an attempt abandoned for another
// model).
func (r *Runtime) finish(model string, err error, abandoned bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempt = nil
	prev := r.state
	r.state.Progress = Progress{}
	ok := true
	switch {
	case err == nil:
		// Any loss noticed meanwhile was the previous model's, or is
		// noticed again by the next health check.
		r.served, r.lost = model, false
		r.state.Model = model
		if r.want == model {
			r.state.Error = ""
			if r.wanted {
				r.state.Revision = r.wantRev
			}
		}
	case abandoned && r.want != model:
	default:
		if r.want == model {
			r.state.Error = err.Error()
		}
		ok = false
	}
	if r.state != prev {
		r.announce()
	}
	return ok
}

// pause waits d before the next attempt at model, or less if another model
// is wanted meanwhile.
func (r *Runtime) pause(ctx context.Context, model string, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-r.kick:
			r.mu.Lock()
			moved := r.want != model
			r.mu.Unlock()
			if moved {
				return
			}
		}
	}
}

// progress is Serve's progress callback: the state follows the pull, and
// changes are announced on a new status or every ProgressEvery.
func (r *Runtime) progress(p Progress) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.attempt == nil || r.attemptFor != r.want {
		return // a pull for a model no longer wanted
	}
	prev := r.state.Progress
	r.state.Progress = p
	now := time.Now()
	if p.Status != prev.Status || now.Sub(r.lastNote) >= r.cfg.ProgressEvery {
		r.lastNote = now
		r.announce()
	}
}
