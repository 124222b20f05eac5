package ollama

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/llm"
)

// slotRuntime is an Ollama with parallel slots, over net.Pipe in a
// synctest bubble. A generation (or an embedding, or a probe) waits for a
// slot (and gives up the wait when its client leaves, as Ollama's does),
// holds it through its prefill even if its client leaves meanwhile
// (Ollama cannot stop reading a prompt), then streams its tokens. A
// generation's user message says what it does: "prefill=<duration>" and
// "stream=<duration>" (a token a second); none means an instant prefill
// and one token. Slots lost (the upstream bug: docs/runtime-wedge.md)
// are held for ever, until restart.
type slotRuntime struct {
	slot chan struct{}  // holds a token per slot taken
	busy sync.WaitGroup // the requests it is still working on
	hc   *http.Client   // dials it (Config.HTTPClient)
	load time.Duration  // a model load (Warm) takes this long

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	lost    int      // slots lost
	probes  []string // "<path>@<time since start>" of each probe
	started time.Time
}

func newSlotRuntime(slots, lost int) *slotRuntime {
	r := &slotRuntime{slot: make(chan struct{}, slots), conns: map[net.Conn]struct{}{}, started: time.Now()}
	r.lose(lost)
	r.hc, _ = pipeRuntime(r.serve)
	return r
}

// lose takes n slots for good.
func (r *slotRuntime) lose(n int) {
	r.mu.Lock()
	r.lost += n
	r.mu.Unlock()
	for range n {
		r.slot <- struct{}{}
	}
}

// recover gives the lost slots back, as if the operator had fixed it.
func (r *slotRuntime) recover() {
	r.mu.Lock()
	n := r.lost
	r.lost = 0
	r.mu.Unlock()
	for range n {
		<-r.slot
	}
}

// restart is a new `ollama serve`: every connection is closed and the lost
// slots come back.
func (r *slotRuntime) restart() {
	r.mu.Lock()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.recover()
}

func (r *slotRuntime) probeLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.probes...)
}

func (r *slotRuntime) serve(c net.Conn) {
	r.busy.Add(1)
	defer r.busy.Done()
	r.mu.Lock()
	r.conns[c] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
	}()
	br := bufio.NewReader(c)
	for {
		if !r.serveOne(c, br) {
			return
		}
	}
}

// serveOne answers one request of the connection; false: the connection is done.
func (r *slotRuntime) serveOne(c net.Conn, br *bufio.Reader) bool {
	req, err := http.ReadRequest(br)
	if err != nil {
		return false
	}
	var body struct {
		Messages *[]struct{ Content string }
		Prompt   string
		Input    json.RawMessage
	}
	err = json.NewDecoder(req.Body).Decode(&body)
	_, _ = io.Copy(io.Discard, req.Body)
	switch {
	case req.URL.Path == "/api/ps":
		writeStatus(c, 200, `{"models":[{"name":"m:latest","model":"m:latest"}]}`, false)
		return true
	case req.URL.Path == "/api/show" || err != nil:
		writeStatus(c, 404, `{"error":"not found"}`, false)
		return true
	case req.URL.Path == "/api/chat" && body.Messages != nil && len(*body.Messages) == 0: // a load
		time.Sleep(r.load)
		writeStatus(c, 200, `{"model":"m","message":{"role":"assistant","content":""},"done":true}`, false)
		return true
	}
	var prefill, stream time.Duration
	if body.Messages != nil && len(*body.Messages) > 0 {
		for f := range strings.FieldsSeq((*body.Messages)[0].Content) {
			k, v, _ := strings.Cut(f, "=")
			d, _ := time.ParseDuration(v)
			switch k {
			case "prefill":
				prefill = d
			case "stream":
				stream = d
			}
		}
	}
	probe := req.URL.Path == "/api/generate" && body.Prompt == "hi"
	if probe {
		r.mu.Lock()
		r.probes = append(r.probes, fmt.Sprintf("%s@%v", req.URL.Path, time.Since(r.started)))
		r.mu.Unlock()
	}
	gone := make(chan struct{})
	go func() {
		_, _ = br.ReadByte() // ends when the client closes
		close(gone)
	}()
	select {
	case r.slot <- struct{}{}:
	case <-gone:
		return false
	}
	defer func() { <-r.slot }()
	time.Sleep(prefill)
	select {
	case <-gone:
		return false
	default:
	}
	switch req.URL.Path {
	case "/api/generate":
		writeWhole(c, `{"model":"m","response":"x","done":true}`)
		return false
	case "/api/embed":
		var in []string
		if json.Unmarshal(body.Input, &in) != nil {
			in = []string{""}
		}
		vecs := strings.TrimSuffix(strings.Repeat("[0.5,0.5],", len(in)), ",")
		writeWhole(c, `{"model":"m","embeddings":[`+vecs+`],"prompt_eval_count":1}`)
		return false
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		return false
	}
	chunk := func(line string) error {
		_, err := fmt.Fprintf(c, "%x\r\n%s\n\r\n", len(line)+1, line)
		return err
	}
	token := `{"message":{"role":"assistant","content":"x"},"done":false}`
	if chunk(token) != nil {
		return false
	}
	for range int(stream / time.Second) {
		time.Sleep(time.Second)
		if chunk(token) != nil {
			return false
		}
	}
	_ = chunk(`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":1}`)
	_, _ = io.WriteString(c, "0\r\n\r\n")
	return false
}

// writeWhole answers 200 with body and closes the connection.
func writeWhole(c net.Conn, body string) { writeStatus(c, 200, body, true) }

func writeStatus(c net.Conn, code int, body string, last bool) {
	conn := "keep-alive"
	if last {
		conn = "close"
	}
	_, _ = fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: %s\r\nContent-Length: %d\r\n\r\n%s",
		code, http.StatusText(code), conn, len(body), body)
}

// wedgeScene runs clients against a backend over a slotRuntime in a
// synctest bubble, through an admission of `admit` slots as hearthd's
// (one fewer than the runtime has: the probe's), and records when the
// backend found the runtime wedged. A supervised scene restarts the
// runtime then (restartTook later), and loads the model again.
type wedgeScene struct {
	t     *testing.T
	b     *Backend
	rt    *slotRuntime
	start time.Time
	admit chan struct{}
	wg    sync.WaitGroup

	mu       sync.Mutex
	wedged   []time.Duration // since start
	answered int             // generations that got their first line
	errs     []error
}

const (
	testWedgeTimeout = 10 * time.Second
	restartTook      = 3 * time.Second
)

func newWedgeScene(t *testing.T, supervised bool, rt *slotRuntime, mods ...func(*Config)) *wedgeScene {
	sc := &wedgeScene{t: t, start: time.Now(), rt: rt, admit: make(chan struct{}, cap(rt.slot)-1)}
	sc.b = newBackend(t, "http://127.0.0.1:1", func(cfg *Config) {
		cfg.HTTPClient = rt.hc
		cfg.FirstByteTimeout = time.Minute
		cfg.WedgeTimeout = testWedgeTimeout
		cfg.OnWedged = func(string) bool {
			// What OnWedged reports (hearthd's node report) is already
			// the wedge.
			if h, _ := sc.b.Health(); h != Degraded {
				t.Errorf("health when OnWedged is called: %v, want degraded", h)
			}
			sc.mu.Lock()
			sc.wedged = append(sc.wedged, time.Since(sc.start))
			sc.mu.Unlock()
			if supervised {
				sc.wg.Go(func() {
					time.Sleep(restartTook)
					rt.restart()
					if _, err := sc.b.Warm(context.Background()); err != nil {
						t.Errorf("Warm after the restart: %v", err)
					}
				})
			}
			return supervised
		}
		for _, mod := range mods {
			mod(cfg)
		}
	})
	return sc
}

// client sends a generation saying what at `at` after the start, once
// admitted, as a deployment API request with a patient client would: it
// waits for the answer (or the 504 at FirstByteTimeout) and reads it to
// the end.
func (sc *wedgeScene) client(at time.Duration, what string) {
	sc.wg.Go(func() {
		time.Sleep(at - time.Since(sc.start))
		sc.admit <- struct{}{}
		s, err := sc.b.Chat(context.Background(), &llm.Request{Messages: userSays(what)})
		var ab llm.Abandoned
		switch {
		case errors.As(err, &ab):
			<-ab.RuntimeDone()
		case err != nil:
			sc.fail(err)
		default:
			sc.mu.Lock()
			sc.answered++
			sc.mu.Unlock()
			if r := collect(s); r.err != nil {
				sc.fail(r.err)
			}
			s.Close()
		}
		<-sc.admit
	})
}

func (sc *wedgeScene) fail(err error) {
	sc.mu.Lock()
	sc.errs = append(sc.errs, err)
	sc.mu.Unlock()
}

// every sends a generation saying what every step from `from` to `to`.
func (sc *wedgeScene) every(from, to, step time.Duration, what string) {
	for at := from; at <= to; at += step {
		sc.client(at, what)
	}
}

func (sc *wedgeScene) wait() (wedged []time.Duration, answered int, errs []error) {
	sc.wg.Wait()
	sc.rt.busy.Wait() // a prompt read after its client left
	synctest.Wait()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.wedged, sc.answered, sc.errs
}

// With every slot lost, a generation in flight finds the runtime wedged
// exactly WedgeTimeout after it was sent: the probe went out halfway and
// got no answer. The supervised runtime is restarted; the generation, cut
// before its first line, is sent again and answered.
func TestWedgeWatchFindsAWedgedRuntime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, true, newSlotRuntime(2, 2))
		sc.client(0, "")
		wedged, answered, errs := sc.wait()
		if fmt.Sprint(wedged) != "[10s]" || answered != 1 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v; want [10s], 1, none", wedged, answered, errs)
		}
		if got := sc.rt.probeLog(); fmt.Sprint(got) != "[/api/generate@5s]" {
			t.Fatalf("probes %v, want one at 5s", got)
		}
		if h, _ := sc.b.Health(); h != Healthy {
			t.Fatalf("health after the restart: %v", h)
		}
	})
}

// While the runtime restarts, generations wait instead of being sent, and
// run once the model is loaded again: the clients who came during the
// wedge and the restart all get their answer, the first 13 s late.
func TestWedgeWatchHoldsRequestsWhileRestarting(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, true, newSlotRuntime(2, 2))
		sc.every(0, 12*time.Second, time.Second, "")
		var readyDuring error
		sc.wg.Go(func() {
			time.Sleep(11 * time.Second)
			readyDuring = sc.b.Ready(context.Background())
		})
		wedged, answered, errs := sc.wait()
		if fmt.Sprint(wedged) != "[10s]" || answered != 13 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v; want [10s], 13, none", wedged, answered, errs)
		}
		if !errors.Is(readyDuring, ErrRestarting) || !errors.Is(readyDuring, llm.ErrUnavailable) {
			t.Fatalf("Ready while restarting = %v", readyDuring)
		}
		if err := sc.b.Ready(context.Background()); err != nil {
			t.Fatalf("Ready after: %v", err)
		}
	})
}

// A restart that does not end in time fails the waiting generations with
// ErrRestarting (a 503 to the client) after their allowance
// (FirstByteTimeout), not later.
func TestWedgeWatchBoundsTheWaitForARestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newSlotRuntime(2, 0)
		b := newBackend(t, "http://127.0.0.1:1", func(cfg *Config) {
			cfg.HTTPClient, cfg.FirstByteTimeout, cfg.WedgeTimeout = rt.hc, time.Minute, testWedgeTimeout
		})
		b.Restarting() // and never back
		start := time.Now()
		_, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("")})
		if !errors.Is(err, ErrRestarting) || !errors.Is(err, llm.ErrUnavailable) || time.Since(start) != time.Minute {
			t.Fatalf("after %v: %v; want ErrRestarting after 1m", time.Since(start), err)
		}
		_, err = b.Embed(context.Background(), &llm.EmbedRequest{Input: []string{"a"}})
		if !errors.Is(err, ErrRestarting) {
			t.Fatalf("embed: %v", err)
		}
		// A caller that leaves stops waiting at once.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := b.Chat(ctx, &llm.Request{Messages: userSays("")}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("caller gone: %v", err)
		}
	})
}

// A stream that runs when the runtime is restarted (it exited, say) ends
// with the runtime's error: it is not sent again, since it had answered.
func TestRestartCutsAStreamThatRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newSlotRuntime(2, 0)
		b := newBackend(t, "http://127.0.0.1:1", func(cfg *Config) {
			cfg.HTTPClient, cfg.FirstByteTimeout, cfg.WedgeTimeout = rt.hc, time.Minute, testWedgeTimeout
		})
		s, err := b.Chat(context.Background(), &llm.Request{Messages: userSays("stream=1m")})
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		b.Restarting()
		rt.restart()
		if r := collect(s); !errors.Is(r.err, llm.ErrUnavailable) {
			t.Fatalf("stream cut by a restart: %v", r.err)
		}
		s.Close()
		rt.busy.Wait()
	})
}

// A long prefill holds the one slot hearthd uses for minutes (within a
// first-byte allowance raised to match): the runtime sends nothing, but
// the probe, on the spare slot, is answered every time. Busy, not wedged.
func TestWedgeWatchSparesALongPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, true, newSlotRuntime(2, 0), func(c *Config) { c.FirstByteTimeout = 10 * time.Minute })
		sc.client(0, "prefill=5m")
		sc.every(time.Second, time.Minute, 10*time.Second, "") // queued in the admission
		wedged, answered, errs := sc.wait()
		if len(wedged) > 0 || answered != 7 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v; want never, 7, none", wedged, answered, errs)
		}
		// A probe every 5 s of silence (each answer ends one): 5 minutes.
		if n := len(sc.rt.probeLog()); n < 50 || n > 61 {
			t.Fatalf("%d probes over a 5-minute prefill", n)
		}
	})
}

// A runtime busy streaming one long generation, with others queued behind
// it, sends bytes: busy, not wedged, and no probe is needed.
func TestWedgeWatchSparesARuntimeThatStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, true, newSlotRuntime(3, 0))
		sc.client(0, "stream=15m")
		sc.every(10*time.Second, 14*time.Minute, 20*time.Second, "prefill=2s")
		wedged, answered, errs := sc.wait()
		if len(wedged) > 0 || answered < 40 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v; want never", wedged, answered, errs)
		}
		if p := sc.rt.probeLog(); len(p) != 0 {
			t.Fatalf("probes of a streaming runtime: %v", p)
		}
	})
}

// A runtime with lost slots and nothing in flight is not judged: nothing
// waits for it. The first generation sent finds it wedged 10 s later.
func TestWedgeWatchJudgesOnlyWhatWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, true, newSlotRuntime(2, 2))
		sc.client(time.Hour, "")
		wedged, answered, errs := sc.wait()
		if fmt.Sprint(wedged) != "[1h0m10s]" || answered != 1 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v", wedged, answered, errs)
		}
		if p := sc.rt.probeLog(); fmt.Sprint(p) != "[/api/generate@1h0m5s]" {
			t.Fatalf("probes %v", p)
		}
	})
}

// A model load of ours takes as long as it takes: a generation waiting
// behind a 40 s load is not a wedge.
func TestWedgeWatchSparesAModelLoad(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rt := newSlotRuntime(2, 0)
		rt.load = 40 * time.Second
		sc := newWedgeScene(t, true, rt)
		sc.wg.Go(func() {
			if _, err := sc.b.Warm(context.Background()); err != nil {
				t.Error(err)
			}
		})
		sc.client(time.Second, "prefill=41s") // its prompt is read after the load
		wedged, answered, errs := sc.wait()
		if len(wedged) > 0 || answered != 1 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v", wedged, answered, errs)
		}
	})
}

// Embeddings are in flight too: one sent to a wedged runtime finds it
// wedged, and is sent again after the restart.
func TestWedgeWatchCountsEmbeddings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, true, newSlotRuntime(2, 2))
		out, err := sc.b.Embed(context.Background(), &llm.EmbedRequest{Input: []string{"a", "b"}})
		if err != nil || len(out.Vectors) != 2 {
			t.Fatalf("embed: %v %+v", err, out)
		}
		wedged, _, _ := sc.wait()
		if fmt.Sprint(wedged) != "[10s]" {
			t.Fatalf("wedged at %v", wedged)
		}
	})
}

// Without a restart (a runtime hearthd does not supervise), a wedged
// runtime is reported: Ready fails with ErrWedged, a probe asks it for a
// token every 5 s, and once it answers (its operator fixed it) Ready is
// itself again.
func TestWedgeWatchReportsAnUnsupervisedRuntime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newWedgeScene(t, false, newSlotRuntime(2, 2))
		sc.client(0, "")
		ctx := context.Background()
		time.Sleep(10*time.Second + time.Millisecond)
		if err := sc.b.Ready(ctx); !errors.Is(err, ErrWedged) || !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("Ready = %v, want ErrWedged", err)
		}
		if h, reason := sc.b.Health(); h != Degraded || !strings.Contains(reason, "no answer") {
			t.Fatalf("health %v (%q)", h, reason)
		}
		time.Sleep(2 * time.Minute)
		if err := sc.b.Ready(ctx); !errors.Is(err, ErrWedged) {
			t.Fatalf("Ready with the slots still lost = %v, want ErrWedged", err)
		}
		sc.rt.recover() // the probes waiting for a slot get theirs
		time.Sleep(time.Second)
		synctest.Wait()
		if err := sc.b.Ready(ctx); err != nil {
			t.Fatalf("Ready after the runtime answered = %v", err)
		}
		wedged, answered, errs := sc.wait()
		// The client's generation had its 504 at a minute, and was closed
		// a minute later (the abandon hold).
		if fmt.Sprint(wedged) != "[10s]" || answered != 0 || len(errs) != 0 {
			t.Fatalf("wedged at %v, answered %d, errors %v", wedged, answered, errs)
		}
	})
}

// Every generation's first-byte deadline closes its late channel, from
// the watch's one timer: in the order they were sent, never for one that
// had its first line, and again after the timer had nothing left to wait
// for.
func TestWatchDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newWatch(time.Minute, 0, nil, slog.New(slog.DiscardHandler))
		isLate := func(g *genTrack) bool {
			select {
			case <-g.late:
				return true
			default:
				return false
			}
		}
		check := func(when string, gs []*genTrack, want ...bool) {
			t.Helper()
			for i, g := range gs {
				if got := isLate(g); got != want[i] {
					t.Errorf("%s: generation %d late %v, want %v", when, i+1, got, want[i])
				}
			}
		}
		g1 := w.sent(time.Now(), nil)
		time.Sleep(30 * time.Second)
		g2 := w.sent(time.Now(), nil)
		time.Sleep(10 * time.Second)
		g3 := w.sent(time.Now(), nil) // t = 40 s
		time.Sleep(5 * time.Second)
		w.answered(g3)
		gs := []*genTrack{g1, g2, g3}
		time.Sleep(14*time.Second + 900*time.Millisecond) // t = 59.9 s
		synctest.Wait()
		check("59.9 s", gs, false, false, false)
		time.Sleep(100 * time.Millisecond) // t = 60 s
		synctest.Wait()
		check("60 s", gs, true, false, false)
		time.Sleep(30 * time.Second) // t = 90 s
		synctest.Wait()
		check("90 s", gs, true, true, false)
		time.Sleep(time.Hour)
		synctest.Wait()
		check("an hour on", gs, true, true, false)
		for _, g := range gs {
			w.closed(g)
		}
		// Sent while the timer waits for nothing.
		g4 := w.sent(time.Now(), nil)
		time.Sleep(time.Minute - time.Millisecond)
		synctest.Wait()
		if isLate(g4) {
			t.Fatal("late before its deadline")
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if !isLate(g4) {
			t.Fatal("not late at its deadline")
		}
		w.closed(g4)
		w.late.Stop()

		// Without a first-byte bound there is no deadline.
		if g := newWatch(0, time.Minute, nil, slog.New(slog.DiscardHandler)).sent(time.Now(), nil); g.late != nil {
			t.Fatal("a deadline without a bound")
		}
	})
}
