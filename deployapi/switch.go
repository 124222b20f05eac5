package deployapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hearthd/hearth/llm"
)

// served is the model the deployment serves and the runtime that serves
// it. A request reads it once, so its answer names one model throughout,
// even if a switch ends while it runs.
type served struct {
	model       string
	rt          llm.Runtime
	created     int64 // the model's `created` in /models
	fingerprint string
	// ctx is the parent of this model's generations: cancelled when a
	// switch's drain times out, ending the ones still running.
	ctx    context.Context
	cancel context.CancelFunc

	// What the model can take, asked of the runtime once (limits.go);
	// whether it answers logprobs, asked once a request wants them.
	limMu    sync.Mutex
	lim      llm.Limits
	limKnown bool
	lpMu     sync.Mutex
	lp       bool
	lpKnown  bool
}

func (a *API) newServed(model string, rt llm.Runtime) *served {
	sum := sha256.Sum256([]byte(model + "\x00" + a.cfg.Version))
	ctx, cancel := context.WithCancel(a.base)
	return &served{model: model, rt: rt, created: time.Now().Unix(),
		fingerprint: "fp_" + hex.EncodeToString(sum[:5]), ctx: ctx, cancel: cancel}
}

// errSwitching is the answer to a request that waited for a model switch
// longer than it may: 503 with Retry-After.
var errSwitching = errors.New("the deployment is switching its model")

// gate admits chat requests to the served model and holds new ones back
// while a switch drains the model's requests in flight. It is entered once
// per request, before the request's generation slot is taken, so a switch
// waits for queued requests too.
type gate struct {
	cur atomic.Pointer[served] // read without the lock by /models and health

	mu        sync.Mutex
	active    int           // requests entered on cur
	waiting   int           // requests waiting for a switch to end
	switching chan struct{} // non-nil while a switch runs; closed when it ends
	idle      chan struct{} // non-nil while a switch waits for active to reach 0
}

// enter admits a request to the served model, waiting at most wait (and
// only while fewer than maxWaiting wait) for a switch in progress. Every
// successful enter is paired with a leave.
func (g *gate) enter(ctx context.Context, wait time.Duration, maxWaiting int) (*served, error) {
	g.mu.Lock()
	var timer *time.Timer
	for g.switching != nil {
		if g.waiting >= maxWaiting {
			g.mu.Unlock()
			return nil, errSwitching
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		ch := g.switching
		g.waiting++
		g.mu.Unlock()
		var err error
		select {
		case <-ch:
		case <-timer.C:
			err = errSwitching
		case <-ctx.Done():
			err = ctx.Err()
		}
		g.mu.Lock()
		g.waiting--
		if err != nil {
			g.mu.Unlock()
			return nil, err
		}
	}
	g.active++
	s := g.cur.Load()
	g.mu.Unlock()
	return s, nil
}

func (g *gate) leave() {
	g.mu.Lock()
	g.active--
	if g.active == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

// Model is the model the deployment serves now.
func (a *API) Model() string { return a.gate.cur.Load().model }

// Switch makes model, served by rt, the deployment's model. New chat
// requests wait (at most SwitchWait, then 503 with Retry-After) while the
// generations in flight on the current model finish; those still running
// after drain are ended, each stream with an error event and [DONE]. Then
// load readies the new model (loads it into memory); if it fails the
// current model stays and its error is returned. Only requests see the
// switch: /models names the new model once Switch returns nil.
//
// Before the API is warm (start-up) nothing is in flight: the model is
// loaded and becomes the served one, and the API turns warm.
func (a *API) Switch(ctx context.Context, model string, rt llm.Runtime, drain time.Duration, load func(context.Context) error) error {
	g := &a.gate
	g.mu.Lock()
	if g.switching != nil {
		g.mu.Unlock()
		return errors.New("deployapi: a model switch is already running")
	}
	done := make(chan struct{})
	g.switching = done
	old := g.cur.Load()
	var idle chan struct{}
	if g.active > 0 {
		idle = make(chan struct{})
		g.idle = idle
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.switching, g.idle = nil, nil
		close(done)
		g.mu.Unlock()
	}()

	err := a.drainServed(ctx, old, idle, drain)
	if err == nil {
		if err = load(ctx); err != nil {
			err = fmt.Errorf("load model %s: %w", model, err)
		}
	}
	if err != nil {
		if old.ctx.Err() != nil {
			// The drain ended the old model's generations: it goes on
			// serving on a fresh context.
			g.cur.Store(a.newServed(old.model, old.rt))
		}
		return err
	}
	ns := a.newServed(model, rt)
	// What the model can take is known before it serves: the derived body
	// limit holds from the first request, and asking the runtime (it may
	// generate a token) happens here, not inside a client's request.
	ns.limits(ctx)
	g.cur.Store(ns)
	old.cancel() // nothing runs on it any more
	a.warm.Store(true)
	a.log.Info("model switched", "from", old.model, "to", model)
	return nil
}

// drainServed waits until the requests on s have left (idle is closed; nil
// when none were in flight), ending their generations once drain has
// passed.
func (a *API) drainServed(ctx context.Context, s *served, idle <-chan struct{}, drain time.Duration) error {
	if idle == nil {
		return nil
	}
	a.log.Info("model switch: waiting for the requests in flight", "model", s.model, "drain", drain)
	t := time.NewTimer(drain)
	defer t.Stop()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	a.log.Warn("model switch: drain timed out; ending the generations still running", "model", s.model, "drain", drain)
	s.cancel()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
