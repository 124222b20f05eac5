package control

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
)

// folder queues changes that wait for the change lock so that they are
// applied together: one goroutine at a time (the leader) waits for the lock
// on behalf of every change queued, and once it holds it takes all of them
// into one change — one lock hand-over and one commit instead of one each.
// Changes that must not be decided together (they read what the other
// writes: a node's two reports, two creates of one name) share a key; the
// later waits for the next round, which the same leader runs.
type folder[J any] struct {
	mu      sync.Mutex
	q       []J
	leading bool // a goroutine is waiting for the lock for the queue
}

// add queues j and reports whether the caller leads: it then runs rounds
// while they leave changes queued.
func (f *folder[J]) add(j J) (lead bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.q = append(f.q, j)
	lead = !f.leading
	f.leading = true
	return lead
}

// take empties the queue but for the changes that share a key with one
// taken before, which stay for the next round, and hands the lead on: with none
// left, the next change to arrive leads.
func (f *folder[J]) take(keys func(J) []string) (jobs []J, again bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	taken := make(map[string]bool, len(f.q))
	var rest []J
	for _, j := range f.q {
		ks := keys(j)
		if slices.ContainsFunc(ks, func(k string) bool { return taken[k] }) {
			rest = append(rest, j)
			continue
		}
		for _, k := range ks {
			taken[k] = true
		}
		jobs = append(jobs, j)
	}
	f.q = rest
	f.leading = len(rest) > 0
	return jobs, f.leading
}

// queued is how many changes wait.
func (f *folder[J]) queued() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.q)
}

// mark is how far a change has staged, to tell whether a step staged
// anything.
type mark struct {
	dirty, puts int
	rev         uint64
}

func (m *mutation) mark() mark { return mark{dirty: len(m.dirty), puts: m.puts, rev: m.rev} }

// moved reports whether anything was staged since k.
func (m *mutation) moved(k mark) bool { return m.mark() != k }

// foldRound takes the change lock, applies the jobs taken from f with
// apply and reports whether some were left for another round. settle
// finishes every job taken, with the error of the lock or the commit
// (nil when durable).
func foldRound[J any](ctx context.Context, s *Server, f *folder[J], keys func(J) []string,
	apply func([]J) error, settle func(J, error)) (again bool) {
	unlock, err := s.lock(ctx)
	jobs, again := f.take(keys)
	if err == nil {
		err = apply(jobs)
		if uerr := unlock(); err == nil {
			err = uerr
		}
	}
	for _, j := range jobs {
		settle(j, err)
	}
	return again
}

// changeJob is a management API change on its way into a change with
// others of its kind (apiWarm with a fold key).
type changeJob struct {
	r       *http.Request
	rc      *reqCtx
	tok     tokenRec
	lag     bool
	idemKey string
	reqHash string
	h       apiFunc
	// keys are what two changes decided together must not share.
	keys []string
	// d is the outcome, set before done is closed. dropped marks a job
	// that failed after staging writes: the change was built again
	// without it.
	d       decision
	dropped bool
	done    chan struct{}
}

// queueChange applies j, with the changes queued beside it, and returns
// once its decision is durable or has failed.
func (s *Server) queueChange(ctx context.Context, j *changeJob) {
	for lead := s.changes.add(j); lead; {
		lead = foldRound(ctx, s, &s.changes, func(j *changeJob) []string { return j.keys }, s.foldChanges,
			func(j *changeJob, err error) {
				if err != nil && j.d.ae == nil && j.d.err == nil {
					j.d = decision{err: err}
				}
				close(j.done)
			})
	}
	<-j.done
}

// foldChanges decides jobs in order into one change, with the lock held:
// each sees what the ones before it staged only where it reads through
// the mutation (the pool index: pickNode skips the nodes taken), which is
// why jobs that would read each other's other writes (a name, an
// Idempotency-Key) never share a round. A job refused before it staged
// anything is just answered; one that failed after staging is dropped and
// the change built again without it.
func (s *Server) foldChanges(jobs []*changeJob) error {
	for {
		m := s.begin()
		redo := false
		for _, j := range jobs {
			if j.dropped {
				continue
			}
			j.rc.m = m
			k := m.mark()
			j.d = s.decideSafely(j)
			if (j.d.ae != nil || j.d.err != nil) && m.moved(k) {
				j.dropped, redo = true, true
				break
			}
		}
		switch {
		case redo:
			m.discard()
		case m.empty():
			m.discard()
			return nil
		default:
			s.foldedChanges.Add(1)
			return m.commit()
		}
	}
}

// decideSafely is decide for a job of another request than the leader's:
// a panic fails that job (its answer a 500) rather than the leader's
// request and every job of the round.
func (s *Server) decideSafely(j *changeJob) (d decision) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("handler panic", "request_id", j.rc.requestID, "method", j.r.Method, "path", j.r.URL.Path, "panic", v)
			d = decision{err: fmt.Errorf("handler panic: %v", v)}
			j.dropped = true
		}
	}()
	return s.decide(j.r, j.rc, j.tok, j.lag, j.idemKey, j.reqHash, j.h)
}

// foldKeys returns what a change of a request (its body) must not share
// with another decided in the same change: the records it reads that the
// other may write, other than the pool index.
type foldKeys func(rc *reqCtx, body []byte) []string
