package control

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/sshkeys"
	"github.com/hearthd/hearth/store"
)

const maxHostnameLen = 253

// enroll exchanges an enrollment token for a node credential and adds the
// node, with its hardware, to the capacity pool.
func (s *Server) enroll(w http.ResponseWriter, r *http.Request) {
	var req nodeapi.EnrollRequest
	if e := s.decodeJSON(r, &req); e != nil {
		writeError(w, e)
		return
	}
	hw := req.Hardware
	switch {
	case req.Hostname == "" || len(req.Hostname) > maxHostnameLen || strings.ContainsFunc(req.Hostname, func(r rune) bool { return r <= ' ' || r > '~' }):
		writeError(w, invalid("hostname", "hostname must be 1 to %d printable ASCII characters", maxHostnameLen))
		return
	case !chipPattern.MatchString(hw.Chip):
		writeError(w, invalid("hardware.chip", "chip must be 1 to 63 lowercase letters, digits, '.', '_' or '-'"))
		return
	case hw.RAM <= 0:
		writeError(w, invalid("hardware.ram", "ram must be a positive integer (GB)"))
		return
	case hw.Storage <= 0:
		writeError(w, invalid("hardware.storage", "storage must be a positive integer (GB)"))
		return
	}
	tok := bearer(r)
	unlock, err := s.lock(r.Context())
	if err != nil {
		s.nodeInternal(w, err)
		return
	}
	defer unlock() //nolint:errcheck // a no-op once the success path has called it
	now := s.now()
	var enr enrollmentRec
	key := pfxEnrollment + hashSecret(tok)
	if err := s.st.Get(key, &enr); err != nil || !strings.HasPrefix(tok, secretEnrollment) ||
		!hashesEqual(enr.Hash, hashSecret(tok)) || enr.UsesLeft <= 0 || !now.Before(enr.ExpiresAt) {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Error("look up enrollment token", "err", err)
			if ae := storeFailure(err); ae != nil {
				writeError(w, ae)
				return
			}
		}
		writeError(w, &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "missing, used up or expired enrollment token"})
		return
	}
	id, cred := newID(prefixNode), newSecret(secretNode)
	m := s.begin()
	node := nodeRec{ID: id, Hostname: req.Hostname, Hardware: hw, CredentialHash: hashSecret(cred),
		Revision: 1, RevisionAt: now, LastSeen: now, CreatedAt: now}
	enr.UsesLeft--
	m.orig[id] = "" // new: not in the pool index yet
	m.saveNode(&node)
	err = m.put(pfxNodeCred+node.CredentialHash, id)
	if err == nil {
		if enr.UsesLeft > 0 {
			err = m.put(key, enr)
		} else {
			m.b.Delete(key)
		}
	}
	if err == nil {
		err = m.commit()
	} else {
		m.discard()
	}
	if err == nil {
		err = unlock() // the credential is handed out only once durable
	}
	if err != nil {
		s.nodeInternal(w, err)
		return
	}
	s.log.Info("node enrolled", "node", id, "hostname", req.Hostname, "chip", hw.Chip, "ram", hw.RAM, "storage", hw.Storage)
	writeJSON(w, http.StatusCreated, nodeapi.EnrollResponse{NodeID: id, Credential: cred})
}

func (s *Server) nodeInternal(w http.ResponseWriter, err error) {
	s.log.Error("node protocol request failed", "request_id", w.Header().Get("X-Request-Id"), "err", err)
	if ae := storeFailure(err); ae != nil {
		writeError(w, ae)
		return
	}
	writeError(w, &apiError{status: http.StatusInternalServerError, code: CodeInternal, message: "internal error"})
}

// authNode resolves the node credential to its node ID and records the
// node's last-seen time. It returns the node record it read through rd,
// which a report that takes no lock uses as is. rd may lag a moment (a
// node just deleted is refused a moment later), never by more.
func (s *Server) authNode(r *http.Request, rd store.KV) (string, *nodeRec, *apiError) {
	cred := bearer(r)
	unauthorized := &apiError{status: http.StatusUnauthorized, code: CodeUnauthorized, message: "missing or invalid node credential"}
	if !strings.HasPrefix(cred, secretNode) {
		return "", nil, unauthorized
	}
	h := hashSecret(cred)
	// A credential's node never changes, so the lookup is remembered; the
	// node record read next is what decides (a deleted node is refused).
	s.credMu.Lock()
	id, known := s.credNode[h]
	s.credMu.Unlock()
	if !known {
		// A database out of reach must not look like a revoked credential.
		if err := rd.Get(pfxNodeCred+h, &id); err != nil {
			if ae := storeFailure(err); ae != nil {
				return "", nil, ae
			}
			return "", nil, unauthorized
		}
	}
	n, err := s.readNode(rd, id)
	if err != nil || !hashesEqual(n.CredentialHash, h) {
		if ae := storeFailure(err); ae != nil {
			return "", nil, ae
		}
		return "", nil, unauthorized
	}
	if !known {
		s.credMu.Lock()
		if len(s.credNode) >= maxCredCache {
			clear(s.credNode)
		}
		s.credNode[h] = id
		s.credMu.Unlock()
	}
	s.seenMu.Lock()
	s.lastSeen[id] = s.now()
	s.seenMu.Unlock()
	if q := s.admitNode(id, s.cfg.Now()); q.wait > 0 {
		return id, nil, &apiError{status: http.StatusTooManyRequests, code: CodeRateLimited,
			message:    "too many requests from this node; retry after the Retry-After delay",
			retryAfter: int(math.Ceil(q.wait.Seconds()))}
	}
	return id, &n, nil
}

// maxCredCache bounds the remembered credential lookups (authNode); past
// it the cache starts over.
const maxCredCache = 1 << 17

// longPollWriteMargin is the time a long-poll's answer has to be written
// once its wait is over.
const longPollWriteMargin = 30 * time.Second

// nodeDesired answers a node's long-poll: its desired state as soon as its
// revision is newer than ?after=, or 204 after ?wait= seconds (at most
// MaxLongPoll) with nothing newer.
func (s *Server) nodeDesired(w http.ResponseWriter, r *http.Request) {
	// The node's own reads may lag a moment behind the newest commit: the
	// change that a lagging read missed wakes this long-poll again once
	// it has arrived here (its invalidation comes before its wake-up).
	rd := store.Lagging(s.st)
	id, _, e := s.authNode(r, rd)
	if e != nil {
		writeError(w, e)
		return
	}
	q := r.URL.Query()
	var after uint64
	if q.Has("after") {
		v, err := strconv.ParseUint(q.Get("after"), 10, 64)
		if err != nil {
			writeError(w, invalid("after", "after must be a non-negative integer revision"))
			return
		}
		after = v
	}
	wait := s.cfg.MaxLongPoll
	if q.Has("wait") {
		v, err := strconv.ParseFloat(q.Get("wait"), 64)
		if err != nil || v < 0 {
			writeError(w, invalid("wait", "wait must be a non-negative number of seconds"))
			return
		}
		wait = min(wait, time.Duration(v*float64(time.Second)))
	}
	// The server's write timeout bounds ordinary answers; a long-poll
	// answers after its wait, so it gets that on top (where the writer
	// supports deadlines: not under httptest's recorder).
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + longPollWriteMargin))
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		// Take the watcher before reading, so a change committed between
		// the read and the wait still wakes us.
		ch := s.watcher(id)
		// A revision below the node's means the state was rolled back (a
		// backup restored): the node is sent the state in force at once,
		// instead of waiting for revisions to pass its own again.
		d, changed, err := s.desired(rd, id, after)
		if err != nil {
			s.nodeInternal(w, err)
			return
		}
		if changed {
			writeJSON(w, http.StatusOK, d)
			return
		}
		s.waiting.Add(1)
		select {
		case <-ch:
			s.waiting.Add(-1)
		case <-timer.C:
			s.waiting.Add(-1)
			w.WriteHeader(http.StatusNoContent)
			return
		case <-r.Context().Done():
			s.waiting.Add(-1)
			return
		}
	}
}

// desired assembles a node's desired state, read through rd, if its
// revision is not after (the node has it already). The node record is read
// first, so the rest is never older than the revision it is sent with.
func (s *Server) desired(rd store.KV, nodeID string, after uint64) (d nodeapi.Desired, changed bool, _ error) {
	// On an embedded store the reads take the change lock shared, so none
	// falls between a change's writes. On a shared database other
	// replicas commit between them anyway (and a lagging read is as of a
	// moment ago), which the order of reads below already allows for;
	// there the lock would only make every change wait for the round trips
	// of the long-polls in flight.
	if s.shared == nil {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	n, err := s.readNode(rd, nodeID)
	if err != nil {
		return d, false, fmt.Errorf("load node %s: %w", nodeID, err)
	}
	if n.Revision < after && rd != s.st {
		// Behind what the node has seen: a restored backup, or a read
		// that lagged a commit the node learned of elsewhere. The
		// database decides, and the rest is read from it too, so it is
		// never older than the revision.
		rd = s.st
		if n, err = s.readNode(rd, nodeID); err != nil {
			return d, false, fmt.Errorf("load node %s: %w", nodeID, err)
		}
	}
	if n.Revision == after {
		return d, false, nil
	}
	d, err = s.assemble(rd, n)
	return d, err == nil, err
}

// assemble builds the desired state of node n.
func (s *Server) assemble(rd store.KV, n nodeRec) (nodeapi.Desired, error) {
	d := nodeapi.Desired{NodeID: n.ID, Revision: n.Revision, SSHKeys: []sshkeys.Key{}, FirewallRules: []firewall.Rule{},
		APIKeys: []nodeapi.APIKey{}}
	if n.ServerID == "" {
		// A node whose server went without its wipe keeps wiping.
		d.Wipe = n.WipePending
		return d, nil
	}
	var srv serverRec
	if err := rd.Get(keysOf(n.ServerProject).server(n.ServerID), &srv); err != nil {
		return nodeapi.Desired{}, fmt.Errorf("load server %s: %w", n.ServerID, err)
	}
	out := s.serverJSON(srv, true)
	d.Server = &nodeapi.Server{ID: srv.ID, Name: srv.Name, Stack: srv.Stack, Model: srv.Model}
	if out.DeploymentURL != nil {
		d.Server.DeploymentURL = *out.DeploymentURL
	}
	d.Model = srv.Model
	if srv.Status == StatusDeleting {
		d.Wipe = true
		return d, nil
	}
	for _, kid := range srv.SSHKeyIDs {
		var k sshKeyRec
		if err := rd.Get(keysOf(srv.Project).sshKey(kid), &k); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				continue
			}
			return nodeapi.Desired{}, fmt.Errorf("load SSH key %s: %w", kid, err)
		}
		d.SSHKeys = append(d.SSHKeys, sshkeys.Key{ID: k.ID, PublicKey: k.PublicKey, Fingerprint: k.Fingerprint})
	}
	// Oldest first: the order in which the rules were added.
	err := store.ScanJSON(rd, pfxRule+srv.ID+"/", func(_ string, r ruleRec) (bool, error) {
		rule := r.Rule
		rule.ID = r.ID
		d.FirewallRules = append(d.FirewallRules, rule)
		return true, nil
	})
	if err != nil {
		return nodeapi.Desired{}, fmt.Errorf("load rules of %s: %w", srv.ID, err)
	}
	if d.APIKeys, err = desiredAPIKeys(rd, srv.ID, s.now()); err != nil {
		return nodeapi.Desired{}, err
	}
	return d, nil
}

// converged reports whether a node has applied everything of its current
// revision rev: firewall rules, SSH keys and API keys without error, a
// healthy runtime and — for a deployment — the ordered model served and
// answering at that revision.
func converged(o nodeapi.Observed, rev uint64, srv serverRec) bool {
	applied := o.Revision >= rev && o.FirewallRevision >= rev && o.SSHKeysRevision >= rev && o.APIKeysRevision >= rev &&
		o.FirewallError == "" && o.SSHKeysError == "" && o.APIKeysError == "" && o.RuntimeError == "" && o.RuntimeHealthy
	if srv.Stack == StackDeployment {
		return applied && o.RuntimeRevision >= rev && o.RuntimeModel == srv.Model
	}
	return applied
}

// nodeObserved records what a node applied and moves its server through
// the lifecycle: provisioning (or failed) → running once converged, and
// deleting → gone once the node confirms the wipe, returning the node to
// the pool.
func (s *Server) nodeObserved(w http.ResponseWriter, r *http.Request) {
	rd := store.Lagging(s.st)
	id, node, e := s.authNode(r, rd)
	if e != nil {
		writeError(w, e)
		return
	}
	var o nodeapi.Observed
	if e := s.decodeJSON(r, &o); e != nil {
		writeError(w, e)
		return
	}
	if o.IP != "" {
		a, err := netip.ParseAddr(o.IP)
		if err != nil || a.Zone() != "" {
			writeError(w, invalid("ip", "ip must be an IPv4 or IPv6 address"))
			return
		}
		o.IP = a.Unmap().String()
	}
	// Most reports are a settled node saying the same again, which changes
	// nothing: that is decided first without the change lock (on a shared
	// database a round trip to its writer lock each), and only a report
	// that changes something takes it and decides again.
	now := s.now()
	dry := s.dryRun(rd)
	dry.preload(node)
	settled, e, err := s.applyReport(dry, id, o, now)
	dry.discard()
	if e == nil && err == nil && settled {
		s.noteReported(id, now)
		w.WriteHeader(http.StatusNoContent)
		return
	}
	// The reports that change something wait for the change lock together
	// and are applied in one change (foldReports).
	j := &reportJob{id: id, o: o, now: now, done: make(chan struct{})}
	s.queueReport(context.WithoutCancel(r.Context()), j)
	switch {
	case j.e != nil:
		writeError(w, j.e)
	case j.err != nil:
		s.nodeInternal(w, j.err)
	default:
		// Also a report whose only change is usage, which leaves the
		// node's observed state, and so its ObservedAt, as it was.
		s.noteReported(id, now)
		w.WriteHeader(http.StatusNoContent)
	}
}

// reportJob is a report that changes something, on its way into a change
// with the reports of other nodes that arrived while the lock was busy.
type reportJob struct {
	id  string
	o   nodeapi.Observed
	now time.Time
	// The outcome, set before done is closed: refused (e), failed (err),
	// or applied, settled if it changed nothing after all.
	e       *apiError
	err     error
	settled bool
	// delay is the propagation delay j reports (propagationDelay), or 0.
	delay time.Duration
	done  chan struct{}
}

// queueReport applies j and returns once it is durable or has failed.
// Reports are folded: one goroutine at a time (the leader) waits for the
// change lock on behalf of every report queued, and applies all that are
// queued once it holds it, in one change — one lock and one commit
// instead of one each (creates are folded alike: fold.go).
func (s *Server) queueReport(ctx context.Context, j *reportJob) {
	for lead := s.reports.join(j); lead; {
		lead = s.foldRound(ctx)
	}
	<-j.done
}

// foldRound takes the change lock, applies the queued reports and
// reports whether some were left for another round (a second report of a
// node already in this one), which the leader then takes as well.
func (s *Server) foldRound(ctx context.Context) (again bool) {
	unlock, err := s.lock(ctx)
	jobs, again := s.takeReports()
	if err == nil {
		err = s.foldReports(jobs)
		if uerr := unlock(); err == nil {
			err = uerr
		}
	}
	f := s.propagated.Load()
	for _, j := range jobs {
		if j.e == nil && j.err == nil {
			j.err = err
		}
		if f != nil && j.e == nil && j.err == nil && j.delay > 0 {
			(*f)(j.delay)
		}
		close(j.done)
	}
	return again
}

// propagationDelay is the time from the node's current revision's issue
// to j, if j is the first report that the node applied it; else 0.
func propagationDelay(m *mutation, j *reportJob) time.Duration {
	n, err := m.node(j.id)
	if err != nil || n.RevisionAt.IsZero() || j.o.Revision != n.Revision ||
		n.Observed != nil && n.Observed.Revision >= n.Revision {
		return 0
	}
	return max(j.now.Sub(n.RevisionAt), time.Nanosecond)
}

// takeReports empties the queue but for the later reports of a node
// already taken, which stay for the next round, and hands the lead on:
// with none left, the next report to arrive leads.
func (s *Server) takeReports() (jobs []*reportJob, again bool) {
	return s.reports.take(func(q []*reportJob) (jobs, rest []*reportJob) {
		taken := make(map[string]bool, len(q))
		for _, j := range q {
			if taken[j.id] {
				rest = append(rest, j)
				continue
			}
			taken[j.id] = true
			jobs = append(jobs, j)
		}
		return jobs, rest
	})
}

// foldReports applies reports of distinct nodes in one change, with the
// change lock held. Each touches only its node, its server and what is
// under that server, so no report decides on another's staged writes.
func (s *Server) foldReports(jobs []*reportJob) error {
	return s.buildFold(len(jobs), &s.reportChanges, func(m *mutation, i int) (failed bool) {
		j := jobs[i]
		before := m.staged()
		j.delay = propagationDelay(m, j)
		_, j.e, j.err = s.applyReport(m, j.id, j.o, j.now)
		j.settled = m.staged() == before
		return j.e != nil || j.err != nil
	})
}

// applyReport stages what a report changes in m and reports whether it
// changes nothing at all (a settled node's periodic report).
func (s *Server) applyReport(m *mutation, id string, o nodeapi.Observed, now time.Time) (settled bool, _ *apiError, _ error) {
	n, err := m.node(id)
	if err != nil {
		return false, nil, err
	}
	if e := checkReport(&o, n.Revision); e != nil {
		return false, e, nil
	}
	buckets, skipped, e := checkUsageBuckets(o.UsageBuckets, now)
	if e != nil {
		return false, e, nil
	}
	if skipped > 0 {
		m.logWarn("usage buckets no node can have made passed over", "node", id, "buckets", skipped)
	}
	o.UsageBuckets = buckets
	// Usage is kept per key (recordUsage) and over time (applyUsage), not
	// in the node record.
	kept := o
	kept.Usage, kept.UsageBuckets = nil, nil
	if n.Observed == nil || !reflect.DeepEqual(*n.Observed, kept) {
		n.Observed, n.ObservedAt, n.LastSeen = &kept, now, now
		m.saveNode(n)
	}
	if err := s.applyObserved(m, n, o, now); err != nil {
		return false, nil, err
	}
	return m.empty(), nil, nil
}

// noteReported keeps the time of a report that changed nothing; the sweep
// persists it (as it does last-seen times).
func (s *Server) noteReported(id string, now time.Time) {
	s.seenMu.Lock()
	s.reported[id] = now
	s.seenMu.Unlock()
}

func (s *Server) applyObserved(m *mutation, n *nodeRec, o nodeapi.Observed, now time.Time) error {
	if n.ServerID == "" {
		if n.WipePending && o.Wiped && o.Revision >= n.Revision {
			n.WipePending = false
			m.newRevision(n)
			m.saveNode(n)
			m.wake[n.ID] = true
			m.logInfo("node reported its wipe; back in the pool", "node", n.ID)
		}
		return nil
	}
	var srv serverRec
	if err := m.r.Get(keysOf(n.ServerProject).server(n.ServerID), &srv); err != nil {
		return fmt.Errorf("load server %s: %w", n.ServerID, err)
	}
	// The usage comes first: a wipe's report carries the last of it.
	if err := s.applyUsage(m, n.ID, srv, o.UsageBuckets, now); err != nil {
		return err
	}
	if srv.Status == StatusDeleting {
		if !o.Wiped || o.Revision < n.Revision {
			return nil
		}
		if err := s.removeServer(m, srv, now); err != nil {
			return err
		}
		n.ServerID, n.ServerProject = "", ""
		m.newRevision(n)
		m.saveNode(n)
		m.wake[n.ID] = true
		m.logInfo("server deleted", "server", srv.ID, "node", n.ID)
		return nil
	}
	if err := s.recordUsage(m, srv.ID, o.Usage); err != nil {
		return err
	}
	changed := false
	if srv.Status == StatusUnreachable {
		srv.restore()
		changed = true
		m.logInfo("server's node reports again", "server", srv.ID, "node", n.ID, "status", srv.Status)
	}
	if o.IP != "" && o.IP != srv.IP {
		srv.IP, changed = o.IP, true
	}
	switch srv.Status {
	case StatusProvisioning, StatusUpdating, StatusFailed:
		if converged(o, n.Revision, srv) {
			srv.Status, srv.StatusSince, changed = StatusRunning, now, true
			m.logInfo("server running", "server", srv.ID, "node", n.ID, "model", srv.Model)
		}
	}
	if len(srv.Actions) > 0 {
		acted, err := m.decideActions(&srv, o, now)
		if err != nil {
			return err
		}
		changed = changed || acted
	}
	if !changed {
		return nil
	}
	srv.UpdatedAt = now
	return m.put(srv.key(), srv)
}
