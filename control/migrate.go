package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hearthd/hearth/store"
)

// DefaultProject is the name of the project every state has from its first
// start: a state written before projects existed finds all its servers,
// SSH keys, rules, API keys and tokens in it.
const DefaultProject = "default"

// schemaVersion is the layout Migrate brings a state to: 2 is per-project
// key spaces. A state without a schema key is layout 1 (or empty).
const schemaVersion = 2

// The layout-1 key space that Migrate moves (see records.go for layout 2).
const (
	v1Server     = "ctl/srv/"
	v1ServerSeq  = "ctl/srvseq/"
	v1ServerName = "ctl/srvname/"
	v1SSHKey     = "ctl/sk/"
	v1SSHKeySeq  = "ctl/skseq/"
	v1SSHKeyFP   = "ctl/skfp/"
)

// Migrate brings the state to the current layout, in one synced batch, so
// a crash leaves either the old layout or the new one. It runs at every
// start (New) and before the operator commands work on the store; once the
// state is current it costs one read.
//
// Layout 1 → 2: the default project is created and owns everything; each
// server and SSH key with its creation, name and fingerprint index moves
// under ctl/p/<default>/; rules, API keys and tokens get their project
// (tokens their scope, read-write as before); the rule and API key ID
// indexes become per server; assigned nodes note their server's project.
func Migrate(st store.KV, now time.Time) error {
	var v int
	switch err := st.Get(keySchema, &v); {
	case err == nil && v == schemaVersion:
		return nil
	case err == nil && v > schemaVersion:
		return fmt.Errorf("state layout %d is newer than this hearth-control understands (%d)", v, schemaVersion)
	case err != nil && !errors.Is(err, store.ErrNotFound):
		return fmt.Errorf("read state layout: %w", err)
	}
	def := projectRec{ID: newID(prefixProject), Name: DefaultProject, CreatedAt: now.UTC()}
	m := migration{st: st, b: st.NewBatch(), project: def.ID}
	for _, step := range []func() error{
		func() error { return m.putProject(def) }, m.servers, m.sshKeys, m.rulesAndAPIKeys, m.tokens, m.nodes,
	} {
		if err := step(); err != nil {
			m.b.Discard()
			return fmt.Errorf("migrate state to layout %d: %w", schemaVersion, err)
		}
	}
	if err := m.b.Put(keySchema, schemaVersion); err != nil {
		m.b.Discard()
		return err
	}
	if err := m.b.Commit(); err != nil {
		return fmt.Errorf("migrate state to layout %d: %w", schemaVersion, err)
	}
	return nil
}

// migration is one run of Migrate: it reads the state as it is and stages
// the new layout in one batch, which the reads do not see.
type migration struct {
	st      store.KV
	b       store.Batch
	project string // the default project, the owner of everything there is
}

func (m migration) putProject(p projectRec) error {
	if err := m.b.Put(pfxProject+p.ID, p); err != nil {
		return err
	}
	return m.b.Put(pfxProjectName+p.Name, p.ID)
}

// move stages every record under from to the same key under to,
// unchanged.
func (m migration) move(from, to string) error {
	return m.st.Scan(from, "", false, func(key string, val []byte) (bool, error) {
		m.b.Delete(key)
		return true, m.b.PutRaw(to+key[len(from):], val)
	})
}

// edit stages every record under prefix rewritten by fn, at the key fn
// returns; the old key goes if it differs.
func edit[T any](m migration, prefix string, fn func(*T) (string, error)) error {
	return store.ScanJSON(m.st, prefix, func(key string, rec T) (bool, error) {
		to, err := fn(&rec)
		if err != nil {
			return false, err
		}
		if to != key {
			m.b.Delete(key)
		}
		return true, m.b.Put(to, rec)
	})
}

func (m migration) servers() error {
	pk := keysOf(m.project)
	err := edit(m, v1Server, func(r *serverRec) (string, error) {
		r.Project = m.project
		return r.key(), nil
	})
	if err == nil {
		err = m.move(v1ServerSeq, pk.serverSeq())
	}
	if err == nil {
		err = m.move(v1ServerName, pk.serverName(""))
	}
	return err
}

func (m migration) sshKeys() error {
	pk := keysOf(m.project)
	err := edit(m, v1SSHKey, func(k *sshKeyRec) (string, error) {
		k.Project = m.project
		return pk.sshKey(k.ID), nil
	})
	if err == nil {
		err = m.move(v1SSHKeySeq, pk.sshKeySeq())
	}
	if err == nil {
		err = m.move(v1SSHKeyFP, pk.sshKeyFP(""))
	}
	return err
}

// rulesAndAPIKeys gives rules and API keys their project and replaces
// their global ID indexes (<id> → record key) by per-server ones.
func (m migration) rulesAndAPIKeys() error {
	err := edit(m, pfxRule, func(r *ruleRec) (string, error) {
		r.Project = m.project
		return r.key(), m.b.Put(r.idKey(), r.key())
	})
	if err == nil {
		err = edit(m, pfxAPIKey, func(k *apiKeyRec) (string, error) {
			k.Project = m.project
			return k.key(), m.b.Put(k.idKey(), k.key())
		})
	}
	for _, idx := range []string{pfxRuleID, pfxAPIKeyID} {
		if err != nil {
			return err
		}
		err = m.st.Scan(idx, "", false, func(key string, _ []byte) (bool, error) {
			if !strings.Contains(key[len(idx):], "/") { // a layout-1 entry
				m.b.Delete(key)
			}
			return true, nil
		})
	}
	return err
}

// tokens puts every token in the default project, read-write as tokens
// were before scopes, with its ID indexes.
func (m migration) tokens() error {
	return edit(m, pfxAPIToken, func(t *tokenRec) (string, error) {
		t.Project, t.Scope = m.project, ScopeReadWrite
		h, err := json.Marshal(t.Hash)
		if err == nil {
			err = m.b.PutRaw(pfxAPITokenID+t.ID, h)
		}
		if err == nil {
			err = m.b.PutRaw(keysOf(m.project).tokens()+t.ID, h)
		}
		return pfxAPIToken + t.Hash, err
	})
}

func (m migration) nodes() error {
	return edit(m, pfxNode, func(n *nodeRec) (string, error) {
		if n.ServerID != "" {
			n.ServerProject = m.project
		}
		return pfxNode + n.ID, nil
	})
}
