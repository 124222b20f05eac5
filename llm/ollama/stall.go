package ollama

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
)

// ErrStuck marks the answer of Ready while the runtime looks stuck: it
// takes generations and never starts answering them. Loading the model
// again does not help; restarting the runtime does.
var ErrStuck = errors.New("model runtime looks stuck")

// stallWatch tells a runtime that is stuck from one that is busy, from
// what hearthd's own generations see. Ollama (0.9.6 to 0.17.4 at least)
// loses a parallel slot for good when a client closes a stream at the
// wrong moment (ollama/ollama#17131): the handler's producer blocks on a
// send nobody reads and keeps the slot. With every slot lost (one on a CPU
// with 0.17.4), each later generation waits for a slot that never frees,
// and only a new `ollama serve` brings them back.
//
// # The rule
//
// A generation of ours that has had no first line for FirstByteTimeout is
// a suspect when, at that moment (its 504, or when the request is closed
// after the abandon hold), nothing else of ours could be what the runtime
// is working on: no generation of ours is streaming, none sent before it
// is still open, and no line at all has come from the runtime since it was
// sent. A run of suspects lasts while no line comes from the runtime. The
// runtime is stuck when a suspect is seen stuckAfter (2 × FirstByteTimeout
// + the abandon hold; 3 minutes at the default 60 s) or more after the
// first suspect of the run was sent.
//
// Why it cannot fire on a runtime that is merely busy: a generation that
// streams sends lines, and any line (a first line anywhere, or the end of
// a stream that had one) ends the run. A generation queued behind another
// of ours, or behind one that streams, is never a suspect: the runtime may
// be reading the earlier prompt. What is left is a runtime that sent
// nothing at all, for three times the time the operator allows a first
// token (--runtime-timeout), while at both ends of that time nothing of
// ours was ahead of the suspect. A legitimate prefill does that only if
// one prompt takes longer than stuckAfter to read and another request
// comes meanwhile: a lone request cannot, however long its prompt, since
// it is closed FirstByteTimeout + the abandon hold after it was sent, which
// is less than stuckAfter. A prompt that takes three times --runtime-timeout
// to read gets a 504 long before, and so does every request behind it;
// raising --runtime-timeout for such a deployment raises the bound with
// it. On a runtime hearthd does not supervise, another client of it can
// keep it busy that long too: there the rule only reports (readiness
// false, an error in the log), and one answer ends the report.
type stallWatch struct {
	fbt     time.Duration // FirstByteTimeout; zero turns the watch off
	after   time.Duration // stuckAfter
	onStuck func(reason string) (restarting bool)
	log     *slog.Logger

	mu       sync.Mutex
	open     map[*genTrack]struct{}
	progress uint64 // bumped by every first line and every end of an answered generation
	seq      uint64 // send order
	// The run of suspects: since the first one's send (start), the
	// runtime sent nothing (progress stayed runProgress).
	running     bool
	runStart    time.Time
	runProgress uint64
	// stuck is set while a runtime that is not being restarted is
	// reported stuck; a line or a probe's answer clears it.
	stuck   bool
	probing bool
	probed  time.Time
	// late fires at the first-byte deadline of the oldest generation
	// without a first line (expire), lateAt; zero: not armed. One timer
	// for every generation's deadline, where a timer per generation was
	// one added and stopped on every request's path. Deadlines come in
	// the order generations are sent, so one sent while it is armed needs
	// nothing.
	late   *time.Timer
	lateAt time.Time
}

// genTrack is one generation as the watch sees it.
type genTrack struct {
	seq      uint64
	sent     time.Time
	progress uint64 // the watch's progress when it was sent
	answered bool   // the runtime sent its first line (or an error answer)
	// late is closed once FirstByteTimeout has passed since sent without
	// a first line (nil without the bound); expired then, under the
	// watch's mu.
	late    chan struct{}
	expired bool
}

func newStallWatch(fbt, abandonWait time.Duration, onStuck func(string) bool, log *slog.Logger) *stallWatch {
	return &stallWatch{fbt: fbt, after: 2*fbt + abandonWait, onStuck: onStuck, log: log,
		open: make(map[*genTrack]struct{})}
}

// sent registers a generation sent at now.
func (w *stallWatch) sent(now time.Time) *genTrack {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	g := &genTrack{seq: w.seq, sent: now, progress: w.progress}
	w.open[g] = struct{}{}
	if w.fbt > 0 {
		g.late = make(chan struct{})
		if at := now.Add(w.fbt); w.lateAt.IsZero() || at.Before(w.lateAt) {
			w.arm(at)
		}
	}
	return g
}

// arm has expire run at at. Under w.mu.
func (w *stallWatch) arm(at time.Time) {
	w.lateAt = at
	if w.late == nil {
		w.late = time.AfterFunc(time.Until(at), w.expire)
	} else {
		w.late.Reset(time.Until(at))
	}
}

// expire closes the late channel of every open generation without a first
// line whose deadline has passed, and arms the timer for the next one.
func (w *stallWatch) expire() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var next time.Time
	for g := range w.open {
		if g.answered || g.expired || g.late == nil {
			continue
		}
		if at := g.sent.Add(w.fbt); !at.After(now) {
			g.expired = true
			close(g.late)
		} else if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	w.lateAt = time.Time{}
	if !next.IsZero() {
		w.arm(next)
	}
}

// answered records g's first line (or an error answer): the runtime works.
func (w *stallWatch) answered(g *genTrack) {
	w.mu.Lock()
	g.answered = true
	w.progress++
	cleared := w.stuck
	w.stuck = false
	w.mu.Unlock()
	if cleared {
		w.log.Info("model runtime answers again")
	}
}

// closed records that g's request is closed.
func (w *stallWatch) closed(g *genTrack) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.open[g]; !ok {
		return
	}
	delete(w.open, g)
	if g.answered {
		// Its stream ran until now: lines came meanwhile.
		w.progress++
	}
}

// waited records that g, still open, has had no first line by now, at
// least FirstByteTimeout after it was sent, and applies the rule.
func (w *stallWatch) waited(g *genTrack, now time.Time) {
	if w.fbt <= 0 || now.Sub(g.sent) < w.fbt {
		return
	}
	reason, stuck := w.judge(g, now)
	if !stuck {
		return
	}
	if w.onStuck != nil && w.onStuck(reason) {
		return
	}
	w.mu.Lock()
	was := w.stuck
	w.stuck = true
	w.mu.Unlock()
	if !was {
		w.log.Error("model runtime looks stuck: it takes generations and never starts answering them; "+
			"restart it (e.g. systemctl restart ollama); reporting not ready until it answers again",
			"reason", reason)
	}
}

// judge applies the rule to g at now (see stallWatch).
func (w *stallWatch) judge(g *genTrack, now time.Time) (string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running && w.runProgress != w.progress {
		w.running = false // a line came: the runtime works
	}
	if g.answered || g.progress != w.progress {
		return "", false
	}
	for o := range w.open {
		if o != g && (o.answered || o.seq < g.seq) {
			return "", false
		}
	}
	if !w.running {
		w.running, w.runStart, w.runProgress = true, g.sent, w.progress
	}
	silent := now.Sub(w.runStart)
	if silent < w.after {
		return "", false
	}
	w.running = false
	return fmt.Sprintf("no answer to any generation for %s, with nothing else of ours in front of them (stuck after %s)",
		silent.Round(time.Second), w.after), true
}

// isStuck reports whether the runtime is reported stuck.
func (w *stallWatch) isStuck() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stuck
}

// probeEvery paces the probes of a runtime reported stuck.
const probeEvery = 10 * time.Second

// probe asks the runtime for one token in the background, at most once
// every probeEvery: an answer clears the report (a runtime restarted by its
// operator, or one that was only busy). It returns at once.
func (w *stallWatch) probe(b *Backend) {
	w.mu.Lock()
	now := time.Now()
	if !w.stuck || w.probing || now.Sub(w.probed) < probeEvery {
		w.mu.Unlock()
		return
	}
	w.probing, w.probed = true, now
	w.mu.Unlock()
	go func() {
		wait := w.fbt
		if wait <= 0 {
			wait = time.Minute
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		stream := false
		err := b.api.Generate(ctx, &api.GenerateRequest{
			Model: b.cfg.Model, Prompt: "hi", Stream: &stream, KeepAlive: keepForever,
			Options: map[string]any{"num_predict": 1},
		}, func(api.GenerateResponse) error { return nil })
		var se api.StatusError
		answered := err == nil || errors.As(err, &se)
		w.mu.Lock()
		w.probing = false
		cleared := answered && w.stuck
		if cleared {
			w.stuck = false
		}
		w.mu.Unlock()
		if cleared {
			w.log.Info("model runtime answers again")
		}
	}()
}
