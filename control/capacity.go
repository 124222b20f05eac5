package control

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/hearthd/hearth/store"
)

// pfxFree indexes the pool: one key per free node (no server, no wipe
// pending), ordered by chip, then RAM, then storage, so that picking the
// smallest node that fits reads the index from the requested size on
// instead of every node record:
// ctl/free/<chip, path-escaped>/<ram, 10 digits>/<storage, 10 digits>/<node id> → "".
const pfxFree = "ctl/free/"

// freeKey is n's key in the pool index, or "" if n is not free.
func freeKey(n *nodeRec) string {
	if n.ServerID != "" || n.WipePending {
		return ""
	}
	return freePrefix(n.Hardware.Chip) + fmt.Sprintf("%010d/%010d/", n.Hardware.RAM, n.Hardware.Storage) + n.ID
}

func freePrefix(chip string) string { return pfxFree + url.PathEscape(chip) + "/" }

// pickNode returns the free node of chip with the least RAM of at least
// ram GB, and of those the least storage of at least storage GB.
// A node m has staged out of the pool (taken by an earlier create of the
// same fold) is passed over: its index entry is gone once m commits.
func (s *Server) pickNode(chip string, ram, storage int, m *mutation) (nodeRec, bool, error) {
	prefix := freePrefix(chip)
	var best nodeRec
	found := false
	var ferr error
	err := s.st.Scan(prefix, prefix+fmt.Sprintf("%010d/", ram), false, func(key string, _ []byte) (bool, error) {
		f := strings.Split(key[len(prefix):], "/")
		if len(f) != 3 {
			return true, nil
		}
		if st, err := strconv.Atoi(f[1]); err != nil || st < storage {
			return true, nil
		}
		if n, ok := m.nodes[f[2]]; ok && freeKey(n) != key {
			return true, nil
		}
		var n nodeRec
		if err := s.st.Get(pfxNode+f[2], &n); err != nil {
			ferr = fmt.Errorf("load node %s: %w", f[2], err)
			return false, nil
		}
		if freeKey(&n) != key { // never expected: the index is written with the record
			s.log.Error("pool index out of step with a node record; skipping it", "node", n.ID, "key", key)
			return true, nil
		}
		best, found = n, true
		return false, nil
	})
	if err == nil {
		err = ferr
	}
	if err != nil {
		return nodeRec{}, false, fmt.Errorf("pick a node: %w", err)
	}
	return best, found, nil
}

// rebuildFreeIndex writes the pool index afresh from the node records, at
// start: it covers state written before the index existed, at the cost of
// one scan of the nodes per start.
func (s *Server) rebuildFreeIndex() error {
	b := s.w.NewBatch()
	err := s.st.Scan(pfxFree, "", false, func(key string, _ []byte) (bool, error) {
		b.Delete(key)
		return true, nil
	})
	if err == nil {
		err = store.ScanJSON(s.st, pfxNode, func(_ string, n nodeRec) (bool, error) {
			if k := freeKey(&n); k != "" {
				return true, b.PutRaw(k, nil)
			}
			return true, nil
		})
	}
	if err != nil {
		b.Discard()
		return fmt.Errorf("rebuild the pool index: %w", err)
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("rebuild the pool index: %w", err)
	}
	return nil
}
