package control

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/store"
)

// FirstSweepDone is closed once Run's first sweep has returned: a test
// counting writes must not count that sweep's, whenever it gets to run.
func FirstSweepDone(s *Server) <-chan struct{} { return s.swept }

// LongPollsWaiting reports how many node long-polls are waiting for a
// change, so tests can make a change only once a poll really waits.
func LongPollsWaiting(s *Server) int { return int(s.waiting.Load()) }

// PoolIndexDrift compares the pool index with what the node records say it
// must hold, returning the keys only in one of them.
func PoolIndexDrift(s *Server) (missing, extra []string, err error) {
	want := map[string]bool{}
	err = store.ScanJSON(s.st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		if k := freeKey(&n); k != "" {
			want[k] = true
		}
		return true, nil
	})
	if err != nil {
		return nil, nil, err
	}
	err = s.st.Scan(pfxFree, "", false, func(key string, _ []byte) (bool, error) {
		if !want[key] {
			extra = append(extra, key)
		}
		delete(want, key)
		return true, nil
	})
	for k := range want {
		missing = append(missing, k)
	}
	return missing, extra, err
}

// StatusIndexDrift compares the status index with the server records,
// returning the keys only in one of them.
func StatusIndexDrift(s *Server) (missing, extra []string, err error) {
	want := map[string]bool{}
	have := map[string]bool{}
	err = s.st.Scan(pfxProjectData, "", false, func(key string, val []byte) (bool, error) {
		_, tail, _ := strings.Cut(key[len(pfxProjectData):], "/")
		switch {
		case strings.HasPrefix(tail, "srvst/"):
			have[key] = true
		case strings.HasPrefix(tail, "srv/"):
			var rec serverRec
			if err := json.Unmarshal(val, &rec); err != nil {
				return false, err
			}
			want[statusKey(rec)] = true
		}
		return true, nil
	})
	for k := range want {
		if !have[k] {
			missing = append(missing, k)
		}
	}
	for k := range have {
		if !want[k] {
			extra = append(extra, k)
		}
	}
	return missing, extra, err
}

// CountWrites makes every commit of s call f until the returned restore.
func CountWrites(s *Server, f func()) (restore func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	orig := s.st
	s.st = countingKV{KV: orig, f: f}
	s.w = s.st
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.st, s.w = orig, orig
	}
}

type countingKV struct {
	store.KV
	f func()
}

func (c countingKV) NewBatch() store.Batch { return countingBatch{Batch: c.KV.NewBatch(), f: c.f} }
func (c countingKV) Put(k string, v any) error {
	c.f()
	return c.KV.Put(k, v)
}
func (c countingKV) Delete(k string) error {
	c.f()
	return c.KV.Delete(k)
}

type countingBatch struct {
	store.Batch
	f func()
}

func (b countingBatch) Commit() error {
	if !b.Empty() {
		b.f()
	}
	return b.Batch.Commit()
}

// TokenKey is the store key of the API token whose secret is token.
func TokenKey(token string) string { return pfxAPIToken + hashSecret(token) }

// SeenPeriodEnd is when the period of node id's seen times that t falls in
// ends (seenSlot), for a control plane with nodeTimeout.
func SeenPeriodEnd(nodeTimeout time.Duration, id string, t time.Time) time.Time {
	every := nodeTimeout / 3
	return time.Unix(0, (seenSlot(every, id, t)+1)*int64(every)-seenOffset(every, id)).UTC()
}

// SeenChunk is how many nodes' seen records one change of the sweep writes.
const SeenChunk = seenChunk

// HoldChangeLock takes s's change lock until the returned release, so a
// test can queue changes behind it.
func HoldChangeLock(s *Server) (release func() error, err error) {
	return s.lock(context.Background())
}

// ReportsQueued is how many node reports wait to be folded into a change.
func ReportsQueued(s *Server) int {
	return s.reports.len()
}

// MaxFold is how many changes one fold takes at most.
const MaxFold = maxFold

// ChangesQueued is how many folded API changes wait for the change lock.
func ChangesQueued(s *Server) int {
	return s.changes.len()
}

// APIChanges is how many changes applying folded API changes s has made.
func APIChanges(s *Server) uint64 { return s.apiChanges.Load() }

// ReportChanges is how many changes applying node reports s has made.
func ReportChanges(s *Server) uint64 { return s.reportChanges.Load() }

// DryRunStatusReads stages server id's record, its status changed to
// status, in a dry run (as a node report is first decided) and returns how
// many reads of s's store that made beyond the dry run's own reader.
func DryRunStatusReads(s *Server, id, status string) (int, error) {
	var rec serverRec
	found := false
	if err := s.eachServer(func(r serverRec) (bool, error) {
		rec, found = r, r.ID == id
		return !found, nil
	}); err != nil || !found {
		return 0, fmt.Errorf("server %s: found %v, %v", id, found, err)
	}
	s.mu.Lock()
	orig := s.st
	reads := 0
	s.st = readCountingKV{KV: orig, n: &reads}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.st = orig
		s.mu.Unlock()
	}()
	m := s.dryRun(orig)
	defer m.discard()
	rec.Status = status
	err := m.put(rec.key(), rec)
	return reads, err
}

type readCountingKV struct {
	store.KV
	n *int
}

func (c readCountingKV) Get(k string, v any) error {
	*c.n++
	return c.KV.Get(k, v)
}

// FoldWithPanic folds three changes behind the change lock: the first
// writes key a, the second writes key b and then panics, the third writes
// key c. It returns each change's error.
func FoldWithPanic(s *Server, a, b, c string) [3]error {
	unlock, err := s.lock(context.Background())
	if err != nil {
		return [3]error{err, err, err}
	}
	put := func(key string, panics bool) apiFunc {
		return func(_ *http.Request, rc *reqCtx) (result, error) {
			if err := rc.mutation().put(key, "x"); err != nil {
				return result{}, err
			}
			if panics {
				panic("injected")
			}
			return result{status: http.StatusNoContent}, nil
		}
	}
	var jobs [3]*changeJob
	var wg sync.WaitGroup
	for i, k := range []string{a, b, c} {
		r, _ := http.NewRequest(http.MethodPost, "/", nil)
		jobs[i] = &changeJob{r: r, rc: &reqCtx{s: s}, h: put(k, i == 1), done: make(chan struct{})}
		wg.Go(func() { s.queueChange(context.Background(), jobs[i]) })
		for ChangesQueued(s) != i+1 {
			time.Sleep(time.Millisecond)
		}
	}
	if err := unlock(); err != nil {
		return [3]error{err, err, err}
	}
	wg.Wait()
	return [3]error{jobs[0].err, jobs[1].err, jobs[2].err}
}

// UsageKeys lists the usage records' keys (period records of every
// project; not the nodes' last numbers).
func UsageKeys(t testing.TB, st store.KV) []string {
	t.Helper()
	var out []string
	if err := st.Scan(pfxUsage, "", false, func(k string, _ []byte) (bool, error) {
		out = append(out, k)
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// AuditPrefix starts every key of the audit log.
const AuditPrefix = pfxAudit
