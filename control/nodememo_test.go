package control

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// rawStore hands out its slices as they are, as a read cache does.
type rawStore struct {
	store.KV
	raw map[string][]byte
}

func (r rawStore) GetRaw(key string) ([]byte, error) {
	v, ok := r.raw[key]
	if !ok {
		return nil, store.ErrNotFound
	}
	return v, nil
}

// TestReadNodeDecodesOncePerVersion: the same bytes are decoded once; the
// record handed out is the caller's own (changing it changes nothing for
// the next reader); bytes of a new version are decoded anew.
func TestReadNodeDecodesOncePerVersion(t *testing.T) {
	enc := func(n nodeRec) []byte {
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	obs := &nodeapi.Observed{Revision: 3, RuntimeCapabilities: []string{"completion", "tools"}, RuntimeProgress: &nodeapi.PullProgress{Status: "pulling"}}
	v1 := enc(nodeRec{ID: "n1", Revision: 3, CredentialHash: "h", Observed: obs})
	rs := rawStore{raw: map[string][]byte{pfxNode + "n1": v1}}
	s := &Server{}

	a, err := s.readNode(rs, "n1")
	if err != nil || a.Revision != 3 || a.Observed.RuntimeCapabilities[1] != "tools" {
		t.Fatalf("first read: %+v, %v", a, err)
	}
	a.Revision, a.Observed.IP, a.Observed.RuntimeCapabilities[1], a.Observed.RuntimeProgress.Status = 9, "192.0.2.9", "vision", "x"

	// The same slice, its bytes changed behind the memo's back (a cache
	// never does this): what comes back is the memo's, not a new decode.
	copy(v1, bytes.Replace(v1, []byte(`"revision":3`), []byte(`"revision":4`), 1))
	b, err := s.readNode(rs, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if b.Revision != 3 {
		t.Fatalf("revision %d: the same bytes were decoded again", b.Revision)
	}
	if b.Observed.IP != "" || b.Observed.RuntimeCapabilities[1] != "tools" || b.Observed.RuntimeProgress.Status != "pulling" {
		t.Fatalf("a caller's change reached the memo: %+v", *b.Observed)
	}

	// A new version is new bytes.
	rs.raw[pfxNode+"n1"] = enc(nodeRec{ID: "n1", Revision: 5, CredentialHash: "h"})
	c, err := s.readNode(rs, "n1")
	if err != nil || c.Revision != 5 || c.Observed != nil {
		t.Fatalf("new version: %+v, %v", c, err)
	}
	if _, err := s.readNode(rs, "n2"); err != store.ErrNotFound {
		t.Fatalf("missing node: %v", err)
	}
}
