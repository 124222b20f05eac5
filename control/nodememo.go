package control

import (
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	"github.com/hearthd/hearth/store"
)

// nodeMemo keeps node records as decoded from a database's read cache.
// Every long-poll and report reads its node's record (a credential check,
// then the revision), ~1 KiB of JSON each time: at 10 000 nodes that was
// the control plane's largest share of decoding. The cache hands out the
// same bytes while a record is unchanged (store.RawGetter), so a record
// is decoded once per version; the memo holds those bytes, so their
// address cannot be reused by another version while it is kept.
type nodeMemo struct {
	mu sync.Mutex
	m  map[string]memoNode
}

type memoNode struct {
	raw []byte
	rec nodeRec
}

// maxNodeMemo bounds the memo; past it, it starts over.
const maxNodeMemo = 1 << 16

// readNode reads node id's record through rd: from the memo when rd hands
// out the very bytes decoded last time, else decoded (and remembered).
// The record returned is the caller's own to change.
func (s *Server) readNode(rd store.KV, id string) (nodeRec, error) {
	var n nodeRec
	rg, ok := rd.(store.RawGetter)
	if !ok {
		err := rd.Get(pfxNode+id, &n)
		return n, err
	}
	raw, err := rg.GetRaw(pfxNode + id)
	if err != nil {
		return n, err
	}
	s.nodes.mu.Lock()
	e, hit := s.nodes.m[id]
	s.nodes.mu.Unlock()
	if hit && len(raw) > 0 && len(e.raw) == len(raw) && &e.raw[0] == &raw[0] {
		return e.rec.clone(), nil
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return nodeRec{}, fmt.Errorf("decode %s%s: %w", pfxNode, id, err)
	}
	s.nodes.mu.Lock()
	if s.nodes.m == nil || len(s.nodes.m) >= maxNodeMemo {
		s.nodes.m = map[string]memoNode{}
	}
	s.nodes.m[id] = memoNode{raw: raw, rec: n.clone()}
	s.nodes.mu.Unlock()
	return n, nil
}

// clone returns a copy of n that shares nothing a caller could change in
// place with n.
func (n nodeRec) clone() nodeRec {
	if n.Observed != nil {
		o := *n.Observed
		o.RuntimeCapabilities = slices.Clone(o.RuntimeCapabilities)
		o.Usage = slices.Clone(o.Usage)
		if o.RuntimeProgress != nil {
			p := *o.RuntimeProgress
			o.RuntimeProgress = &p
		}
		n.Observed = &o
	}
	return n
}
