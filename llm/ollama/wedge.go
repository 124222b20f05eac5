package ollama

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/hearthd/hearth/llm"
)

// Health is the runtime's health as the wedge watch sees it.
type Health int32

const (
	// Healthy: the runtime answers, or has nothing to answer.
	Healthy Health = iota
	// Degraded: the runtime is wedged and hearthd does not restart it.
	// Ready fails with ErrWedged until it answers again (a probe asks it
	// every WedgeTimeout/2).
	Degraded
	// Restarting: the runtime is being restarted. Generations wait for it
	// (at most restartWait) instead of being sent; a successful Warm ends
	// the restart.
	Restarting
)

func (h Health) String() string {
	switch h {
	case Degraded:
		return "degraded"
	case Restarting:
		return "restarting"
	}
	return "healthy"
}

var (
	// ErrWedged marks Ready's answer while the runtime is wedged and not
	// being restarted: it takes requests and answers none.
	ErrWedged = errors.New("model runtime is wedged")
	// ErrRestarting marks Ready's answer while the runtime is being
	// restarted, and the failure of a request that waited for the restart
	// longer than it may.
	ErrRestarting = errors.New("model runtime is restarting")
)

// watch tells a wedged runtime from a busy one, in seconds, and holds
// requests while it is restarted.
//
// # The rule
//
// The runtime is wedged when requests of ours are in flight at it, nothing
// has come back from any of them (not a byte) for timeout, and a one-token
// probe sent timeout/2 into that silence got no answer in the other half.
// Anything that comes back (a byte of any answer, the probe's answer) ends
// the silence; so does having nothing in flight, and a model load of ours
// in progress (Warm, Unload: a load takes as long as it takes).
//
// Why a busy runtime is not taken for wedged: a runtime that streams sends
// bytes. One that reads long prompts on every slot sends nothing, but it
// answers the probe, because the probe has a slot of its own: hearthd sends
// at most as many generations at once as the runtime has parallel slots
// less one (its admission: max_concurrent, with the supervised Ollama
// started with max_concurrent + 1), and the runtime batches the probe's few
// tokens in with the prompts it reads. A probe that gets no slot is the
// symptom: Ollama (0.9.6 to 0.17.4 at least) loses a slot for good when a
// client closes a stream while its handler is between two tokens (see
// docs/runtime-wedge.md), and once every slot is lost it answers nothing,
// while its /api/ps still does.
//
// A wedge is reported to onWedged; when it restarts the runtime (hearthd
// restarts the `ollama serve` it supervises) the watch is Restarting until
// Warm succeeds, and generations wait for that instead of being sent; one
// that was cut by the restart before its first line is sent again. When
// nobody restarts it the watch is Degraded and Ready fails until the
// runtime answers again.
type watch struct {
	fbt      time.Duration // FirstByteTimeout: each generation's first-line deadline; 0: none
	timeout  time.Duration // WedgeTimeout; 0: no wedge watch
	onWedged func(reason string) (restarting bool)
	log      *slog.Logger

	// seen is set when a byte comes back from the runtime: the readers'
	// one cost, a load and, once per check step at most, a store. The
	// check takes it back.
	seen atomic.Bool

	mu       sync.Mutex
	open     map[*genTrack]struct{} // generations sent and not closed
	calls    int                    // other requests in flight (embeddings)
	quiet    time.Time              // since when nothing came back while busy
	silence  uint64                 // counts the silences (each progress starts one)
	loading  int                    // model loads of ours in progress
	health   Health
	reason   string        // why it was last found wedged
	epoch    uint64        // restarts begun; a generation cut by one is sent again
	up       chan struct{} // closed unless Restarting
	checking bool          // the check timer is armed
	check    *time.Timer
	prober   *Backend // the backend the probe asks: the last one a request went to
	probing  bool
	probed   time.Time // when the last probe was sent
	probedIn uint64    // in which silence
	embedOK  bool      // the model embeds but does not generate: the probe embeds
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
	sent     time.Time
	answered bool // the runtime sent its first line (or an error answer)
	// late is closed once FirstByteTimeout has passed since sent without
	// a first line (nil without the bound); expired then, under the
	// watch's mu.
	late    chan struct{}
	expired bool
}

func newWatch(fbt, timeout time.Duration, onWedged func(string) bool, log *slog.Logger) *watch {
	up := make(chan struct{})
	close(up)
	return &watch{fbt: fbt, timeout: timeout, onWedged: onWedged, log: log, up: up,
		open: make(map[*genTrack]struct{})}
}

// step is how often the rule is checked while requests are in flight.
func (w *watch) step() time.Duration { return max(w.timeout/10, 10*time.Millisecond) }

// busy reports whether requests of ours are in flight. Under mu.
func (w *watch) busy() bool { return len(w.open)+w.calls > 0 }

// begin notes a request sent to the runtime through b at now. Under mu.
func (w *watch) begin(now time.Time, b *Backend) {
	if !w.busy() {
		w.quiet = now // a silence starts no earlier than the first request
		w.silence++
	}
	w.prober = b
	w.arm(now)
}

// arm starts the check timer if the watch is on and it is not running.
// Under mu.
func (w *watch) arm(time.Time) {
	if w.timeout <= 0 || w.checking {
		return
	}
	w.checking = true
	if w.check == nil {
		w.check = time.AfterFunc(w.step(), w.tick)
	} else {
		w.check.Reset(w.step())
	}
}

// sent registers a generation sent through b at now.
func (w *watch) sent(now time.Time, b *Backend) *genTrack {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.begin(now, b)
	g := &genTrack{sent: now}
	w.open[g] = struct{}{}
	if w.fbt > 0 {
		g.late = make(chan struct{})
		if at := now.Add(w.fbt); w.lateAt.IsZero() || at.Before(w.lateAt) {
			w.armLate(at)
		}
	}
	return g
}

// armLate has expire run at at. Under mu.
func (w *watch) armLate(at time.Time) {
	w.lateAt = at
	if w.late == nil {
		w.late = time.AfterFunc(time.Until(at), w.expire)
	} else {
		w.late.Reset(time.Until(at))
	}
}

// expire closes the late channel of every open generation without a first
// line whose deadline has passed, and arms the timer for the next one.
func (w *watch) expire() {
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
		w.armLate(next)
	}
}

// answered records g's first line (or an error answer).
func (w *watch) answered(g *genTrack) {
	w.mu.Lock()
	g.answered = true
	w.mu.Unlock()
	w.note()
}

// closed records that g's request is closed.
func (w *watch) closed(g *genTrack) {
	w.mu.Lock()
	delete(w.open, g)
	w.mu.Unlock()
}

// note records that something came back from the runtime.
func (w *watch) note() {
	if !w.seen.Load() {
		w.seen.Store(true)
	}
}

// body is an answer's body that notes every read that brings bytes.
func (w *watch) body(rc io.ReadCloser) io.ReadCloser { return &notingBody{rc, w} }

type notingBody struct {
	io.ReadCloser
	w *watch
}

func (n *notingBody) Read(p []byte) (int, error) {
	k, err := n.ReadCloser.Read(p)
	if k > 0 {
		n.w.note()
	}
	return k, err
}

// call registers a request other than a generation (an embedding) sent
// through b; done ends it.
func (w *watch) call(b *Backend) (done func()) {
	w.mu.Lock()
	w.begin(time.Now(), b)
	w.calls++
	w.mu.Unlock()
	return func() {
		w.mu.Lock()
		w.calls--
		w.mu.Unlock()
	}
}

// loadBegin and loadEnd bracket a model load of ours (Warm, Unload): no
// judgment meanwhile. A successful Warm ends a restart.
func (w *watch) loadBegin() {
	w.mu.Lock()
	w.loading++
	w.mu.Unlock()
}

func (w *watch) loadEnd(warmed bool) {
	w.mu.Lock()
	w.loading--
	w.quiet = time.Now()
	w.silence++
	back := warmed && w.health == Restarting
	if back {
		w.health = Healthy
		close(w.up)
	}
	w.mu.Unlock()
	if back {
		w.log.Debug("model runtime restarted and the model loaded: serving again")
	}
}

// progress ends a silence at now. Under mu; it reports whether a Degraded
// runtime came back.
func (w *watch) progress(now time.Time) (back bool) {
	w.quiet = now
	w.silence++
	if w.health == Degraded {
		w.health = Healthy
		return true
	}
	return false
}

// tick applies the rule, every step while anything is in flight, the
// runtime is Degraded or a probe runs.
func (w *watch) tick() {
	now := time.Now()
	w.mu.Lock()
	back := w.seen.Swap(false) && w.progress(now)
	var reason string
	switch {
	case w.health == Restarting:
		// The restart ends with a Warm; nothing to judge meanwhile.
	case w.health == Degraded:
		if !w.probing && now.Sub(w.probed) >= w.timeout/2 {
			w.startProbe(now)
		}
	case !w.busy() || w.loading > 0:
		w.quiet = now
		w.silence++
	default:
		silent := now.Sub(w.quiet)
		probedNow := w.probedIn == w.silence // a probe was sent in this silence
		switch {
		case silent >= w.timeout && probedNow && now.Sub(w.probed) >= w.timeout/2:
			reason = fmt.Sprintf("nothing came back from %d request(s) in flight for %s, and a one-token probe got no answer in %s",
				len(w.open)+w.calls, silent.Round(w.step()), now.Sub(w.probed).Round(w.step()))
		case silent >= w.timeout/2 && !w.probing && !probedNow:
			w.startProbe(now)
		}
	}
	if w.health == Degraded || w.busy() || w.probing {
		w.check.Reset(w.step())
	} else {
		w.checking = false
	}
	w.mu.Unlock()
	if back {
		w.log.Info("model runtime answers again")
	}
	if reason != "" {
		w.wedged(reason)
	}
}

// wedged acts on a wedge found for reason: a restart if onWedged starts
// one, else the Degraded report.
func (w *watch) wedged(reason string) {
	w.mu.Lock()
	if w.health != Healthy {
		w.mu.Unlock()
		return
	}
	// Degraded until onWedged says the runtime is restarted: onWedged may
	// have the state reported at once, and must see it so.
	w.reason, w.health = reason, Degraded
	w.arm(time.Now())
	w.mu.Unlock()
	if w.onWedged != nil && w.onWedged(reason) {
		w.mu.Lock()
		if w.health == Degraded { // onWedged did not call Restarting itself
			w.restarting()
		}
		w.mu.Unlock()
		return
	}
	if w.onWedged == nil { // otherwise its owner logs it
		w.log.Error("model runtime is wedged: it takes requests and answers none; restart it (e.g. systemctl restart ollama); "+
			"reporting not ready until it answers again", "reason", reason)
	}
}

// restarting enters Restarting: requests wait for Warm. Under mu.
func (w *watch) restarting() {
	w.epoch++
	if w.health != Restarting {
		w.health = Restarting
		w.up = make(chan struct{})
	}
}

// startProbe asks the runtime for one token in the background. Under mu.
func (w *watch) startProbe(now time.Time) {
	b := w.prober
	if b == nil {
		return
	}
	w.probing, w.probed, w.probedIn = true, now, w.silence
	embed := w.embedOK
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
		defer cancel()
		answered, embeds := b.probe(ctx, embed)
		w.mu.Lock()
		w.probing = false
		w.embedOK = w.embedOK || embeds
		back := answered && w.progress(time.Now())
		w.mu.Unlock()
		if back {
			w.log.Info("model runtime answers again")
		}
	}()
}

// probe asks for one token (or, for a model that only embeds, one
// embedding) and reports whether the runtime answered at all, and whether
// the model turned out to embed only.
func (b *Backend) probe(ctx context.Context, embed bool) (answered, embedOnly bool) {
	if !embed {
		stream := false
		err := b.api.Generate(ctx, &api.GenerateRequest{
			Model: b.cfg.Model, Prompt: "hi", Stream: &stream, KeepAlive: keepForever,
			Options: map[string]any{"num_predict": 1},
		}, func(api.GenerateResponse) error { return nil })
		var se api.StatusError
		if err == nil || !errors.As(err, &se) {
			return err == nil, false
		}
		if se.StatusCode != http.StatusBadRequest {
			return true, false
		}
		// A model that cannot generate (an embedding model): its slot is
		// probed with an embedding.
	}
	_, err := b.api.Embed(ctx, &api.EmbedRequest{Model: b.cfg.Model, Input: "hi", KeepAlive: keepForever})
	var se api.StatusError
	return err == nil || errors.As(err, &se), true
}

// state returns the health and why the runtime was last found wedged.
func (w *watch) state() (Health, string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.health, w.reason
}

// waitUp waits while the runtime restarts, until deadline; it returns the
// restart epoch the request is sent in.
func (w *watch) waitUp(ctx context.Context, deadline time.Time) (uint64, error) {
	for {
		w.mu.Lock()
		h, up, epoch := w.health, w.up, w.epoch
		w.mu.Unlock()
		if h != Restarting {
			return epoch, nil
		}
		t := time.NewTimer(time.Until(deadline))
		select {
		case <-up:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return 0, fmt.Errorf("ollama: waiting for the runtime's restart: %w", ctx.Err())
		case <-t.C:
			return 0, fmt.Errorf("%w: %w: it did not come back within %s", llm.ErrUnavailable, ErrRestarting, w.restartWait())
		}
	}
}

// restartWait bounds how long a request waits for a restart: its
// allowance for a first answer (FirstByteTimeout), or a minute.
func (w *watch) restartWait() time.Duration {
	if w.fbt > 0 {
		return w.fbt
	}
	return time.Minute
}

// cut reports whether a request sent in epoch that failed with err before
// its first answer was cut by a restart: then it is sent again.
func (w *watch) cut(err error, epoch uint64) bool {
	var ab llm.Abandoned
	if !errors.Is(err, llm.ErrUnavailable) || errors.As(err, &ab) {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.epoch != epoch
}

// maxResends bounds how often one request is sent again after restarts.
const maxResends = 2

// generation sends a generation (generate), waiting while the runtime
// restarts, and sends it again if a restart cut it before its first line:
// it changed nothing then.
func (b *Backend) generation(ctx context.Context, url string, body []byte) (llm.Stream, error) {
	deadline := time.Now().Add(b.watch.restartWait())
	for sends := 0; ; sends++ {
		epoch, err := b.watch.waitUp(ctx, deadline)
		if err != nil {
			return nil, err
		}
		st, err := b.generate(ctx, url, body)
		if err == nil || sends == maxResends || ctx.Err() != nil || !b.watch.cut(err, epoch) {
			return st, err
		}
		b.log.Info("generation cut by the runtime's restart before its first answer; sending it again", "runtime", b.base)
	}
}

// Health is the runtime's health as the wedge watch sees it, and why it
// was last found wedged.
func (b *Backend) Health() (Health, string) { return b.watch.state() }

// Restarting tells the backend that the runtime is being restarted (it
// exited, or hearthd restarts it): generations wait for the restart (until
// a Warm succeeds) instead of being sent, and those it cuts before their
// first answer are sent again.
func (b *Backend) Restarting() {
	b.watch.mu.Lock()
	b.watch.restarting()
	b.watch.mu.Unlock()
}
