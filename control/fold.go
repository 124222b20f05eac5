package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hearthd/hearth/store"
)

// Creates are folded as reports are (queueReport): every create pays for
// the change lock and a commit, which on a shared database are round trips
// in one chain across the replicas, and the creates a replica has waiting
// take the lock once and commit once. Each is decided on what the creates
// before it in the fold staged, exactly as if they had committed one by
// one: a name they took is taken (mutation.names), a node they took is
// not free (pickNode), and an Idempotency-Key they used replays their
// answer.

// leadQueue holds the jobs waiting for the change lock to be folded, of
// which one at a time leads: it takes the lock for the jobs queued and
// applies them, then hands the lead on.
type leadQueue[J any] struct {
	mu      sync.Mutex
	q       []J
	leading bool
}

// join queues j and reports whether the caller leads (no one else did).
func (l *leadQueue[J]) join(j J) (lead bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.q = append(l.q, j)
	lead = !l.leading
	l.leading = true
	return lead
}

// take removes the jobs pick chooses for a round and hands the lead on:
// with none left, the next job to join leads; again reports that some are
// left, which the leader then takes as well.
func (l *leadQueue[J]) take(pick func(q []J) (jobs, rest []J)) (jobs []J, again bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	jobs, l.q = pick(l.q)
	l.leading = len(l.q) > 0
	return jobs, l.leading
}

// len is how many jobs wait.
func (l *leadQueue[J]) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.q)
}

// maxFold bounds the changes of one fold, so a burst does not make one
// commit (and every answer in it) arbitrarily large.
const maxFold = 64

// changeJob is a folded API change on its way into a change with the
// others that arrived while the lock was busy.
type changeJob struct {
	r                *http.Request
	rc               *reqCtx
	tok              tokenRec
	lag              bool
	idemKey, reqHash string
	h                apiFunc

	// The outcome, set before done is closed: an error (an *apiError is
	// the client's, any other is internal), or the answer: status and
	// body, replayed for an Idempotency-Key already used; kept is the
	// answer a later use of its Idempotency-Key replays.
	err      error
	status   int
	out      []byte
	kept     []byte
	replayed bool
	// stored marks an answer replayed from an earlier change, which the
	// fold's commit does not carry.
	stored bool
	done   chan struct{}
}

// queueChange applies j and returns once it is durable or has failed:
// one goroutine at a time (the leader) takes the change lock for every
// change queued, as queueReport does for reports.
func (s *Server) queueChange(ctx context.Context, j *changeJob) {
	// A leader's own change is in its first round (it found the queue
	// empty). If more than a fold's worth waited, a goroutine of its own
	// leads on, so that this request's answer does not wait for theirs.
	if s.changes.join(j) && s.changeRound(ctx) {
		go func() {
			for s.changeRound(ctx) {
			}
		}()
	}
	<-j.done
}

// changeRound takes the change lock, applies up to maxFold queued changes
// in one change and reports whether more are queued, which the leader
// then takes as well.
func (s *Server) changeRound(ctx context.Context) bool {
	unlock, err := s.lock(ctx)
	jobs, again := s.changes.take(func(q []*changeJob) (jobs, rest []*changeJob) {
		n := min(len(q), maxFold)
		return q[:n:n], append([]*changeJob(nil), q[n:]...)
	})
	if err == nil {
		err = s.foldChanges(jobs)
		if uerr := unlock(); err == nil {
			err = uerr
		}
	}
	for _, j := range jobs {
		if j.err == nil && !j.stored && err != nil {
			j.err = err
		}
		if j.err != nil && j.rc.audit != nil {
			j.rc.audit.staged = false // not committed: written after the answer
		}
		close(j.done)
	}
	return again
}

// foldChanges decides the jobs in one change, with the change lock held,
// and commits it.
func (s *Server) foldChanges(jobs []*changeJob) error {
	// The Idempotency-Keys this build of the fold used (a change built
	// again starts a new one).
	var used map[string]*changeJob
	var usedIn *mutation
	return s.buildFold(len(jobs), &s.apiChanges, func(m *mutation, i int) (failed bool) {
		if usedIn != m {
			used, usedIn = map[string]*changeJob{}, m
		}
		s.decide(jobs[i], m, used)
		return jobs[i].err != nil
	})
}

// buildFold stages n jobs in one change (apply stages job i in m and
// reports whether it failed) and commits it, with the change lock held;
// done counts the changes committed. A job that failed before staging
// anything is just answered so; one that failed after leaves half its
// writes staged: the change is dropped and built again without it.
func (s *Server) buildFold(n int, done *atomic.Uint64, apply func(m *mutation, i int) (failed bool)) error {
	dropped := make([]bool, n)
	for {
		m := s.begin()
		redo := false
		for i := range n {
			if dropped[i] {
				continue
			}
			before := m.staged()
			if apply(m, i) && m.staged() != before {
				dropped[i], redo = true, true
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
			done.Add(1)
			return m.commit()
		}
	}
}

// decide runs j's handler in m, with the change lock held: the framing of
// apiFrame between taking the lock and the commit.
func (s *Server) decide(j *changeJob, m *mutation, used map[string]*changeJob) {
	j.err, j.status, j.out, j.kept, j.replayed, j.stored = nil, 0, nil, nil, false, false
	r, rc := j.r, j.rc
	if j.lag {
		// The token as of the lock: one revoked before it no longer
		// changes anything.
		cur, aerr := s.authenticate(r, false)
		if aerr == nil && (cur.ID != j.tok.ID || cur.Project != j.tok.Project || cur.Scope != j.tok.Scope) {
			aerr = errUnauthorized
		}
		if aerr != nil {
			j.err = aerr
			return
		}
	}
	rc.now = s.now()
	// What an earlier build of the fold staged for it is gone.
	rc.actions, rc.resources = nil, nil
	if rc.audit != nil {
		rc.audit.staged = false
	}
	idemStoreKey := pfxIdempotency + j.tok.ID + "/" + j.idemKey
	if j.idemKey != "" {
		if prev, ok := used[idemStoreKey]; ok {
			if prev.reqHash != j.reqHash {
				j.err = errIdempotencyConflict
				return
			}
			// A copy: writeRaw appends to what it writes, and the earlier
			// create's answer may be the same bytes.
			j.status, j.out, j.replayed = prev.status, slices.Clone(prev.kept), true
			rc.replayed(j.out)
			return
		}
		var prev idempotencyRec
		err := s.st.Get(idemStoreKey, &prev)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			j.err = err
			return
		case !prev.ExpiresAt.After(rc.now):
			// Expired but not yet purged: treat as new.
		case prev.RequestHash != j.reqHash:
			j.err = errIdempotencyConflict
			return
		default:
			j.status, j.out, j.replayed, j.stored = prev.Status, prev.Body, true, true
			rc.replayed(j.out)
			return
		}
	}
	rc.m = m
	res, err := runHandler(j.h, r, rc)
	if err == nil {
		j.out, j.kept, err = s.stageAnswer(r, rc, res, idemStoreKey, j.reqHash, j.idemKey != "")
	}
	if err != nil {
		j.err = err
		return
	}
	j.status = res.status
	if j.idemKey != "" && res.status < 300 {
		used[idemStoreKey] = j
	}
}

// runHandler runs a folded change's handler; a panic is that change's
// failure (the framing's recover would leave the rest of the fold, the
// change lock and the queue's lead with it).
func runHandler(h apiFunc, r *http.Request, rc *reqCtx) (res result, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("handler panic: %v", v)
		}
	}()
	return h(r, rc)
}

// answer writes j's outcome.
func (j *changeJob) answer(w http.ResponseWriter) {
	var ae *apiError
	switch {
	case errors.As(j.err, &ae):
		writeError(w, ae)
	case j.err != nil:
		j.rc.s.internal(w, j.rc, j.err)
	default:
		if j.replayed {
			w.Header().Set("Idempotent-Replayed", "true")
		} else {
			j.rc.setActionHeader(w)
		}
		writeRaw(w, j.status, j.out)
	}
}
