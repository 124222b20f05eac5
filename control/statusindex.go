package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/hearthd/hearth/store"
)

// The status index lists a project's servers by status, in creation order,
// so GET /v1/servers?status= reads only the servers it returns:
// ctl/p/<project>/srvst/<status>/<seq>/<server id> → server id. It is
// written with every server record (mutation.put) and rebuilt at start.

func (k projectKeys) serverStatus(status string) string { return string(k) + "srvst/" + status + "/" }

func statusKey(rec serverRec) string {
	return keysOf(rec.Project).serverStatus(rec.Status) + seqKey(rec.Seq, rec.ID)
}

// indexServer moves rec's entry in the status index if this change moves
// its status (the status as stored, or as staged earlier in this change).
// A dry run's batch is thrown away: it indexes nothing, and so reads
// nothing (a strong read outside the lock, a round trip on a database,
// at every node report that changes a status).
func (m *mutation) indexServer(rec serverRec) error {
	if m.dry {
		return nil
	}
	if m.srvStatus == nil {
		m.srvStatus = map[string]string{}
	}
	old, staged := m.srvStatus[rec.ID]
	if !staged {
		// Only the stored status: its times need no parsing, its other
		// strings no copies.
		var stored struct {
			Status string `json:"status"`
		}
		switch err := m.r.Get(rec.key(), &stored); {
		case err == nil:
			old = stored.Status
		case !errors.Is(err, store.ErrNotFound):
			return fmt.Errorf("load server %s: %w", rec.ID, err)
		}
	}
	m.srvStatus[rec.ID] = rec.Status
	if old == rec.Status {
		return nil
	}
	if old != "" {
		prev := rec
		prev.Status = old
		m.b.Delete(statusKey(prev))
	}
	return m.b.Put(statusKey(rec), rec.ID)
}

// newServer tells the status index that server id is new in this change,
// so that indexing it reads no stored record (there is none).
func (m *mutation) newServer(id string) {
	if m.srvStatus == nil {
		m.srvStatus = map[string]string{}
	}
	m.srvStatus[id] = ""
}

// unindexServer removes rec from the status index.
func (m *mutation) unindexServer(rec serverRec) {
	if st, ok := m.srvStatus[rec.ID]; ok {
		rec.Status = st
	}
	m.b.Delete(statusKey(rec))
	delete(m.srvStatus, rec.ID)
}

// rebuildStatusIndex brings the status index in step with the server
// records, at start (one scan of the project records): entries missing are
// written, stale ones deleted.
func (s *Server) rebuildStatusIndex() error {
	want, have := map[string]string{}, map[string]bool{}
	err := s.st.Scan(pfxProjectData, "", false, func(key string, val []byte) (bool, error) {
		_, tail, _ := strings.Cut(key[len(pfxProjectData):], "/")
		switch {
		case strings.HasPrefix(tail, "srvst/"):
			have[key] = true
		case strings.HasPrefix(tail, "srv/"):
			var rec serverRec
			if err := json.Unmarshal(val, &rec); err != nil {
				return false, fmt.Errorf("server record %s: %w", key, err)
			}
			want[statusKey(rec)] = rec.ID
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("rebuild the status index: %w", err)
	}
	b := s.w.NewBatch()
	for k := range have {
		if _, ok := want[k]; !ok {
			b.Delete(k)
		}
	}
	for k, id := range want {
		if !have[k] {
			if err := b.Put(k, id); err != nil {
				b.Discard()
				return fmt.Errorf("rebuild the status index: %w", err)
			}
		}
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("rebuild the status index: %w", err)
	}
	return nil
}
