package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/hearthd/hearth/store"
)

// Sweep makes the time-driven changes; Run calls it every SweepInterval:
//
//   - provisioning or updating for ProvisionTimeout → failed;
//   - a server whose node has been silent for NodeTimeout → unreachable,
//     and back to its status once the node is heard from;
//   - deleting for DeleteTimeout without the node's wipe → the record goes
//     and the node is held out of the pool until it reports the wipe;
//   - API keys that expired leave their node's desired state;
//   - expired Idempotency-Key answers are purged, and nodes' last-seen
//     and API tokens' last-used times persisted.
//
// It walks every server and node: O(fleet) per sweep, never per request.
func (s *Server) Sweep() error {
	// Which servers a timeout applies to is found without the change lock,
	// from reads that may lag a moment: the walk is O(fleet), and every
	// change would wait for it under the lock. Only the servers found are
	// decided again under the lock.
	now := s.now()
	due, err := s.serversDue(now)
	if err != nil {
		return err
	}
	if err := s.persistSeenChunks(); err != nil {
		return err
	}
	// So are the expired Idempotency-Key answers (O(keys)) and whether an
	// API key expired: a sweep that has nothing to change does not take
	// the lock at all (on a shared database a round trip every change
	// would wait behind, every SweepInterval, on every replica).
	lag := store.Lagging(s.st)
	stale, err := idempotencyExpired(lag, now)
	if err != nil {
		return err
	}
	expiring, err := keysExpiring(lag, now)
	if err != nil {
		return err
	}
	// Usage records past their retention, looked for once an hour (until
	// a look finds fewer than a change deletes).
	var oldUsage []string
	if last := s.usageChecked.Load(); last == 0 || now.Sub(time.Unix(0, last)) >= usageRetentionEvery {
		if oldUsage, err = s.usageExpired(lag, now); err != nil {
			return err
		}
		if len(oldUsage) < maxUsagePurge {
			s.usageChecked.Store(now.UnixNano())
		}
	}
	s.tokMu.Lock()
	used := len(s.tokUsed) > 0
	s.tokMu.Unlock()
	if len(due) == 0 && len(stale) == 0 && !expiring && !used && len(oldUsage) == 0 {
		return nil
	}
	unlock, err := s.lock(context.Background())
	if err != nil {
		return err
	}
	if err := s.sweepLocked(due, stale, oldUsage); err != nil {
		_ = unlock()
		return err
	}
	return unlock()
}

// sweepLocked is Sweep with the change lock held, for the servers due, the
// Idempotency-Key records found expired and the usage records past their
// retention.
func (s *Server) sweepLocked(due []serverRec, stale, oldUsage []string) error {
	now := s.now()
	m := s.begin()
	dirty := false
	sweepDue := func(m *mutation, now time.Time) (bool, error) {
		dirty := false
		err := s.sweepServers(m, now, due, func(serverRec) { dirty = true })
		return dirty, err
	}
	purge := func(m *mutation, now time.Time) (bool, error) { return purgeIdempotency(m, now, stale) }
	purgeOld := func(m *mutation, _ time.Time) (bool, error) { return purgeUsage(m, oldUsage), nil }
	for _, step := range []func(*mutation, time.Time) (bool, error){
		s.persistTokenUse, sweepDue, s.expireAPIKeys, purge, purgeOld,
	} {
		d, err := step(m, now)
		if err != nil {
			m.discard()
			return err
		}
		dirty = dirty || d
	}
	if !dirty {
		m.discard()
		return nil
	}
	return m.commit()
}

// seenChunk bounds the seen records one change of the sweep writes. After
// a mass enrolment or a restart thousands of nodes are due at once, and one
// change writing them all held every other change up for 100 ms and more
// (building the batch under the lock, then the database applying it before
// the next lock); in chunks, the changes waiting go in between.
const seenChunk = 256

// persistSeenChunks persists every node's due seen times (persistLastSeen),
// seenChunk nodes per change. Each chunk is chosen, and on a shared
// database its stored records read into the read cache, before the lock:
// read under it, 256 records from the database held every change up for
// 10–35 ms per chunk, dozens of chunks after a mass enrolment.
func (s *Server) persistSeenChunks() error {
	for {
		s.seenMu.Lock()
		cand := s.seenCandidates(s.seenDue(s.now()), seenChunk+1)
		s.seenMu.Unlock()
		if len(cand) == 0 {
			return nil // without taking the lock
		}
		ids := slices.Sorted(maps.Keys(cand))
		more := len(ids) > seenChunk
		ids = ids[:min(len(ids), seenChunk)]
		if s.shared != nil {
			_, _ = loadSeen(s.st, ids) // warms the cache; the read under the lock decides
		}
		unlock, err := s.lock(context.Background())
		if err != nil {
			return err
		}
		m := s.begin()
		dirty, err := s.persistLastSeen(m, s.now(), ids)
		switch {
		case err != nil:
			m.discard()
		case dirty:
			err = m.commit()
		default:
			m.discard()
		}
		if uerr := unlock(); err == nil {
			err = uerr
		}
		if err != nil || !more {
			return err
		}
	}
}

// persistLastSeen writes the last-seen and report times node requests
// noted in memory for the nodes ids, as their seen records (seenRec). A
// time is written once it is seenEvery newer than the stored one, or once
// the node has been quiet for seenEvery since: a node that keeps talking is written
// every seenEvery rather than at every sweep (at 10 000 nodes, thousands
// of records per sweep, each holding every change up while committed), and
// the stored times lag by at most seenEvery and a sweep — well inside
// NodeTimeout, which a node talking at least every long-poll never nears.
// Until written, the times stay in memory, where this process's sweep and
// answers see them.
func (s *Server) persistLastSeen(m *mutation, now time.Time, ids []string) (dirty bool, _ error) {
	due := s.seenDue(now)
	seen, reported := make(map[string]time.Time, len(ids)), make(map[string]time.Time, len(ids))
	s.seenMu.Lock()
	for _, id := range ids {
		if t, ok := s.lastSeen[id]; ok {
			seen[id] = t
		}
		if t, ok := s.reported[id]; ok {
			reported[id] = t
		}
	}
	s.seenMu.Unlock()
	// Another replica may have stored newer times: they are kept.
	stored, err := loadSeen(m.r, ids)
	if err != nil {
		return false, err
	}
	m.seen = stored
	for _, id := range ids {
		sr, changed := stored[id], false
		if t, ok := seen[id]; ok && due(id, t, sr.LastSeen) {
			sr.LastSeen, changed = t, true
		}
		if t, ok := reported[id]; ok && due(id, t, sr.ObservedAt) {
			sr.ObservedAt, changed = t, true
		}
		if changed {
			if err := m.put(pfxNodeSeen+id, sr); err != nil {
				return false, err
			}
			stored[id], dirty = sr, true
		}
	}
	// Forget the times now stored, unless newer came since.
	s.seenMu.Lock()
	for _, id := range ids {
		sr := stored[id]
		s.persisted[id] = sr
		if t, ok := s.lastSeen[id]; ok && !t.After(sr.LastSeen) {
			delete(s.lastSeen, id)
		}
		if t, ok := s.reported[id]; ok && !t.After(sr.ObservedAt) {
			delete(s.reported, id)
		}
	}
	s.seenMu.Unlock()
	return dirty, nil
}

// seenDue tells whether a time noted in memory (t) for node id is due to
// be written over the stored one: t is in a later period of the node's
// (seenSlot) than the stored time, or the node has been quiet for a period.
// Either way a stored time lags the node's last request by at most a
// period (NodeTimeout/3) and a sweep.
func (s *Server) seenDue(now time.Time) func(id string, t, stored time.Time) bool {
	every := s.cfg.NodeTimeout / 3
	return func(id string, t, stored time.Time) bool {
		return t.After(stored) && (seenSlot(every, id, t) != seenSlot(every, id, stored) || now.Sub(t) >= every)
	}
}

// seenSlot is the period of length every that time x falls in, for node
// id: the periods of each node begin at an offset of its own. Nodes that
// enrolled (or reconnected after a restart) together would otherwise stay
// in step and have their times written all in the same sweep, every
// period (10 000 records in a burst of chunks that every change waits
// between); offset, each sweep writes its share of them.
func seenSlot(every time.Duration, id string, x time.Time) int64 {
	if every <= 0 {
		return x.UnixNano()
	}
	return (x.UnixNano() + seenOffset(every, id)) / int64(every)
}

// seenOffset is where node id's periods begin, in [0, every).
func seenOffset(every time.Duration, id string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(id))
	return int64(h.Sum64() % uint64(every))
}

// seenCandidates returns the nodes with a time due, at most limit of them
// (0: all), with s.seenMu held. They are chosen against what this process
// last knew to be stored, without reading anything: at 10 000 nodes nearly
// every node has a time waiting, and only a few are due.
func (s *Server) seenCandidates(due func(id string, t, stored time.Time) bool, limit int) map[string]bool {
	cand := map[string]bool{}
	full := func() bool { return limit > 0 && len(cand) >= limit }
	for id, t := range s.lastSeen {
		if full() {
			return cand
		}
		if due(id, t, s.persisted[id].LastSeen) {
			cand[id] = true
		}
	}
	for id, t := range s.reported {
		if full() {
			return cand
		}
		if due(id, t, s.persisted[id].ObservedAt) {
			cand[id] = true
		}
	}
	return cand
}

// loadSeen reads the seen records of ids through rd, in one read.
func loadSeen(rd store.KV, ids []string) (map[string]seenRec, error) {
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = pfxNodeSeen + id
	}
	out := make(map[string]seenRec, len(ids))
	err := store.GetMany(rd, keys, func(key string, val []byte) error {
		var sr seenRec
		if err := json.Unmarshal(val, &sr); err != nil {
			return fmt.Errorf("decode %s: %w", key, err)
		}
		out[key[len(pfxNodeSeen):]] = sr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("load seen records: %w", err)
	}
	return out, nil
}

// serversDue walks every server, without the change lock and through
// reads that may lag, and returns those whose timeouts would change them
// now (sweepServer tried on a dry run).
func (s *Server) serversDue(now time.Time) ([]serverRec, error) {
	var all []serverRec
	err := s.eachServer(func(srv serverRec) (bool, error) {
		all = append(all, srv)
		return true, nil
	})
	if err != nil {
		return nil, err
	}
	s.seenMu.Lock() // not over the walk's reads: every node request takes it
	all = slices.DeleteFunc(all, func(srv serverRec) bool { return !s.mayBeDue(srv, now) })
	s.seenMu.Unlock()
	if len(all) == 0 {
		return nil, nil
	}
	dry := s.dryRun(store.Lagging(s.st))
	defer dry.discard()
	var due []serverRec
	err = s.sweepServers(dry, now, all, func(srv serverRec) { due = append(due, srv) })
	return due, err
}

// mayBeDue tells, from srv alone and the seen times this process holds in
// memory (s.seenMu held), whether sweepServer might change srv now. Most
// servers are running on a node heard from a moment ago: those need none
// of their node's records read (a node record, its seen record, each
// decoded), which at 10 000 servers was most of every sweep's work. What
// memory cannot rule out is decided as before.
func (s *Server) mayBeDue(srv serverRec, now time.Time) bool {
	switch lc := srv.lifecycle(); {
	case srv.Status == StatusDeleting:
		return now.Sub(srv.since()) >= s.cfg.DeleteTimeout
	case srv.Status == StatusUnreachable:
		return true // back to its status once its node is heard from
	case (lc == StatusProvisioning || lc == StatusUpdating) && now.Sub(srv.since()) >= s.cfg.ProvisionTimeout:
		return true
	case actionsDue(srv, s.cfg.ProvisionTimeout, now):
		return true
	}
	// The node record's own time can only be newer than these: heard
	// recently by what memory holds is heard recently.
	for _, t := range []time.Time{s.lastSeen[srv.NodeID], s.persisted[srv.NodeID].LastSeen, s.started} {
		if now.Sub(t) < s.cfg.NodeTimeout {
			return false
		}
	}
	return true
}

// sweepServers applies the timeouts of servers in m, each server and
// node as m reads them with their latest seen times, and calls changed
// with each server it changes.
func (s *Server) sweepServers(m *mutation, now time.Time, servers []serverRec, changed func(serverRec)) error {
	ids := make([]string, len(servers))
	for i, srv := range servers {
		ids[i] = srv.NodeID
	}
	if err := m.loadNodes(ids); err != nil {
		return err
	}
	var missing []string
	for _, id := range ids {
		if _, ok := m.seen[id]; !ok {
			missing = append(missing, id)
		}
	}
	seen, err := loadSeen(m.r, missing)
	if err != nil {
		return err
	}
	for id, sr := range m.seen { // persisted in this change
		seen[id] = sr
	}
	s.seenMu.Lock()
	for id, t := range s.lastSeen { // noted since the last persist
		if sr := seen[id]; t.After(sr.LastSeen) {
			sr.LastSeen = t
			seen[id] = sr
		}
	}
	s.seenMu.Unlock()
	for _, srv := range servers {
		if !m.dry { // the walk may have lagged: decide on the record as it is
			if err := m.r.Get(srv.key(), &srv); errors.Is(err, store.ErrNotFound) {
				continue
			} else if err != nil {
				return fmt.Errorf("load server %s: %w", srv.ID, err)
			}
		}
		n, err := m.node(srv.NodeID)
		if err != nil {
			return err
		}
		n.overlay(seen[n.ID])
		ok, err := s.sweepServer(m, srv, n, now)
		if err != nil {
			return err
		}
		if ok {
			changed(srv)
		}
	}
	return nil
}

// sweepServer applies one server's timeouts.
func (s *Server) sweepServer(m *mutation, srv serverRec, n *nodeRec, now time.Time) (bool, error) {
	if srv.Status == StatusDeleting {
		if now.Sub(srv.since()) < s.cfg.DeleteTimeout {
			return false, nil
		}
		if err := s.removeServer(m, srv, now); err != nil {
			return false, err
		}
		n.ServerID, n.ServerProject, n.WipePending = "", "", true
		if err := m.bump(n.ID); err != nil {
			return false, err
		}
		m.logWarn("server removed without its node's wipe; the node stays out of the pool until it reports the wipe",
			"server", srv.ID, "node", n.ID, "timeout", s.cfg.DeleteTimeout)
		return true, nil
	}
	changed := false
	if lc := srv.lifecycle(); (lc == StatusProvisioning || lc == StatusUpdating) && now.Sub(srv.since()) >= s.cfg.ProvisionTimeout {
		srv.setLifecycle(StatusFailed, now)
		changed = true
		m.logWarn("server did not converge in time", "server", srv.ID, "node", srv.NodeID, "was", lc, "timeout", s.cfg.ProvisionTimeout)
		msg := fmt.Sprintf("the server did not run within %s", s.cfg.ProvisionTimeout)
		if n.Observed != nil && n.Observed.RuntimeError != "" {
			msg += ": " + n.Observed.RuntimeError
		}
		if err := m.failStatusActions(&srv, msg, now); err != nil {
			return false, err
		}
	}
	if timedOut, err := m.timeoutActions(&srv, s.cfg.ProvisionTimeout, now); err != nil {
		return false, err
	} else if timedOut {
		changed = true
	}
	// Time the control plane was down does not count against the node.
	heard := n.LastSeen
	if heard.Before(s.started) {
		heard = s.started
	}
	silent := now.Sub(heard) >= s.cfg.NodeTimeout
	switch {
	case silent && srv.Status != StatusUnreachable:
		srv.PrevStatus, srv.Status, changed = srv.Status, StatusUnreachable, true
		m.logWarn("server's node is silent", "server", srv.ID, "node", n.ID, "last_seen", n.LastSeen)
	case !silent && srv.Status == StatusUnreachable:
		srv.restore()
		changed = true
		m.logInfo("server's node is heard from again", "server", srv.ID, "node", n.ID, "status", srv.Status)
	}
	if !changed {
		return false, nil
	}
	srv.UpdatedAt = now
	return true, m.put(srv.key(), srv)
}

func purgeIdempotency(m *mutation, now time.Time, keys []string) (bool, error) {
	dirty := false
	// Read again under the lock: a key answered anew since is kept.
	err := store.GetMany(m.r, keys, func(key string, val []byte) error {
		var rec idempotencyRec
		if err := json.Unmarshal(val, &rec); err != nil {
			return fmt.Errorf("decode %s: %w", key, err)
		}
		if !rec.ExpiresAt.After(now) {
			m.b.Delete(key)
			dirty = true
		}
		return nil
	})
	return dirty, err
}

// maxPurge bounds the Idempotency-Key records one sweep deletes, so that
// its change stays small; the rest go at the next sweeps.
const maxPurge = 1024

// idempotencyExpired finds, through rd (without the change lock), the
// Idempotency-Key records expired by now, at most maxPurge.
func idempotencyExpired(rd store.KV, now time.Time) ([]string, error) {
	var keys []string
	err := store.ScanJSON(rd, pfxIdempotency, func(key string, rec idempotencyRec) (bool, error) {
		if !rec.ExpiresAt.After(now) {
			keys = append(keys, key)
		}
		return len(keys) < maxPurge, nil
	})
	return keys, err
}

// eachServer calls fn with every server of every project, project by
// project: O(fleet), for the sweep and metrics, never a request.
func (s *Server) eachServer(fn func(serverRec) (bool, error)) error {
	stopped := false
	return store.ScanJSON(s.st, pfxProject, func(_ string, p projectRec) (bool, error) {
		err := store.ScanJSON(s.st, keysOf(p.ID).servers(), func(_ string, srv serverRec) (bool, error) {
			more, err := fn(srv)
			stopped = !more
			return more, err
		})
		return err == nil && !stopped, err
	})
}

// persistTokenUse writes the last-used times API requests noted in
// memory. A token revoked meanwhile is not written back.
func (s *Server) persistTokenUse(m *mutation, _ time.Time) (bool, error) {
	used := takeTimes(&s.tokMu, &s.tokUsed)
	dirty := false
	for id, at := range used {
		var h string
		var t tokenRec
		err := s.st.Get(pfxAPITokenID+id, &h)
		if err == nil {
			err = s.st.Get(pfxAPIToken+h, &t)
		}
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("load token %s: %w", id, err)
		}
		if t.LastUsedAt != nil && !at.After(*t.LastUsedAt) {
			continue
		}
		t.LastUsedAt = &at
		if err := m.put(pfxAPIToken+h, t); err != nil {
			return false, err
		}
		dirty = true
	}
	return dirty, nil
}

// takeTimes takes the times noted in memory under mu, leaving an empty map.
func takeTimes(mu *sync.Mutex, m *map[string]time.Time) map[string]time.Time {
	mu.Lock()
	defer mu.Unlock()
	out := *m
	*m = map[string]time.Time{}
	return out
}
