package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// Actions. Every change to a server is an action (act_…): it is running
// from the change until the server's node has done it — applied the
// revision that carries it, served the new model, wiped the server — and
// then success; error if the node reports it could not, the server is
// deleted first, or it takes longer than ProvisionTimeout. The server
// record lists its running actions (serverRec.Actions) with the revision
// each waits for, so a node's report decides them from what it already
// reads, and a server without any costs nothing more. Records:
//
//	ctl/act/<project>/rec/<action id>                         the action
//	ctl/act/<project>/seq/<seq>/<action id>                   the project's, newest first
//	ctl/act/<project>/srv/<server id>/<seq>/<action id>       a server's
//	ctl/act/<project>/st/<status>/<seq>/<action id>           by status
//
// seq is a global revision taken when the action starts (the creation
// order, as other records'); the revision the action waits for is its
// node's (runningAction.Rev). Actions outlive their server: they are the
// project's history.
const (
	pfxAction    = "ctl/act/"
	prefixAction = "act_"
)

// Action commands.
const (
	ActCreate         = "create"
	ActUpdateModel    = "update_model"
	ActRename         = "rename"
	ActDelete         = "delete"
	ActAPIKeyCreate   = "api_key_create"
	ActAPIKeyDelete   = "api_key_delete"
	ActRuleAdd        = "firewall_rule_add"
	ActRuleDelete     = "firewall_rule_delete"
	ActSSHKeysUpdate  = "ssh_keys_update"
	actStatusRunning  = "running"
	actStatusSuccess  = "success"
	actStatusError    = "error"
	actErrTimeout     = "timeout"
	actErrApplyFailed = "apply_failed"
	actErrDeleted     = "server_deleted"
	actErrSuperseded  = "superseded"
)

var actionStatuses = []string{actStatusRunning, actStatusSuccess, actStatusError}

type actionKeys string

func actionKeysOf(project string) actionKeys { return actionKeys(pfxAction + project + "/") }

func (k actionKeys) rec(id string) string          { return string(k) + "rec/" + id }
func (k actionKeys) seq() string                   { return string(k) + "seq/" }
func (k actionKeys) server(srv string) string      { return string(k) + "srv/" + srv + "/" }
func (k actionKeys) status(status string) string   { return string(k) + "st/" + status + "/" }
func (k actionKeys) statusKey(a actionRec) string  { return k.status(a.Status) + seqKey(a.Seq, a.ID) }
func (k actionKeys) serverKey(a actionRec) string  { return k.server(a.ServerID) + seqKey(a.Seq, a.ID) }
func (k actionKeys) projectKey(a actionRec) string { return k.seq() + seqKey(a.Seq, a.ID) }

// actionRec is an action as stored.
type actionRec struct {
	ID         string           `json:"id"`
	Project    string           `json:"project"`
	ServerID   string           `json:"server_id"`
	Command    string           `json:"command"`
	Status     string           `json:"status"`
	Progress   int              `json:"progress"`
	Resources  []actionResource `json:"resources"`
	Error      *actionError     `json:"error,omitempty"`
	Seq        uint64           `json:"seq"` // the creation order
	StartedAt  time.Time        `json:"started_at"`
	FinishedAt *time.Time       `json:"finished_at,omitempty"`
}

type actionResource struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

type actionError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// runningAction is an action as its server's record lists it while it
// runs: what the node must do (the revision, for the command) and the
// progress last written.
type runningAction struct {
	ID       string    `json:"id"`
	Command  string    `json:"command"`
	Rev      uint64    `json:"rev"`
	Since    time.Time `json:"since"`
	Progress int       `json:"progress,omitempty"`
}

// actionJSON is an action as the API shows it.
type actionJSON struct {
	ID         string           `json:"id"`
	Command    string           `json:"command"`
	Status     string           `json:"status"`
	Progress   int              `json:"progress"`
	StartedAt  string           `json:"started_at"`
	FinishedAt *string          `json:"finished_at"`
	Error      *actionError     `json:"error"`
	Resources  []actionResource `json:"resources"`
}

func actionOut(a actionRec) *actionJSON {
	out := &actionJSON{ID: a.ID, Command: a.Command, Status: a.Status, Progress: a.Progress,
		StartedAt: formatTime(a.StartedAt), Error: a.Error, Resources: a.Resources}
	if a.FinishedAt != nil {
		f := formatTime(*a.FinishedAt)
		out.FinishedAt = &f
	}
	if out.Resources == nil {
		out.Resources = []actionResource{}
	}
	return out
}

// startAction stages a new running action of srv waiting for its node's
// revision rev, and lists it in srv (which the caller writes). more are
// the resources it touches besides the server.
func (m *mutation) startAction(srv *serverRec, command string, rev uint64, now time.Time, more ...actionResource) (actionRec, error) {
	a := actionRec{ID: newID(prefixAction), Project: srv.Project, ServerID: srv.ID, Command: command,
		Status: actStatusRunning, Resources: append([]actionResource{{Type: "server", ID: srv.ID}}, more...),
		Seq: m.nextRev(), StartedAt: now}
	ak := actionKeysOf(srv.Project)
	for _, kv := range []struct {
		k string
		v any
	}{{ak.rec(a.ID), a}, {ak.projectKey(a), a.ID}, {ak.serverKey(a), a.ID}, {ak.statusKey(a), a.ID}} {
		if err := m.put(kv.k, kv.v); err != nil {
			return a, err
		}
	}
	srv.Actions = append(srv.Actions, runningAction{ID: a.ID, Command: command, Rev: rev, Since: now})
	return a, nil
}

// finishAction stages the end of srv's running action ra: its status (and
// error), and srv no longer lists it (the caller writes srv).
func (m *mutation) finishAction(srv *serverRec, ra runningAction, status string, ae *actionError, now time.Time) error {
	ak := actionKeysOf(srv.Project)
	var a actionRec
	if err := m.r.Get(ak.rec(ra.ID), &a); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			srv.Actions = slices.DeleteFunc(srv.Actions, func(x runningAction) bool { return x.ID == ra.ID })
			return nil
		}
		return fmt.Errorf("load action %s: %w", ra.ID, err)
	}
	m.b.Delete(ak.statusKey(a))
	a.Status, a.Error, a.FinishedAt = status, ae, &now
	if status == actStatusSuccess {
		a.Progress = 100
	}
	if err := m.put(ak.rec(a.ID), a); err != nil {
		return err
	}
	if err := m.put(ak.statusKey(a), a.ID); err != nil {
		return err
	}
	srv.Actions = slices.DeleteFunc(srv.Actions, func(x runningAction) bool { return x.ID == ra.ID })
	if status == actStatusError {
		m.logWarn("action failed", "action", a.ID, "command", a.Command, "server", srv.ID, "code", ae.Code, "message", ae.Message)
	}
	return nil
}

// progressAction stages a running action's new progress.
func (m *mutation) progressAction(srv *serverRec, i int, progress int) error {
	ra := &srv.Actions[i]
	if ra.Progress == progress {
		return nil
	}
	ak := actionKeysOf(srv.Project)
	var a actionRec
	if err := m.r.Get(ak.rec(ra.ID), &a); err != nil {
		return fmt.Errorf("load action %s: %w", ra.ID, err)
	}
	a.Progress, ra.Progress = progress, progress
	return m.put(ak.rec(a.ID), a)
}

// concernOf is what an action waits for the node to apply, from its
// report: the concern's applied revision and error. ok is false for
// actions that wait for something else (the server's status, its wipe).
func concernOf(command string, o nodeapi.Observed) (applied uint64, errText string, ok bool) {
	switch command {
	case ActAPIKeyCreate, ActAPIKeyDelete:
		return o.APIKeysRevision, o.APIKeysError, true
	case ActRuleAdd, ActRuleDelete:
		return o.FirewallRevision, o.FirewallError, true
	case ActSSHKeysUpdate:
		return o.SSHKeysRevision, o.SSHKeysError, true
	case ActRename:
		return o.Revision, "", true
	}
	return 0, "", false
}

// decideActions ends or advances srv's running actions on a report o of
// its node: a concern's action succeeds once the node applied its revision
// and fails when the node reports it could not; a create or a model change
// succeeds once the server runs, and shows the model pull's progress
// meanwhile. It reports whether srv changed.
func (m *mutation) decideActions(srv *serverRec, o nodeapi.Observed, now time.Time) (bool, error) {
	changed := false
	for i := 0; i < len(srv.Actions); i++ {
		ra := srv.Actions[i]
		status, ae := "", (*actionError)(nil)
		if applied, errText, ok := concernOf(ra.Command, o); ok {
			switch {
			case applied >= ra.Rev:
				status = actStatusSuccess
			case o.Revision >= ra.Rev && errText != "":
				status, ae = actStatusError, &actionError{Code: actErrApplyFailed, Message: errText}
			}
		} else if ra.Command == ActCreate || ra.Command == ActUpdateModel {
			if srv.Status == StatusRunning {
				status = actStatusSuccess
			} else if p := pullProgress(o.RuntimeProgress); p != ra.Progress {
				if err := m.progressAction(srv, i, p); err != nil {
					return false, err
				}
				changed = true
			}
		}
		if status == "" {
			continue
		}
		if err := m.finishAction(srv, ra, status, ae, now); err != nil {
			return false, err
		}
		i--
		changed = true
	}
	return changed, nil
}

// pullProgress is a model pull's percentage, below 100 while it runs.
func pullProgress(p *nodeapi.PullProgress) int {
	if p == nil || p.Total <= 0 {
		return 0
	}
	return int(min(max(p.Completed*100/p.Total, 0), 99))
}

// endActions ends every running action of srv: a deletion's succeeds (the
// server is gone), the others fail with the server.
func (m *mutation) endActions(srv *serverRec, now time.Time) error {
	for len(srv.Actions) > 0 {
		ra := srv.Actions[0]
		status, ae := actStatusSuccess, (*actionError)(nil)
		if ra.Command != ActDelete {
			status, ae = actStatusError, &actionError{Code: actErrDeleted, Message: "the server was deleted before this was done"}
		}
		if err := m.finishAction(srv, ra, status, ae, now); err != nil {
			return err
		}
	}
	return nil
}

// failStatusActions fails srv's create and model change actions: the
// server turned failed (msg says why).
func (m *mutation) failStatusActions(srv *serverRec, msg string, now time.Time) error {
	for i := 0; i < len(srv.Actions); i++ {
		ra := srv.Actions[i]
		if ra.Command != ActCreate && ra.Command != ActUpdateModel {
			continue
		}
		if err := m.finishAction(srv, ra, actStatusError, &actionError{Code: actErrTimeout, Message: msg}, now); err != nil {
			return err
		}
		i--
	}
	return nil
}

// timeoutActions fails srv's actions that have run for timeout; it
// reports whether any did.
func (m *mutation) timeoutActions(srv *serverRec, timeout time.Duration, now time.Time) (bool, error) {
	changed := false
	for i := 0; i < len(srv.Actions); i++ {
		ra := srv.Actions[i]
		if now.Sub(ra.Since) < timeout || ra.Command == ActDelete {
			continue
		}
		msg := fmt.Sprintf("the node did not do this within %s", timeout)
		if err := m.finishAction(srv, ra, actStatusError, &actionError{Code: actErrTimeout, Message: msg}, now); err != nil {
			return false, err
		}
		i--
		changed = true
	}
	return changed, nil
}

// actionsDue reports whether any of srv's running actions has run for
// timeout (the deletion's own timeout is the server's).
func actionsDue(srv serverRec, timeout time.Duration, now time.Time) bool {
	for _, ra := range srv.Actions {
		if ra.Command != ActDelete && now.Sub(ra.Since) >= timeout {
			return true
		}
	}
	return false
}

// supersede fails srv's running model changes: a newer one replaces them.
func (m *mutation) supersede(srv *serverRec, now time.Time) error {
	for i := 0; i < len(srv.Actions); i++ {
		ra := srv.Actions[i]
		if ra.Command != ActUpdateModel {
			continue
		}
		if err := m.finishAction(srv, ra, actStatusError,
			&actionError{Code: actErrSuperseded, Message: "a later model change replaced this one"}, now); err != nil {
			return err
		}
		i--
	}
	return nil
}

func (s *Server) listActions(r *http.Request, rc *reqCtx) (result, error) {
	p, e := parsePage(r, "status")
	if e != nil {
		return result{}, e
	}
	q := r.URL.Query()
	ak := actionKeysOf(rc.project)
	index := ak.seq()
	if q.Has("status") {
		st := q.Get("status")
		if !slices.Contains(actionStatuses, st) || len(q["status"]) != 1 {
			return result{}, invalid("status", "status must be one of: %s", strings.Join(actionStatuses, ", "))
		}
		index = ak.status(st)
	}
	return s.actionPage(rc, index, p)
}

func (s *Server) listServerActions(r *http.Request, rc *reqCtx) (result, error) {
	srv, err := s.loadServer(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	p, e := parsePage(r)
	if e != nil {
		return result{}, e
	}
	return s.actionPage(rc, actionKeysOf(rc.project).server(srv.ID), p)
}

// actionPage is one page of an action index.
func (s *Server) actionPage(rc *reqCtx, index string, p page) (result, error) {
	ak := actionKeysOf(rc.project)
	body, err := s.scanPage(index, p, func(_ string, val []byte) (any, bool, error) {
		var id string
		if err := json.Unmarshal(val, &id); err != nil {
			return nil, false, err
		}
		var a actionRec
		if err := s.st.Get(ak.rec(id), &a); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil, false, nil
			}
			return nil, false, err
		}
		return actionOut(a), true, nil
	})
	if err != nil {
		return result{}, err
	}
	return result{status: http.StatusOK, body: body}, nil
}

func (s *Server) getAction(r *http.Request, rc *reqCtx) (result, error) {
	id := r.PathValue("id")
	var a actionRec
	if !validID(id, prefixAction) {
		return result{}, notFound("id", "no action %q", id)
	}
	if err := s.st.Get(actionKeysOf(rc.project).rec(id), &a); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return result{}, notFound("id", "no action %q", id)
		}
		return result{}, err
	}
	return result{status: http.StatusOK, body: actionOut(a)}, nil
}

// actionHeader names the actions a change started in its answer (the
// answers without a body: deletions).
const actionHeader = "X-Action-Id"

// serverAction gives srv's node a new revision for a change of the
// request, starts the action that waits for it and writes srv, which
// lists the action.
func (s *Server) serverAction(rc *reqCtx, srv *serverRec, command string, res actionResource) (*actionJSON, error) {
	m := rc.mutation()
	rev, err := m.bumpRev(srv.NodeID)
	if err != nil {
		return nil, err
	}
	a, err := m.startAction(srv, command, rev, rc.now, res)
	if err != nil {
		return nil, err
	}
	rc.started(a)
	if err := m.put(srv.key(), *srv); err != nil {
		return nil, err
	}
	return actionOut(a), nil
}
