package control

import (
	"context"
	"errors"
	"fmt"
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
	unlock, err := s.lock(context.Background())
	if err != nil {
		return err
	}
	if err := s.sweepLocked(); err != nil {
		_ = unlock()
		return err
	}
	return unlock()
}

// sweepLocked is Sweep with the change lock held.
func (s *Server) sweepLocked() error {
	now := s.now()
	m := s.begin()
	dirty := false
	for _, step := range []func(*mutation, time.Time) (bool, error){
		s.persistLastSeen, s.persistTokenUse, s.sweepServers, s.expireAPIKeys, s.purgeIdempotency,
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

// persistLastSeen writes the last-seen times node requests noted in memory.
func (s *Server) persistLastSeen(m *mutation, _ time.Time) (bool, error) {
	seen := takeTimes(&s.seenMu, &s.lastSeen)
	reported := takeTimes(&s.seenMu, &s.reported)
	ids := make([]string, 0, len(seen)+len(reported))
	for id := range seen {
		ids = append(ids, id)
	}
	for id := range reported {
		ids = append(ids, id)
	}
	if err := m.loadNodes(ids); err != nil {
		return false, err
	}
	dirty := false
	for _, tt := range []struct {
		times map[string]time.Time
		field func(*nodeRec) *time.Time
	}{
		{seen, func(n *nodeRec) *time.Time { return &n.LastSeen }},
		{reported, func(n *nodeRec) *time.Time { return &n.ObservedAt }},
	} {
		for id, t := range tt.times {
			n, err := m.node(id)
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			if err != nil {
				return false, err
			}
			if at := tt.field(n); t.After(*at) {
				*at, dirty = t, true
				m.saveNode(n)
			}
		}
	}
	return dirty, nil
}

func (s *Server) sweepServers(m *mutation, now time.Time) (bool, error) {
	dirty := false
	err := s.eachServer(func(srv serverRec) (bool, error) {
		n, err := m.node(srv.NodeID)
		if err != nil {
			return false, err
		}
		changed, err := s.sweepServer(m, srv, n, now)
		dirty = dirty || changed
		return err == nil, err
	})
	return dirty, err
}

// sweepServer applies one server's timeouts.
func (s *Server) sweepServer(m *mutation, srv serverRec, n *nodeRec, now time.Time) (bool, error) {
	if srv.Status == StatusDeleting {
		if now.Sub(srv.since()) < s.cfg.DeleteTimeout {
			return false, nil
		}
		if err := s.removeServer(m, srv); err != nil {
			return false, err
		}
		n.ServerID, n.ServerProject, n.WipePending = "", "", true
		if err := m.bump(n.ID); err != nil {
			return false, err
		}
		s.log.Warn("server removed without its node's wipe; the node stays out of the pool until it reports the wipe",
			"server", srv.ID, "node", n.ID, "timeout", s.cfg.DeleteTimeout)
		return true, nil
	}
	changed := false
	if lc := srv.lifecycle(); (lc == StatusProvisioning || lc == StatusUpdating) && now.Sub(srv.since()) >= s.cfg.ProvisionTimeout {
		srv.setLifecycle(StatusFailed, now)
		changed = true
		s.log.Warn("server did not converge in time", "server", srv.ID, "node", srv.NodeID, "was", lc, "timeout", s.cfg.ProvisionTimeout)
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
		s.log.Warn("server's node is silent", "server", srv.ID, "node", n.ID, "last_seen", n.LastSeen)
	case !silent && srv.Status == StatusUnreachable:
		srv.restore()
		changed = true
		s.log.Info("server's node is heard from again", "server", srv.ID, "node", n.ID, "status", srv.Status)
	}
	if !changed {
		return false, nil
	}
	srv.UpdatedAt = now
	return true, m.put(srv.key(), srv)
}

func (s *Server) purgeIdempotency(m *mutation, now time.Time) (bool, error) {
	dirty := false
	err := store.ScanJSON(s.st, pfxIdempotency, func(key string, rec idempotencyRec) (bool, error) {
		if !rec.ExpiresAt.After(now) {
			m.b.Delete(key)
			dirty = true
		}
		return true, nil
	})
	return dirty, err
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
