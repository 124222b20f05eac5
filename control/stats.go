package control

import "github.com/hearthd/hearth/store"

// NodesConnected counts the nodes heard from within NodeTimeout: a
// long-poll returns at least every MaxLongPoll, so a live node is never
// quiet for long. Read at metrics scrapes.
func (s *Server) NodesConnected() int {
	now := s.now()
	seen := map[string]bool{}
	s.seenMu.Lock()
	for id, t := range s.lastSeen {
		if now.Sub(t) < s.cfg.NodeTimeout {
			seen[id] = true
		}
	}
	s.seenMu.Unlock()
	_ = store.ScanJSON(s.st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		if now.Sub(n.LastSeen) < s.cfg.NodeTimeout {
			seen[n.ID] = true
		}
		return true, nil
	})
	_ = store.ScanJSON(s.st, pfxNodeSeen, func(key string, sr seenRec) (bool, error) {
		if now.Sub(sr.LastSeen) < s.cfg.NodeTimeout {
			seen[key[len(pfxNodeSeen):]] = true
		}
		return true, nil
	})
	return len(seen)
}

// ServersByStatus counts servers per status, every known status present.
// Read at metrics scrapes.
func (s *Server) ServersByStatus() map[string]int {
	counts := map[string]int{}
	for _, st := range serverStatuses {
		counts[st] = 0
	}
	_ = s.eachServer(func(r serverRec) (bool, error) {
		counts[r.Status]++
		return true, nil
	})
	return counts
}
