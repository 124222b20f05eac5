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

// slotRuntime is an Ollama with one parallel slot, over net.Pipe in a
// synctest bubble. A generation waits for the slot (and gives up the wait
// when its client leaves, as Ollama's does), holds it through its prefill
// even if its client leaves meanwhile (Ollama cannot stop reading a
// prompt), then streams its tokens. A generation's user message says what
// it does: "prefill=<duration>" and "stream=<duration>" (a token a second);
// none means an instant prefill and one token. With the slot lost
// (ollama/ollama#17131), every generation waits for ever.
type slotRuntime struct {
	slot chan struct{}  // holds a token while the slot is taken
	busy sync.WaitGroup // the requests it is still working on
	hc   *http.Client   // dials it (Config.HTTPClient)
}

func newSlotRuntime(lost bool) *slotRuntime {
	r := &slotRuntime{slot: make(chan struct{}, 1)}
	if lost {
		r.slot <- struct{}{}
	}
	r.hc, _ = pipeRuntime(r.serve)
	return r
}

// recover gives the lost slot back: the runtime was restarted.
func (r *slotRuntime) recover() { <-r.slot }

func (r *slotRuntime) serve(c net.Conn) {
	r.busy.Add(1)
	defer r.busy.Done()
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	if err != nil {
		return
	}
	var body struct {
		Messages []struct{ Content string }
	}
	err = json.NewDecoder(req.Body).Decode(&body)
	_, _ = io.Copy(io.Discard, req.Body)
	if req.URL.Path == "/api/ps" {
		writeWhole(c, `{"models":[{"name":"m:latest","model":"m:latest"}]}`)
		return
	}
	if err != nil {
		return
	}
	var prefill, stream time.Duration
	if len(body.Messages) > 0 {
		for f := range strings.FieldsSeq(body.Messages[0].Content) {
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
	gone := make(chan struct{})
	go func() {
		_, _ = br.ReadByte() // ends when the client closes
		close(gone)
	}()
	select {
	case r.slot <- struct{}{}:
	case <-gone:
		return
	}
	defer func() { <-r.slot }()
	time.Sleep(prefill)
	select {
	case <-gone:
		return
	default:
	}
	if req.URL.Path == "/api/generate" { // a probe
		writeWhole(c, `{"model":"m","response":"x","done":true}`)
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		return
	}
	chunk := func(line string) error {
		_, err := fmt.Fprintf(c, "%x\r\n%s\n\r\n", len(line)+1, line)
		return err
	}
	token := `{"message":{"role":"assistant","content":"x"},"done":false}`
	if chunk(token) != nil {
		return
	}
	for range int(stream / time.Second) {
		time.Sleep(time.Second)
		if chunk(token) != nil {
			return
		}
	}
	_ = chunk(`{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":1,"eval_count":1}`)
	_, _ = io.WriteString(c, "0\r\n\r\n")
}

func writeWhole(c net.Conn, body string) {
	_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// stallScene runs clients against a backend over a slotRuntime in a
// synctest bubble and records when the backend reported the runtime stuck.
type stallScene struct {
	t     *testing.T
	b     *Backend
	rt    *slotRuntime
	start time.Time
	wg    sync.WaitGroup

	mu       sync.Mutex
	stuck    []time.Duration // since start
	answered int             // generations that got their first line
}

// supervised is OnStuck's answer: the runtime is being restarted.
func newStallScene(t *testing.T, supervised, lost bool) *stallScene {
	sc := &stallScene{t: t, start: time.Now(), rt: newSlotRuntime(lost)}
	sc.b = newBackend(t, "http://127.0.0.1:1", func(cfg *Config) {
		cfg.HTTPClient = sc.rt.hc
		cfg.FirstByteTimeout = time.Minute
		cfg.OnStuck = func(string) bool {
			sc.mu.Lock()
			sc.stuck = append(sc.stuck, time.Since(sc.start))
			sc.mu.Unlock()
			return supervised
		}
	})
	return sc
}

// client sends a generation saying what at `at` after the start, as a
// deployment API request with a patient client would: it waits for the
// answer (or the 504 at FirstByteTimeout) and reads it to the end.
func (sc *stallScene) client(at time.Duration, what string) {
	sc.wg.Go(func() {
		time.Sleep(at - time.Since(sc.start))
		s, err := sc.b.Chat(context.Background(), &llm.Request{Messages: userSays(what)})
		var ab llm.Abandoned
		switch {
		case errors.As(err, &ab):
			<-ab.RuntimeDone()
		case err != nil:
			sc.t.Errorf("client at %v: %v", at, err)
		default:
			sc.mu.Lock()
			sc.answered++
			sc.mu.Unlock()
			if r := collect(s); r.err != nil {
				sc.t.Errorf("client at %v: %v", at, r.err)
			}
			s.Close()
		}
	})
}

// every sends a generation saying what every step from `from` to `to`.
func (sc *stallScene) every(from, to, step time.Duration, what string) {
	for at := from; at <= to; at += step {
		sc.client(at, what)
	}
}

func (sc *stallScene) wait() ([]time.Duration, int) {
	sc.wg.Wait()
	sc.rt.busy.Wait() // a prompt read after its client left
	synctest.Wait()
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.stuck, sc.answered
}

// With the slot lost, clients one after the other: the runtime is found
// stuck once the first suspect's send lies stuckAfter (2 × 60 s + the
// 60 s abandon hold) behind a generation that waited for nothing but the
// runtime, and not before. Here: the generation sent at 70 s is closed
// unanswered at 190 s.
func TestStallWatchFindsAStuckRuntime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newStallScene(t, true, true)
		sc.every(0, 140*time.Second, 70*time.Second, "")
		stuck, answered := sc.wait()
		if want := []time.Duration{190 * time.Second}; fmt.Sprint(stuck) != fmt.Sprint(want) || answered != 0 {
			t.Fatalf("stuck at %v (answered %d), want %v", stuck, answered, want)
		}
	})
}

// Under steady traffic on a stuck runtime (a client every 10 s, each
// queued behind the earlier ones) it is found as well: the earlier
// requests close one after the other, and each then waited for nothing
// but the runtime.
func TestStallWatchFindsAStuckRuntimeUnderSteadyTraffic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newStallScene(t, true, true)
		sc.every(0, 5*time.Minute, 10*time.Second, "")
		stuck, _ := sc.wait()
		if len(stuck) == 0 || stuck[0] != 180*time.Second {
			t.Fatalf("stuck at %v, want first at 3m0s", stuck)
		}
	})
}

// A runtime busy streaming one long generation makes every other request
// wait past its 504, for 15 minutes: it is busy, not stuck.
func TestStallWatchSparesARuntimeThatStreams(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newStallScene(t, true, false)
		sc.client(0, "stream=15m")
		sc.every(10*time.Second, 14*time.Minute, 20*time.Second, "")
		stuck, answered := sc.wait()
		if len(stuck) > 0 || answered == 0 {
			t.Fatalf("stuck at %v (answered %d), want never", stuck, answered)
		}
	})
}

// A long prefill of an earlier request (170 s: just under stuckAfter, and
// past both its own 504 and its abandon hold, after which the runtime
// still reads it) holds every later request past its 504: busy, not
// stuck. The requests after it are answered.
func TestStallWatchSparesALongPrefill(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newStallScene(t, true, false)
		sc.client(0, "prefill=170s")
		sc.every(25*time.Second, 6*time.Minute, 25*time.Second, "")
		stuck, answered := sc.wait()
		if len(stuck) > 0 || answered == 0 {
			t.Fatalf("stuck at %v (answered %d), want never", stuck, answered)
		}
	})
}

// A lone request, however long its prompt takes, never makes the rule
// fire: it is closed before stuckAfter.
func TestStallWatchSparesALoneRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newStallScene(t, true, false)
		sc.client(0, "prefill=1h")
		if stuck, _ := sc.wait(); len(stuck) > 0 {
			t.Fatalf("stuck at %v, want never", stuck)
		}
	})
}

// Without OnStuck (a runtime hearthd does not supervise), a stuck runtime
// is reported: Ready fails with ErrStuck, a probe asks it for a token every
// probeEvery, and once it answers (its operator restarted it) Ready is
// itself again.
func TestStallWatchReportsAnUnsupervisedRuntime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sc := newStallScene(t, false, true)
		rt := sc.rt
		sc.every(0, 140*time.Second, 70*time.Second, "")
		if stuck, _ := sc.wait(); fmt.Sprint(stuck) != "[3m10s]" {
			t.Fatalf("stuck at %v, want [3m10s]", stuck)
		}
		ctx := context.Background()
		if err := sc.b.Ready(ctx); !errors.Is(err, ErrStuck) || !errors.Is(err, llm.ErrUnavailable) {
			t.Fatalf("Ready = %v, want ErrStuck", err)
		}
		// The probe just started waits for the lost slot, in vain.
		time.Sleep(2 * time.Minute)
		if err := sc.b.Ready(ctx); !errors.Is(err, ErrStuck) {
			t.Fatalf("Ready with the slot still lost = %v, want ErrStuck", err)
		}
		rt.recover()
		time.Sleep(time.Second)
		synctest.Wait()
		if err := sc.b.Ready(ctx); err != nil {
			t.Fatalf("Ready after the runtime answered its probe = %v", err)
		}
	})
}

// The rule, event by event, with explicit times (FirstByteTimeout 60 s,
// abandon hold 60 s: stuckAfter 3 min).
func TestStallWatchRule(t *testing.T) {
	t0 := time.Unix(1e9, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var fired []string
	w := newStallWatch(time.Minute, time.Minute, func(r string) bool { fired = append(fired, r); return true }, slog.New(slog.DiscardHandler))
	if w.after != 3*time.Minute {
		t.Fatalf("stuckAfter = %v, want 3m", w.after)
	}

	// A generation behind an earlier one of ours that is still open is no
	// suspect: the runtime may be reading the earlier prompt.
	early := w.sent(at(0))
	late := w.sent(at(10 * time.Second))
	w.waited(late, at(4*time.Minute))
	if w.running {
		t.Fatal("a generation queued behind another of ours started a run")
	}
	// Too soon: no event before FirstByteTimeout.
	w.waited(early, at(59*time.Second))
	if w.running {
		t.Fatal("an event before FirstByteTimeout counted")
	}
	w.waited(early, at(time.Minute))
	if !w.running || !w.runStart.Equal(at(0)) {
		t.Fatalf("the oldest silent generation did not start a run at its send")
	}
	w.closed(early)
	w.waited(late, at(179*time.Second))
	if len(fired) != 0 {
		t.Fatalf("fired before stuckAfter: %v", fired)
	}
	w.waited(late, at(180*time.Second))
	if len(fired) != 1 || w.running {
		t.Fatalf("fired %v, running %v: want once, and the run over", fired, w.running)
	}
	w.closed(late)

	// A first line anywhere since a generation was sent clears it of
	// suspicion, and ends a run.
	a := w.sent(at(10 * time.Minute))
	w.waited(a, at(11*time.Minute))
	b := w.sent(at(11 * time.Minute))
	w.answered(b)
	w.waited(a, at(14*time.Minute))
	if w.running || len(fired) != 1 {
		t.Fatal("a run survived a first line")
	}
	w.closed(b)
	w.closed(a)
	if len(w.open) != 0 {
		t.Fatalf("%d generations left open", len(w.open))
	}

	// FirstByteTimeout zero: no bound on a first line, no watch.
	off := newStallWatch(0, time.Minute, func(r string) bool { t.Fatalf("fired without a bound: %s", r); return true }, slog.New(slog.DiscardHandler))
	g := off.sent(at(0))
	off.waited(g, at(time.Hour))
}

// Every generation's first-byte deadline closes its late channel, from
// the watch's one timer: in the order they were sent, never for one that
// had its first line, and again after the timer had nothing left to wait
// for.
func TestStallWatchDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := newStallWatch(time.Minute, time.Minute, nil, slog.New(slog.DiscardHandler))
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
		g1 := w.sent(time.Now())
		time.Sleep(30 * time.Second)
		g2 := w.sent(time.Now())
		time.Sleep(10 * time.Second)
		g3 := w.sent(time.Now()) // t = 40 s
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
		g4 := w.sent(time.Now())
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
		if g := newStallWatch(0, time.Minute, nil, slog.New(slog.DiscardHandler)).sent(time.Now()); g.late != nil {
			t.Fatal("a deadline without a bound")
		}
	})
}
