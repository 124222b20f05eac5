package control

import (
	"errors"
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/hearthd/hearth/internal/textcheck"
	"github.com/hearthd/hearth/sshkeys"
	"github.com/hearthd/hearth/store"
)

const maxKeyNameLen = 100

type createSSHKeyReq struct {
	Name      string `json:"name"`
	PublicKey string `json:"public_key"`
}

type sshKeyJSON struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
	Type        string `json:"type"`
	Bits        int    `json:"bits"`
	CreatedAt   string `json:"created_at"`
}

func sshKeyOut(k sshKeyRec) sshKeyJSON {
	return sshKeyJSON{ID: k.ID, Name: k.Name, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint,
		Type: k.Type, Bits: k.Bits, CreatedAt: formatTime(k.CreatedAt)}
}

// validName accepts a name people will read in lists and terminals: 1 to
// maxKeyNameLen characters, no surrounding spaces, and nothing that does
// not show as itself (control, bidi override and other format characters,
// characters drawn as nothing: textcheck.Hidden).
func validName(s string) bool {
	if s == "" || utf8.RuneCountInString(s) > maxKeyNameLen || !utf8.ValidString(s) || strings.TrimSpace(s) != s {
		return false
	}
	_, hidden := textcheck.Hidden(s)
	return !hidden
}

func (s *Server) createSSHKey(r *http.Request, rc *reqCtx) (result, error) {
	var req createSSHKeyReq
	if e := s.decodeJSON(r, &req); e != nil {
		return result{}, e
	}
	if !validName(req.Name) {
		return result{}, invalid("name", "name must be 1 to %d characters without control or invisible characters (such as bidi overrides or blank fillers) or surrounding spaces", maxKeyNameLen)
	}
	pk, err := sshkeys.Parse(req.PublicKey)
	if err != nil {
		return result{}, invalid("public_key", "%v", err)
	}
	var existing string
	if err := s.st.Get(rc.pk.sshKeyFP(pk.Fingerprint), &existing); err == nil {
		return result{}, conflict("public_key", "this key is already registered as %s", existing)
	} else if !errors.Is(err, store.ErrNotFound) {
		return result{}, err
	}
	id := newID(prefixSSHKey)
	m := rc.mutation()
	seq := m.nextRev()
	rec := sshKeyRec{ID: id, Project: rc.project, Name: req.Name, PublicKey: pk.Line, Fingerprint: pk.Fingerprint, Type: pk.Type,
		Bits: pk.Bits, Comment: pk.Comment, Seq: seq, CreatedAt: rc.now}
	if err := m.put(rc.pk.sshKey(id), rec); err != nil {
		return result{}, err
	}
	if err := m.put(rc.pk.sshKeySeq()+seqKey(seq, id), id); err != nil {
		return result{}, err
	}
	if err := m.put(rc.pk.sshKeyFP(pk.Fingerprint), id); err != nil {
		return result{}, err
	}
	return result{status: http.StatusCreated, body: sshKeyOut(rec)}, nil
}

func (s *Server) listSSHKeys(r *http.Request, rc *reqCtx) (result, error) {
	p, e := parsePage(r)
	if e != nil {
		return result{}, e
	}
	body, err := s.scanPage(rc.pk.sshKeySeq(), p, func(_ string, val []byte) (any, bool, error) {
		var rec sshKeyRec
		if err := s.st.Get(rc.pk.sshKey(strings.Trim(string(val), `"`)), &rec); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil, false, nil
			}
			return nil, false, err
		}
		return sshKeyOut(rec), true, nil
	})
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: body}, nil
}

// loadSSHKey reads an SSH key of the request's project (see loadServer).
func (s *Server) loadSSHKey(rc *reqCtx, id string) (sshKeyRec, error) {
	var rec sshKeyRec
	if !validID(id, prefixSSHKey) {
		return rec, notFound("id", "no SSH key %q", id)
	}
	if err := s.st.Get(rc.pk.sshKey(id), &rec); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return rec, notFound("id", "no SSH key %q", id)
		}
		return rec, err
	}
	return rec, nil
}

func (s *Server) getSSHKey(r *http.Request, rc *reqCtx) (result, error) {
	rec, err := s.loadSSHKey(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: sshKeyOut(rec)}, nil
}

// deleteSSHKey removes the key and takes it off every server that has it,
// giving those servers' nodes a new revision so the key leaves
// authorized_keys.
func (s *Server) deleteSSHKey(r *http.Request, rc *reqCtx) (result, error) {
	rec, err := s.loadSSHKey(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	m := rc.mutation()
	m.b.Delete(rc.pk.sshKey(rec.ID))
	m.b.Delete(rc.pk.sshKeySeq() + seqKey(rec.Seq, rec.ID))
	m.b.Delete(rc.pk.sshKeyFP(rec.Fingerprint))
	// Only the project's servers can list the key.
	err = store.ScanJSON(s.st, rc.pk.servers(), func(_ string, srv serverRec) (bool, error) {
		i := slices.Index(srv.SSHKeyIDs, rec.ID)
		if i < 0 {
			return true, nil
		}
		srv.SSHKeyIDs = slices.Delete(srv.SSHKeyIDs, i, i+1)
		srv.UpdatedAt = rc.now
		if srv.Status == StatusDeleting { // the wipe takes every key anyway
			return true, errors.Join(m.put(srv.key(), srv), m.bump(srv.NodeID))
		}
		_, err := s.serverAction(rc, &srv, ActSSHKeysUpdate, actionResource{Type: "ssh_key", ID: rec.ID})
		return err == nil, err
	})
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusNoContent}, nil
}
