package control

import (
	"time"

	"github.com/hearthd/hearth/store"
)

// connectedWindow is how recently a node must have called in to count as
// connected: a long-poll returns at least every MaxLongPoll, so a live node
// is never quiet for long.
const connectedWindow = 90 * time.Second

// NodesConnected counts the nodes heard from within the last 90 s. Read at
// metrics scrapes.
func (s *Server) NodesConnected() int {
	now := s.now()
	seen := map[string]bool{}
	s.seenMu.Lock()
	for id, t := range s.lastSeen {
		if now.Sub(t) <= connectedWindow {
			seen[id] = true
		}
	}
	s.seenMu.Unlock()
	_ = store.ScanJSON(s.st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		if now.Sub(n.LastSeen) <= connectedWindow {
			seen[n.ID] = true
		}
		return true, nil
	})
	return len(seen)
}

// ServersByStatus counts servers per status, every known status present.
// Read at metrics scrapes.
func (s *Server) ServersByStatus() map[string]int {
	counts := map[string]int{}
	for _, st := range []string{StatusProvisioning, StatusRunning, StatusFailed, StatusDeleting} {
		counts[st] = 0
	}
	_ = store.ScanJSON(s.st, pfxServer, func(_ string, r serverRec) (bool, error) {
		counts[r.Status]++
		return true, nil
	})
	return counts
}
