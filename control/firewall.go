package control

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/store"
)

// MaxRulesPerServer bounds a server's firewall rule set; one more is a 409.
const MaxRulesPerServer = 100

type createRuleReq struct {
	Direction   string `json:"direction"`
	Protocol    string `json:"protocol"`
	PortRange   string `json:"port_range"`
	Source      string `json:"source"`
	Destination string `json:"destination"`
	Action      string `json:"action"`
	Description string `json:"description"`
}

type ruleJSON struct {
	ID          string  `json:"id"`
	ServerID    string  `json:"server_id"`
	Direction   string  `json:"direction"`
	Protocol    string  `json:"protocol"`
	PortRange   *string `json:"port_range"`
	Source      *string `json:"source"`
	Destination *string `json:"destination"`
	Action      string  `json:"action"`
	Description string  `json:"description"`
	CreatedAt   string  `json:"created_at"`
	// StartedAction is the action the rule's creation started (in its
	// answer only; action is the rule's allow or deny).
	StartedAction *actionJSON `json:"started_action,omitempty"`
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func ruleOut(r ruleRec) ruleJSON {
	return ruleJSON{ID: r.ID, ServerID: r.ServerID, Direction: r.Rule.Direction, Protocol: r.Rule.Protocol,
		PortRange: optional(r.Rule.PortRange), Source: optional(r.Rule.Source), Destination: optional(r.Rule.Destination),
		Action: r.Rule.Action, Description: r.Rule.Description, CreatedAt: formatTime(r.CreatedAt)}
}

// sameRule reports whether two canonical rules match the same packets with
// the same action.
func sameRule(a, b firewall.Rule) bool {
	a.ID, b.ID, a.Description, b.Description = "", "", "", ""
	return a == b
}

func (s *Server) loadServerParam(r *http.Request, rc *reqCtx) (serverRec, error) {
	rec, err := s.loadServer(rc, r.PathValue("server_id"))
	var ae *apiError
	if errors.As(err, &ae) {
		ae.param = "server_id"
	}
	return rec, err
}

func (s *Server) createRule(r *http.Request, rc *reqCtx) (result, error) {
	srv, err := s.loadServerParam(r, rc)
	if err != nil {
		return result{}, err
	}
	var req createRuleReq
	if e := s.decodeJSON(r, &req); e != nil {
		return result{}, e
	}
	rule, err := firewall.Canonicalize(firewall.Rule{Direction: req.Direction, Protocol: req.Protocol,
		PortRange: req.PortRange, Source: req.Source, Destination: req.Destination, Action: req.Action,
		Description: req.Description})
	if err != nil {
		var fe *firewall.FieldError
		if errors.As(err, &fe) {
			return result{}, invalid(fe.Field, "%s", fe.Error())
		}
		return result{}, invalid("", "invalid firewall rule: %v", err)
	}
	if srv.Status == StatusDeleting {
		return result{}, conflict("server_id", "server %s is being deleted", srv.ID)
	}
	count := 0
	var dup string
	err = store.ScanJSON(s.st, pfxRule+srv.ID+"/", func(_ string, existing ruleRec) (bool, error) {
		count++
		if sameRule(existing.Rule, rule) {
			dup = existing.ID
		}
		return true, nil
	})
	if err != nil {
		return result{}, err
	}
	if dup != "" {
		return result{}, conflict("", "an identical rule already exists: %s", dup)
	}
	if count >= MaxRulesPerServer {
		return result{}, conflict("server_id", "server %s already has the maximum of %d firewall rules", srv.ID, MaxRulesPerServer)
	}
	id := newID(prefixRule)
	rule.ID = id
	m := rc.mutation()
	rec := ruleRec{ID: id, Project: rc.project, ServerID: srv.ID, Rule: rule, Seq: m.nextRev(), CreatedAt: rc.now}
	if err := m.put(rec.key(), rec); err != nil {
		return result{}, err
	}
	if err := m.put(rec.idKey(), rec.key()); err != nil {
		return result{}, err
	}
	act, err := s.serverAction(rc, &srv, ActRuleAdd, actionResource{Type: "firewall_rule", ID: rec.ID})
	if err != nil {
		return result{}, err
	}
	out := ruleOut(rec)
	out.StartedAction = act
	return result{status: http.StatusCreated, body: out}, nil
}

func (s *Server) listRules(r *http.Request, rc *reqCtx) (result, error) {
	srv, err := s.loadServerParam(r, rc)
	if err != nil {
		return result{}, err
	}
	p, e := parsePage(r)
	if e != nil {
		return result{}, e
	}
	body, err := s.scanPage(pfxRule+srv.ID+"/", p, func(_ string, val []byte) (any, bool, error) {
		var rec ruleRec
		if err := json.Unmarshal(val, &rec); err != nil {
			return nil, false, err
		}
		return ruleOut(rec), true, nil
	})
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: body}, nil
}

func (s *Server) loadRule(r *http.Request, rc *reqCtx) (serverRec, ruleRec, error) {
	srv, err := s.loadServerParam(r, rc)
	if err != nil {
		return srv, ruleRec{}, err
	}
	id := r.PathValue("rule_id")
	rec, err := loadOwned[ruleRec](s.st, id, prefixRule, pfxRuleID, srv.ID)
	if errors.Is(err, store.ErrNotFound) {
		return srv, rec, notFound("rule_id", "no firewall rule %q on server %s", id, srv.ID)
	}
	return srv, rec, err
}

// loadOwned reads a record of a server through the server's ID index
// (idx + server ID + "/" + id → the record's key). A malformed ID, a
// missing record and another server's record are all store.ErrNotFound,
// the last two from the same one read: another server's records are not
// in this server's index.
func loadOwned[T any](st store.KV, id, prefix, idx, serverID string) (T, error) {
	var rec T
	if !validID(id, prefix) {
		return rec, store.ErrNotFound
	}
	var key string
	if err := st.Get(idx+serverID+"/"+id, &key); err != nil {
		return rec, err
	}
	err := st.Get(key, &rec)
	return rec, err
}

func (s *Server) getRule(r *http.Request, rc *reqCtx) (result, error) {
	_, rec, err := s.loadRule(r, rc)
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: ruleOut(rec)}, nil
}

func (s *Server) deleteRule(r *http.Request, rc *reqCtx) (result, error) {
	srv, rec, err := s.loadRule(r, rc)
	if err != nil {
		return result{}, err
	}
	m := rc.mutation()
	m.b.Delete(rec.key())
	m.b.Delete(rec.idKey())
	if _, err := s.serverAction(rc, &srv, ActRuleDelete, actionResource{Type: "firewall_rule", ID: rec.ID}); err != nil {
		return result{}, err
	}
	return result{status: http.StatusNoContent}, nil
}
