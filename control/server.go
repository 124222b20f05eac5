// Package control is hearth's control plane: the management API (/v1
// servers, SSH keys, firewall rules), the capacity pool of enrolled nodes,
// the server lifecycle and the server side of the node protocol (nodeapi).
//
// All state lives in the store package; every change is one synced batch
// that also advances a global revision, so a node's desired state is
// identified by the revision of its last change. The conventions of the API
// are described in README.md and openapi.json.
package control

import (
	"context"
	"crypto/cipher"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the embedded OpenAPI 3.1 document of the management API.
func OpenAPI() []byte { return append([]byte(nil), openAPIDoc...) }

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	Store store.KV
	// DeploymentURLTemplate builds a deployment server's public URL;
	// "{id}" and "{name}" are replaced. Default
	// "https://{name}.hearth.local/api/v1".
	DeploymentURLTemplate string
	// ProvisionTimeout is how long a server may stay provisioning (or
	// updating, after a model change) before it is marked failed. Default
	// 10 minutes.
	ProvisionTimeout time.Duration
	// NodeTimeout is how long a node may stay silent before its server
	// shows as unreachable. Default 90 s: three long-polls.
	NodeTimeout time.Duration
	// DeleteTimeout is how long a server stays deleting when its node does
	// not report the wipe; then the record goes and the node stays out of
	// the pool until it reports the wipe. Default 5 minutes.
	DeleteTimeout time.Duration
	// SweepInterval is how often Run checks timeouts, expires API keys and
	// purges idempotency keys. Default 5 s.
	SweepInterval time.Duration
	// IdempotencyTTL is how long Idempotency-Key answers are kept. Default
	// 24 h.
	IdempotencyTTL time.Duration
	// RateLimit and RateBurst set each API token's token bucket: RateLimit
	// requests per second refill a bucket of RateBurst. Defaults 20 and 40.
	RateLimit float64
	RateBurst int
	// NodeRateLimit and NodeRateBurst set each node's token bucket for the
	// node protocol (long-polls and reports together): a node that posts
	// faster gets 429 with Retry-After, so one node cannot slow the
	// management API for everyone. Defaults 10 and 40.
	NodeRateLimit float64
	NodeRateBurst int
	// MaxBodyBytes limits request bodies. Default 1 MiB.
	MaxBodyBytes int64
	// MaxLongPoll caps a node's desired-state long-poll. Default 30 s.
	MaxLongPoll time.Duration
	// UsageHourRetention and UsageDayRetention are how long usage is kept
	// by the hour and by the day. Defaults 14 and 400 days.
	UsageHourRetention time.Duration
	UsageDayRetention  time.Duration
	// Now is the clock. Default time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// Server serves the management API and the node protocol.
type Server struct {
	cfg Config
	st  store.KV
	log *slog.Logger

	// mu serialises every change: a change reads, decides and commits one
	// batch while holding it, so concurrent requests never both take the
	// same node, name or fingerprint. Desired-state reads on an embedded
	// store take it shared so that a node sees one consistent revision
	// (desired).
	mu  sync.RWMutex
	rev uint64 // last committed global revision
	// w is the store changes write through while mu is held: st itself,
	// or on a shared database the writer lock's view (store.Lock).
	w store.KV
	// shared is st as a database other replicas use too, or nil.
	shared store.Shared
	// held is set while mu is held through lock. pending are the changes
	// committed under it, and woken the nodes they changed: unlock waits
	// for their syncs after releasing the lock (group commit), logs the
	// events of each durable one, then wakes the nodes.
	held    bool
	pending []pendingChange
	woken   []string

	watchMu sync.Mutex
	watch   map[string]chan struct{} // node ID → closed on the node's next change
	// ownWake counts, per node, this process's commits in flight that will
	// wake it once durable (woken). Their notification, which reaches every
	// replica, this one too, may come before the commit's own answer, and
	// the long-poll it woke would read the node's new records from the
	// database: this process's read cache gets them only with that answer
	// (store/pgstore). So such a node is left to the local wake.
	ownWake map[string]int
	waiting atomic.Int64 // long-polls holding a watch channel, waiting for a change

	limMu    sync.Mutex
	limiters map[string]*rate.Limiter // API token ID → bucket
	// nodeCredit holds, per node, requests its own changes paid for
	// (admitNode).
	nodeCredit map[string]int

	tokMu   sync.Mutex
	tokUsed map[string]time.Time // API token ID → last request, ahead of the stored value

	credMu   sync.Mutex
	credNode map[string]string // node credential hash → node ID (authNode)
	nodes    nodeMemo          // node records decoded from the read cache (readNode)
	// fieldNames holds each request type's JSON field names (jsonFields).
	fieldNames sync.Map

	projMu    sync.Mutex
	projNames map[string]string // project ID → name; projects are never renamed

	// reports and changes wait for the change lock to be folded, each
	// queue with one leader at a time (fold.go).
	reports leadQueue[*reportJob]
	changes leadQueue[*changeJob]
	// reportChanges counts the changes that applied reports (foldReports),
	// apiChanges those that applied folded API changes (foldChanges).
	reportChanges, apiChanges atomic.Uint64

	// propagated is OnPropagation's function.
	propagated atomic.Pointer[func(time.Duration)]
	seenMu     sync.Mutex
	lastSeen   map[string]time.Time // node ID → last request, ahead of the stored value
	reported   map[string]time.Time // node ID → last report that changed nothing, ahead of ObservedAt
	persisted  map[string]seenRec   // node ID → its seen record as last written or read here (persistLastSeen)
	cursorAEAD cipher.AEAD          // seals list cursors (list.go)

	// auditLast is the time of the last audit log entry made here
	// (auditStamp).
	auditMu   sync.Mutex
	auditLast time.Time

	// usageChecked is when the sweep last looked for usage records past
	// their retention (Unix nanoseconds).
	usageChecked atomic.Int64

	// started bounds how long a node can have been silent: time the
	// control plane itself was down does not count against nodes.
	started time.Time
	// swept is closed once Run's first sweep has returned.
	swept     chan struct{}
	sweptOnce sync.Once
}

// New builds a Server over an open store.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("control: Config.Store is required")
	}
	if cfg.DeploymentURLTemplate == "" {
		cfg.DeploymentURLTemplate = "https://{name}.hearth.local/api/v1"
	}
	if cfg.ProvisionTimeout <= 0 {
		cfg.ProvisionTimeout = 10 * time.Minute
	}
	if cfg.NodeTimeout <= 0 {
		cfg.NodeTimeout = 90 * time.Second
	}
	if cfg.DeleteTimeout <= 0 {
		cfg.DeleteTimeout = 5 * time.Minute
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	if cfg.IdempotencyTTL <= 0 {
		cfg.IdempotencyTTL = 24 * time.Hour
	}
	if cfg.RateLimit <= 0 {
		cfg.RateLimit = 20
	}
	if cfg.RateBurst <= 0 {
		cfg.RateBurst = 40
	}
	if cfg.NodeRateLimit <= 0 {
		cfg.NodeRateLimit = 10
	}
	if cfg.NodeRateBurst <= 0 {
		cfg.NodeRateBurst = 40
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.MaxLongPoll <= 0 {
		cfg.MaxLongPoll = nodeapi.DefaultWait
	}
	if cfg.UsageHourRetention <= 0 {
		cfg.UsageHourRetention = 14 * 24 * time.Hour
	}
	if cfg.UsageDayRetention <= 0 {
		cfg.UsageDayRetention = 400 * 24 * time.Hour
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:        cfg,
		st:         cfg.Store,
		log:        cfg.Logger,
		watch:      map[string]chan struct{}{},
		ownWake:    map[string]int{},
		limiters:   map[string]*rate.Limiter{},
		nodeCredit: map[string]int{},
		tokUsed:    map[string]time.Time{},
		projNames:  map[string]string{},
		lastSeen:   map[string]time.Time{},
		reported:   map[string]time.Time{},
		persisted:  map[string]seenRec{},
		credNode:   map[string]string{},
		swept:      make(chan struct{}),
	}
	s.w = s.st
	s.shared, _ = s.st.(store.Shared)
	s.started = s.now()
	// Start-up writes (upgrades, the cursor key, index repairs) hold the
	// writer lock like any change, so replicas starting together agree.
	err := s.locked(context.Background(), func(w store.KV) error {
		if err := Migrate(w, s.started); err != nil {
			return err
		}
		if err := s.loadProjectNames(); err != nil {
			return fmt.Errorf("load projects: %w", err)
		}
		if err := s.loadCursorKey(); err != nil {
			return err
		}
		if err := s.rebuildFreeIndex(); err != nil {
			return err
		}
		return s.rebuildStatusIndex()
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// lock takes the change lock: this process's mutex and, on a shared
// database, the writer lock every replica takes, so a change reads,
// decides and commits with no other change in between anywhere. Until
// unlock, changes write through s.w. The revision is reloaded each time,
// since another replica may have moved it.
//
// unlock releases the lock, then waits until the changes committed under
// it are durable, and reports whether they are: an answer that
// acknowledges a change is written only after unlock returned nil. It may
// be called more than once; later calls do nothing.
func (s *Server) lock(ctx context.Context) (unlock func() error, err error) {
	s.mu.Lock()
	w, release, err := store.Lock(ctx, s.st, keyRevision)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("take the change lock: %w", err)
	}
	if s.shared != nil || s.rev == 0 {
		var rev uint64
		// Read with the lock, in its round trip, on a database.
		if err := w.Get(keyRevision, &rev); err != nil && !errors.Is(err, store.ErrNotFound) {
			release()
			s.mu.Unlock()
			return nil, fmt.Errorf("load revision: %w", err)
		}
		s.rev = rev
	}
	s.w, s.held = w, true
	var once sync.Once
	var syncErr error
	return func() error {
		once.Do(func() {
			pending, woken := s.pending, s.woken
			s.w, s.held, s.pending, s.woken = s.st, false, nil, nil
			release()
			s.mu.Unlock()
			for _, p := range pending {
				if err := p.wait(); err != nil {
					if syncErr == nil {
						syncErr = err
					}
					continue
				}
				s.logEvents(p.events)
			}
			for _, id := range woken {
				s.wakeOwn(id)
			}
		})
		return syncErr
	}, nil
}

// locked runs f holding the change lock, with the store to write through.
func (s *Server) locked(ctx context.Context, f func(w store.KV) error) error {
	unlock, err := s.lock(ctx)
	if err != nil {
		return err
	}
	err = f(s.w)
	if uerr := unlock(); err == nil {
		err = uerr
	}
	return err
}

func (s *Server) now() time.Time { return s.cfg.Now().UTC() }

// Run performs periodic work (Sweep) until ctx ends. On a shared database
// it also listens for the changes other replicas commit, to wake the
// long-polls of their nodes here.
func (s *Server) Run(ctx context.Context) error {
	if s.shared != nil {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			_ = s.shared.Listen(ctx, s.remoteWake)
		}()
	}
	t := time.NewTicker(s.cfg.SweepInterval)
	defer t.Stop()
	for {
		if err := s.Sweep(); err != nil {
			s.log.Error("control sweep", "err", err)
		}
		s.sweptOnce.Do(func() { close(s.swept) })
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// mutation is one change in progress: its batch, the revisions it takes and
// the nodes to wake once it is committed. It is used with s.mu held.
type mutation struct {
	s *Server
	// r is what the change reads through: the store itself, or for a dry
	// run a reader that may lag a moment (store.Lagging).
	r    store.KV
	b    store.Batch
	rev  uint64
	wake map[string]bool
	// nodes are the node records as this change sees them; those in dirty
	// are written at commit. One change may edit a node twice (a sweep
	// records its last-seen time and bumps its revision), and each edit
	// must build on the other rather than on the stored record.
	nodes map[string]*nodeRec
	dirty map[string]bool
	// orig is each loaded node's key in the pool index as stored, so the
	// commit moves it when the node is taken or freed (capacity.go).
	orig map[string]string
	// srvStatus is each server's status as this change left it, for the
	// status index (statusindex.go).
	srvStatus map[string]string
	// seen are the nodes' seen records as the sweep persisted them in
	// this change (nil if it did not).
	seen map[string]seenRec
	// rev0 is the revision the change started from; dry marks a change
	// only tried without the lock, to see whether it changes anything: it
	// is never committed and logs nothing.
	rev0 uint64
	dry  bool
	// puts counts the records staged through put, so that a change that
	// folds several nodes' reports tells which of them wrote anything.
	puts int
	// events are logged once the change is durable (logInfo).
	events []logEvent
	// names are the server name index entries this change staged (a
	// fold's creates: fold.go), name key → server ID.
	names map[string]string
	// usage are the usage records this change adds to (usage.go), by
	// key, written at commit.
	usage map[string]*usageRec
}

// dryRun starts a change to be tried without the change lock and then
// discarded (mutation.dry), reading through rd.
func (s *Server) dryRun(rd store.KV) *mutation {
	return &mutation{s: s, r: rd, b: s.st.NewBatch(), dry: true, wake: map[string]bool{},
		nodes: map[string]*nodeRec{}, dirty: map[string]bool{}, orig: map[string]string{}}
}

// preload makes n (just read) the change's view of its node, saving the
// read.
func (m *mutation) preload(n *nodeRec) {
	if n != nil {
		m.nodes[n.ID] = n
		m.orig[n.ID] = freeKey(n)
	}
}

// logInfo notes an event of the change, logged once the change is durable:
// never for a dry run, a change discarded (a fold rebuilt without a refused
// report) or one whose commit failed.
func (m *mutation) logInfo(msg string, args ...any) {
	if !m.dry {
		m.events = append(m.events, logEvent{slog.LevelInfo, msg, args})
	}
}

// logWarn is logInfo at warning level.
func (m *mutation) logWarn(msg string, args ...any) {
	if !m.dry {
		m.events = append(m.events, logEvent{slog.LevelWarn, msg, args})
	}
}

// logEvent is an event a change logs once committed.
type logEvent struct {
	level slog.Level
	msg   string
	args  []any
}

// pendingChange is a change committed under the lock, waiting for its sync.
type pendingChange struct {
	wait   func() error
	events []logEvent
}

// logEvents logs a committed change's events.
func (s *Server) logEvents(events []logEvent) {
	for _, ev := range events {
		s.log.Log(context.Background(), ev.level, ev.msg, ev.args...)
	}
}

func (s *Server) begin() *mutation {
	return &mutation{s: s, r: s.st, b: s.w.NewBatch(), rev: s.rev, rev0: s.rev, wake: map[string]bool{},
		nodes: map[string]*nodeRec{}, dirty: map[string]bool{}, orig: map[string]string{}}
}

// node returns a node as this change sees it, its staged edits included.
// Edits through the pointer are written at commit once saveNode marks it.
func (m *mutation) node(id string) (*nodeRec, error) {
	if n, ok := m.nodes[id]; ok {
		return n, nil
	}
	var n nodeRec
	if err := m.r.Get(pfxNode+id, &n); err != nil {
		return nil, fmt.Errorf("load node %s: %w", id, err)
	}
	m.nodes[id] = &n
	m.orig[id] = freeKey(&n)
	return &n, nil
}

// loadNodes reads the nodes of ids this change has not read yet, all at
// once (one round trip on a database, where node per id would cost one
// each: a sweep touches every node that reported). Missing nodes are
// skipped; node reports them as not found.
func (m *mutation) loadNodes(ids []string) error {
	keys := make([]string, 0, len(ids))
	for _, id := range ids {
		if _, ok := m.nodes[id]; !ok {
			keys = append(keys, pfxNode+id)
		}
	}
	return store.GetMany(m.r, keys, func(key string, val []byte) error {
		var n nodeRec
		if err := json.Unmarshal(val, &n); err != nil {
			return fmt.Errorf("decode %s: %w", key, err)
		}
		id := key[len(pfxNode):]
		m.nodes[id] = &n
		m.orig[id] = freeKey(&n)
		return nil
	})
}

// saveNode marks a node edited in this change, to be written at commit.
func (m *mutation) saveNode(n *nodeRec) {
	m.nodes[n.ID] = n
	m.dirty[n.ID] = true
}

// bump gives a node a new desired revision and wakes its long-poll once
// the change is committed. Each node counts its own revisions: the global
// revision would tell a tenant, who sees its server's revisions and can
// read its node's, how busy every other tenant is.
func (m *mutation) bump(nodeID string) error {
	_, err := m.bumpRev(nodeID)
	return err
}

// bumpRev is bump, returning the node's new revision.
func (m *mutation) bumpRev(nodeID string) (uint64, error) {
	n, err := m.node(nodeID)
	if err != nil {
		return 0, err
	}
	m.newRevision(n)
	m.wake[nodeID] = true
	m.saveNode(n)
	return n.Revision, nil
}

// newRevision gives n its next desired revision, issued now.
func (m *mutation) newRevision(n *nodeRec) {
	n.Revision++
	n.RevisionAt = m.s.now()
}

// staged is how far the change has staged, to tell whether a step staged
// anything.
func (m *mutation) staged() [3]uint64 { return [3]uint64{uint64(len(m.dirty)), uint64(m.puts), m.rev} }

// nextRev takes the next global revision.
func (m *mutation) nextRev() uint64 {
	m.rev++
	return m.rev
}

func (m *mutation) put(key string, v any) error {
	m.puts++
	if err := m.b.Put(key, v); err != nil {
		return fmt.Errorf("stage %s: %w", key, err)
	}
	// A server record carries its entry in the status index along.
	switch rec := v.(type) {
	case serverRec:
		return m.indexServer(rec)
	case *serverRec:
		return m.indexServer(*rec)
	}
	return nil
}

// commit makes the change durable, then wakes the nodes it touched.
func (m *mutation) commit() error {
	for k, r := range m.usage {
		if err := m.b.Put(k, r); err != nil {
			m.b.Discard()
			return fmt.Errorf("stage %s: %w", k, err)
		}
	}
	for id := range m.dirty {
		n := m.nodes[id]
		if err := m.put(pfxNode+id, n); err != nil {
			m.b.Discard()
			return err
		}
		old, ok := m.orig[id]
		if !ok {
			var stored nodeRec
			if err := m.s.st.Get(pfxNode+id, &stored); err == nil {
				old = freeKey(&stored)
			}
		}
		if k := freeKey(n); k != old {
			if old != "" {
				m.b.Delete(old)
			}
			if k != "" {
				if err := m.b.PutRaw(k, nil); err != nil {
					m.b.Discard()
					return err
				}
			}
		}
	}
	if m.rev != m.s.rev {
		if err := m.b.Put(keyRevision, m.rev); err != nil {
			m.b.Discard()
			return fmt.Errorf("stage revision: %w", err)
		}
	}
	// Replicas wake their own long-polls of these nodes.
	if n, ok := m.b.(store.Notifier); ok {
		for id := range m.wake {
			n.Notify(wakePrefix + id)
		}
	}
	if ac, ok := m.b.(store.AsyncCommitter); ok && m.s.held {
		wait, err := ac.CommitAsync()
		if err != nil {
			return fmt.Errorf("commit change: %w", err)
		}
		m.s.rev = m.rev
		m.s.pending = append(m.s.pending, pendingChange{wait, m.events})
		m.s.watchMu.Lock()
		for id := range m.wake {
			m.s.woken = append(m.s.woken, id)
			m.s.ownWake[id]++
		}
		m.s.watchMu.Unlock()
		return nil
	}
	if err := m.b.Commit(); err != nil {
		return fmt.Errorf("commit change: %w", err)
	}
	m.s.rev = m.rev
	m.s.logEvents(m.events)
	for id := range m.wake {
		m.s.wakeNode(id)
	}
	return nil
}

func (m *mutation) discard() { m.b.Discard() }

// noteEmpty tells a store with a read cache that nothing is under these
// prefixes once the change commits (store.EmptyNoter).
func (m *mutation) noteEmpty(prefixes ...string) {
	if en, ok := m.b.(store.EmptyNoter); ok {
		for _, p := range prefixes {
			en.NoteEmpty(p)
		}
	}
}

// empty reports whether the change has nothing to write.
func (m *mutation) empty() bool {
	return len(m.dirty) == 0 && len(m.usage) == 0 && m.rev == m.rev0 && m.b.Empty()
}

// watcher returns a channel closed at the node's next change.
func (s *Server) watcher(nodeID string) <-chan struct{} {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	ch, ok := s.watch[nodeID]
	if !ok {
		ch = make(chan struct{})
		s.watch[nodeID] = ch
	}
	return ch
}

func (s *Server) wakeNode(nodeID string) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	s.wakeLocked(nodeID)
}

// wakeLocked wakes nodeID's long-poll for a change of its desired state,
// and credits the node the requests that change will cost it; with watchMu
// held.
func (s *Server) wakeLocked(nodeID string) {
	if ch, ok := s.watch[nodeID]; ok {
		close(ch)
		delete(s.watch, nodeID)
	}
	s.creditNode(nodeID)
}

// wakeOwn wakes nodeID for one of this process's commits (ownWake), once
// it is done.
func (s *Server) wakeOwn(nodeID string) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if n := s.ownWake[nodeID]; n > 1 {
		s.ownWake[nodeID] = n - 1
	} else {
		delete(s.ownWake, nodeID)
	}
	s.wakeLocked(nodeID)
}

// Handler returns the HTTP handler of the management API and node protocol.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(path string, methods map[string]http.HandlerFunc) {
		allow := make([]string, 0, len(methods))
		for m, h := range methods {
			mux.HandleFunc(m+" "+path, h)
			allow = append(allow, m)
		}
		slices.Sort(allow)
		allowed := strings.Join(allow, ", ")
		// The method-less pattern is less specific, so it only catches the
		// methods not registered above.
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			if !s.gateManaged(w, r) {
				return
			}
			w.Header().Set("Allow", allowed)
			writeError(w, &apiError{status: http.StatusMethodNotAllowed, code: CodeMethodNotAllowed,
				message: fmt.Sprintf("method %s is not allowed here; allowed: %s", r.Method, allowed)})
		})
	}
	route("/v1/servers", map[string]http.HandlerFunc{
		"GET":  s.api(s.listServers),
		"POST": s.apiFold(s.createServer, s.warmCreateServer),
	})
	route("/v1/servers/{id}", map[string]http.HandlerFunc{
		"GET":    s.api(s.getServer),
		"PATCH":  s.api(s.patchServer),
		"DELETE": s.api(s.deleteServer),
	})
	route("/v1/servers/{server_id}/api-keys", map[string]http.HandlerFunc{
		"GET":  s.api(s.listAPIKeys),
		"POST": s.api(s.createAPIKey),
	})
	route("/v1/servers/{server_id}/api-keys/{key_id}", map[string]http.HandlerFunc{
		"GET":    s.api(s.getAPIKey),
		"DELETE": s.api(s.deleteAPIKey),
	})
	route("/v1/usage", map[string]http.HandlerFunc{"GET": s.api(s.getUsage)})
	route("/v1/servers/{id}/usage", map[string]http.HandlerFunc{"GET": s.api(s.getServerUsage)})
	route("/v1/servers/{id}/actions", map[string]http.HandlerFunc{"GET": s.api(s.listServerActions)})
	route("/v1/actions", map[string]http.HandlerFunc{"GET": s.api(s.listActions)})
	route("/v1/actions/{id}", map[string]http.HandlerFunc{"GET": s.api(s.getAction)})
	route("/v1/audit-log", map[string]http.HandlerFunc{"GET": s.api(s.listAudit)})
	route("/v1/ssh-keys", map[string]http.HandlerFunc{
		"GET":  s.api(s.listSSHKeys),
		"POST": s.api(s.createSSHKey),
	})
	route("/v1/ssh-keys/{id}", map[string]http.HandlerFunc{
		"GET":    s.api(s.getSSHKey),
		"DELETE": s.api(s.deleteSSHKey),
	})
	route("/v1/servers/{server_id}/firewall-rules", map[string]http.HandlerFunc{
		"GET":  s.api(s.listRules),
		"POST": s.api(s.createRule),
	})
	route("/v1/servers/{server_id}/firewall-rules/{rule_id}", map[string]http.HandlerFunc{
		"GET":    s.api(s.getRule),
		"DELETE": s.api(s.deleteRule),
	})
	route("/v1/openapi.json", map[string]http.HandlerFunc{
		"GET": func(w http.ResponseWriter, r *http.Request) { writeRaw(w, http.StatusOK, openAPIDoc) },
	})
	route("/v1/nodes/enroll", map[string]http.HandlerFunc{"POST": s.enroll})
	route("/v1/nodes/self/desired", map[string]http.HandlerFunc{"GET": s.nodeDesired})
	route("/v1/nodes/self/observed", map[string]http.HandlerFunc{"POST": s.nodeObserved})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if !s.gateManaged(w, r) {
			return
		}
		writeError(w, notFound("", "no such endpoint: %s", r.URL.Path))
	})
	return s.frame(mux)
}

// gateManaged gates a 404 or 405 answer under the management API like the
// API's own answers (a token, its bucket and RateLimit-* headers); the node
// protocol and the public OpenAPI document answer them as they are.
func (s *Server) gateManaged(w http.ResponseWriter, r *http.Request) bool {
	p := r.URL.Path
	if !strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/v1/nodes/") || p == "/v1/openapi.json" {
		return true
	}
	_, ok := s.gate(w, r, false)
	return ok
}

// frame wraps every request: a request ID on every answer, the body limit,
// and a JSON 500 instead of a dropped connection if a handler panics.
func (s *Server) frame(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rid := newID(prefixRequest)
		w.Header().Set("X-Request-Id", rid)
		r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("handler panic", "request_id", rid, "method", r.Method, "path", r.URL.Path, "panic", v)
				writeError(w, &apiError{status: http.StatusInternalServerError, code: CodeInternal, message: "internal error"})
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// wakePrefix marks the notifications that name a node whose desired state
// changed.
const wakePrefix = "wake/"

// remoteWake handles a notification from the shared database: a node's
// change committed by any replica, or "" after the notifications were
// interrupted, when every long-poll here rechecks.
func (s *Server) remoteWake(payload string) {
	if id, ok := strings.CutPrefix(payload, wakePrefix); ok {
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		// A commit of this process that wakes the node is in flight: the
		// node is woken once that is done, and so after this notification
		// and the invalidation before it were applied here; its long-poll
		// then reads this change too.
		if s.ownWake[id] == 0 {
			s.wakeLocked(id)
		}
		return
	}
	if payload == "" {
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		for id, ch := range s.watch {
			close(ch)
			delete(s.watch, id)
		}
	}
}
