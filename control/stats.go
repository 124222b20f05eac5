package control

import (
	"time"

	"github.com/hearthd/hearth/store"
)

// NodesConnected counts the nodes heard from within NodeTimeout: a
// long-poll returns at least every MaxLongPoll, so a live node is never
// quiet for long. Read at metrics scrapes.
func (s *Server) NodesConnected() int { return len(s.nodesSeen(s.now())) }

// Node states, as NodesByState counts them.
const (
	NodeIdle        = "idle"        // in the pool, serving no server
	NodeServing     = "serving"     // serving a server
	NodeWiping      = "wiping"      // its server is gone; out of the pool until it reports the wipe
	NodeUnreachable = "unreachable" // not heard from within NodeTimeout
)

// NodesByState counts the enrolled nodes per state, every state present.
// Read at metrics scrapes.
func (s *Server) NodesByState() map[string]int {
	counts := map[string]int{NodeIdle: 0, NodeServing: 0, NodeWiping: 0, NodeUnreachable: 0}
	seen := s.nodesSeen(s.now())
	_ = store.ScanJSON(s.st, pfxNode, func(_ string, n nodeRec) (bool, error) {
		switch {
		case !seen[n.ID]:
			counts[NodeUnreachable]++
		case n.WipePending:
			counts[NodeWiping]++
		case n.ServerID != "":
			counts[NodeServing]++
		default:
			counts[NodeIdle]++
		}
		return true, nil
	})
	return counts
}

// OnPropagation sets f, called with each propagation delay: from a node's
// new desired revision to the first report that it applied it (with the
// change that issued it and the report folded on any replica). nil stops
// the calls.
func (s *Server) OnPropagation(f func(time.Duration)) {
	if f == nil {
		s.propagated.Store(nil)
		return
	}
	s.propagated.Store(&f)
}

// nodesSeen are the nodes heard from within NodeTimeout of now.
func (s *Server) nodesSeen(now time.Time) map[string]bool {
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
	return seen
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
