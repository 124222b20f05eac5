// Package pgstore keeps the control plane's records in PostgreSQL, so that
// several control-plane processes (replicas) can share one state and the
// state is as safe as the database's own replication and backups.
//
// It offers the same key/value surface as the embedded Pebble store
// (store.KV) over one table of bytewise-ordered keys, the shape Kubernetes'
// kine uses to put etcd's model on SQL. The control plane's records, indexes
// and invariants stay in one place (package control) for both engines, and
// `hearth-control migrate-store` is a plain copy.
//
// Writers serialise on one locked row (store.Shared): a change locks it,
// reads, decides and commits its batch in the same transaction, so the
// capacity pick, name uniqueness and idempotency stay exact across replicas,
// and a writer whose connection (and so lock) was lost cannot commit. The
// SQL is the subset CockroachDB shares with PostgreSQL: BYTEA keys,
// INSERT … ON CONFLICT, UPDATE … RETURNING as the lock. LISTEN/NOTIFY, which
// CockroachDB lacks, only speeds up waking a node's long-poll; the control
// plane polls as well.
package pgstore

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/hearthd/hearth/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// notifyChannel is the LISTEN/NOTIFY channel of store.Notifier payloads.
const notifyChannel = "hearth_control"

// firstPage and maxPage bound how many records a scan reads per query:
// scans never hold a connection while the caller's function runs, and a
// long scan is not one huge result. Pages start small and double, since
// many scans stop at their first records (a capacity pick, a list page).
const (
	firstPage = 16
	maxPage   = 256
)

// Options configure Open.
type Options struct {
	// OpTimeout bounds every single operation, so a database that stops
	// answering gives an error instead of a hang. Default 10 s.
	OpTimeout time.Duration
	// MaxConns is the connection pool's size. Default 16.
	MaxConns int32
	// Logger receives the listener's reconnects. Default discards.
	Logger *slog.Logger
	// KeepOpen opens every connection of both pools at start and keeps
	// them open (unless the URL sets pool_min_conns), so that a burst of
	// requests never waits for connections to be made: a pool grown on
	// demand made the first creates of a burst wait 300 ms and more, the
	// writer lock's holder among them, whose reads share the read pool.
	KeepOpen bool
}

// Store is a PostgreSQL database holding the control plane's records.
type Store struct {
	pool *pgxpool.Pool
	// writers holds the connections that take the writer lock (sections
	// and batches of their own), apart from pool: a lock holder waiting
	// for a connection behind the reads in flight (hundreds a second from
	// a fleet's long-polls and reports) holds every change up meanwhile.
	writers *pgxpool.Pool
	url     string
	op      time.Duration
	log     *slog.Logger
	// crdb is set on CockroachDB, which has neither advisory locks nor
	// LISTEN/NOTIFY: notifications are dropped and Listen only waits.
	crdb bool
	// cache holds records read, kept current while Listen runs (cache.go).
	cache cache
	// dbReads counts point reads that went to the database, dbLists the
	// whole prefixes (tests).
	dbReads, dbLists atomic.Int64
}

var (
	_ store.Shared         = (*Store)(nil)
	_ store.RawGetter      = (*Store)(nil)
	_ store.RawGetter      = (*lagging)(nil)
	_ store.Notifier       = (*batch)(nil)
	_ store.AsyncCommitter = (*batch)(nil)
)

// Open connects to the database at url (postgres://…), waits at most
// OpTimeout for it to answer and brings its schema up to date. A database
// that cannot be reached is an error wrapping store.ErrUnavailable.
func Open(ctx context.Context, url string, o Options) (*Store, error) {
	if o.OpTimeout <= 0 {
		o.OpTimeout = 10 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 16
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL, password included.
		return nil, errors.New("database URL: not a valid postgres:// URL or connection string")
	}
	cfg.MaxConns = o.MaxConns
	if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > o.OpTimeout {
		cfg.ConnConfig.ConnectTimeout = o.OpTimeout
	}
	wcfg := cfg.Copy()
	wcfg.MaxConns = writerConns
	if o.KeepOpen && cfg.MinConns == 0 {
		cfg.MinConns, wcfg.MinConns = cfg.MaxConns, wcfg.MaxConns
		// Opened together, they would all reach their lifetime together.
		for _, c := range []*pgxpool.Config{cfg, wcfg} {
			if c.MaxConnLifetimeJitter == 0 {
				c.MaxConnLifetimeJitter = c.MaxConnLifetime / 4
			}
		}
	}
	wcfg.MinConns = min(wcfg.MinConns, wcfg.MaxConns) // a pool_min_conns for the reads
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	writers, err := pgxpool.NewWithConfig(ctx, wcfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("database: %w", err)
	}
	s := &Store{pool: pool, writers: writers, url: url, op: o.OpTimeout, log: o.Logger}
	pctx, cancel := context.WithTimeout(ctx, o.OpTimeout)
	defer cancel()
	var version string
	if err := pool.QueryRow(pctx, "SELECT version()").Scan(&version); err != nil {
		s.closePools()
		return nil, fmt.Errorf("database %s: %w", redact(cfg), classify(err))
	}
	s.crdb = strings.Contains(version, "CockroachDB")
	if err := s.migrate(ctx); err != nil {
		s.closePools()
		return nil, err
	}
	return s, nil
}

// writerConns sizes the pool of writer-lock connections: the section
// this process holds (one at a time, under the control plane's mutex),
// the commits it sent that are still being answered, and batches of
// their own. More would only wait on the lock row.
const writerConns = 4

func (s *Store) closePools() {
	s.pool.Close()
	s.writers.Close()
}

// redact names the database without its password.
func redact(cfg *pgxpool.Config) string {
	c := cfg.ConnConfig
	return fmt.Sprintf("%s@%s/%s", c.User, net.JoinHostPort(c.Host, fmt.Sprint(c.Port)), c.Database)
}

// migrate runs the embedded, versioned migrations (goose). On PostgreSQL a
// session advisory lock keeps replicas starting together from running them
// twice; the statements are idempotent besides, for engines without it.
func (s *Store) migrate(ctx context.Context) error {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	opts := []goose.ProviderOption{}
	if locker, err := lock.NewPostgresSessionLocker(); err == nil && !s.crdb {
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, opts...)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	mctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := p.Up(mctx); err != nil {
		return fmt.Errorf("migrate database schema: %w", classify(err))
	}
	return nil
}

// Close closes the connection pools.
func (s *Store) Close() error {
	s.closePools()
	return nil
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.op)
}

// Get decodes the record at key into v.
func (s *Store) Get(key string, v any) error { return s.get(key, v, nil) }

// Has reports whether key exists.
func (s *Store) Has(key string) (bool, error) { return s.has(key, nil) }

// get reads key from the cache where allowed (cache.lookup's min), else
// from the database, raising *min to the commit the database read saw.
func (s *Store) get(key string, v any, min *uint64) error {
	val, err := s.getRaw(key, min)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(val, v); err != nil {
		return fmt.Errorf("decode %q: %w", key, err)
	}
	return nil
}

// GetRaw returns the record at key as stored (store.RawGetter): the
// cache's own slice while the record is unchanged.
func (s *Store) GetRaw(key string) ([]byte, error) { return s.getRaw(key, nil) }

func (s *Store) getRaw(key string, min *uint64) ([]byte, error) {
	r, err := s.read(key, min)
	if err != nil {
		return nil, err
	}
	if !r.found {
		return nil, store.ErrNotFound
	}
	return r.val, nil
}

func (s *Store) has(key string, min *uint64) (bool, error) {
	r, err := s.read(key, min)
	return r.found, err
}

// readSQL reads one record and the commit sequence in one statement, so
// the record is known to be as of that commit (the lock row always exists).
const readSQL = "SELECT l.seq, kv.k IS NOT NULL, kv.v FROM hearth_lock l " +
	"LEFT JOIN hearth_kv kv ON kv.k = $1 WHERE l.id = 1"

func (s *Store) read(key string, min *uint64) (cached, error) {
	if r, ok := s.cache.lookup(key, min); ok {
		return r, nil
	}
	s.dbReads.Add(1)
	ctx, cancel := s.ctx()
	defer cancel()
	var r cached
	var at int64
	if err := s.pool.QueryRow(ctx, readSQL, []byte(key)).Scan(&at, &r.found, &r.val); err != nil {
		return cached{}, fmt.Errorf("get %q: %w", key, classify(err))
	}
	s.cache.fill(key, r, uint64(at))
	if min != nil {
		*min = max(*min, uint64(at))
	}
	return r, nil
}

// GetMany reads the records of keys (store.MultiGetter): those the cache
// may answer from it, the rest in one query. fn must not keep or modify
// val.
func (s *Store) GetMany(keys []string, fn func(key string, val []byte) error) error {
	return s.getMany(keys, fn, nil)
}

// getMany is GetMany with the cache allowed as for get.
func (s *Store) getMany(keys []string, fn func(key string, val []byte) error, min *uint64) error {
	var ks [][]byte
	for _, k := range keys {
		if r, ok := s.cache.lookup(k, min); ok {
			if !r.found {
				continue
			}
			if err := fn(k, r.val); err != nil {
				return err
			}
			continue
		}
		ks = append(ks, []byte(k))
	}
	if len(ks) == 0 {
		return nil
	}
	s.dbReads.Add(int64(len(ks)))
	ctx, cancel := s.ctx()
	defer cancel()
	// One row per record found, or one with NULL k if none was; each
	// carries the commit sequence, so what was read can be cached.
	rows, err := s.pool.Query(ctx, "SELECT l.seq, kv.k, kv.v FROM hearth_lock l "+
		"LEFT JOIN hearth_kv kv ON kv.k = ANY($1) WHERE l.id = 1", ks)
	if err != nil {
		return fmt.Errorf("get %d keys: %w", len(ks), classify(err))
	}
	defer rows.Close()
	var at int64
	found := make(map[string]bool, len(ks))
	for rows.Next() {
		var k, v []byte
		if err := rows.Scan(&at, &k, &v); err != nil {
			return fmt.Errorf("get %d keys: %w", len(ks), classify(err))
		}
		if k == nil {
			continue
		}
		found[string(k)] = true
		s.cache.fill(string(k), cached{val: v, found: true}, uint64(at))
		if err := fn(string(k), v); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("get %d keys: %w", len(ks), classify(err))
	}
	for _, k := range ks {
		if !found[string(k)] {
			s.cache.fill(string(k), cached{}, uint64(at))
		}
	}
	if min != nil {
		*min = max(*min, uint64(at))
	}
	return nil
}

// Lagging returns a reader of the store whose reads may be answered from
// the cache as of a commit a moment ago (the notification's way from the
// database), never older than anything it read before (store.Lagging).
// It serves one goroutine.
func (s *Store) Lagging() store.KV { return &lagging{Store: s} }

// lagging reads through the cache as of at least min, the newest commit
// any of its reads so far has seen.
type lagging struct {
	*Store
	min uint64
}

func (l *lagging) Get(key string, v any) error { return l.get(key, v, &l.min) }

func (l *lagging) Has(key string) (bool, error) { return l.has(key, &l.min) }

func (l *lagging) GetRaw(key string) ([]byte, error) { return l.getRaw(key, &l.min) }

func (l *lagging) GetMany(keys []string, fn func(key string, val []byte) error) error {
	return l.getMany(keys, fn, &l.min)
}

func (l *lagging) Scan(prefix, start string, reverse bool, fn func(key string, val []byte) (bool, error)) error {
	return l.scan(prefix, start, reverse, fn, &l.min)
}

// Close of a reader closes nothing: the Store is its owner's.
func (l *lagging) Close() error { return nil }

// Put writes one record.
func (s *Store) Put(key string, v any) error { return store.PutOne(s.NewBatch, key, v) }

// Delete removes one record.
func (s *Store) Delete(key string) error { return store.DeleteOne(s.NewBatch, key) }

// Scan visits the records under prefix page by page. Unlike Pebble's
// iterator it is not one snapshot: a record changed during a long scan may
// be seen as of any page. Callers that need one view hold the writer lock.
func (s *Store) Scan(prefix, start string, reverse bool, fn func(key string, val []byte) (bool, error)) error {
	return s.scan(prefix, start, reverse, fn, nil)
}

// scan is Scan with the cache allowed as for get (least as get's min). A
// whole prefix that ends in "/" is read first with the commit sequence,
// and kept as one list if it fits in that first page (a server's rules or
// API keys, what a long-poll lists); a longer one goes on page by page.
func (s *Store) scan(prefix, start string, reverse bool, fn func(key string, val []byte) (bool, error), least *uint64) error {
	lower := []byte(prefix)
	upper := prefixEnd(lower)
	if start != "" {
		if reverse {
			upper = []byte(start)
		} else {
			lower = []byte(start)
		}
	}
	first := true
	size := firstPage
	var page []row
	var err error
	if start == "" && strings.HasSuffix(prefix, "/") {
		if rows, ok := s.cache.lookupList(prefix, least); ok {
			for i := range rows {
				r := rows[i]
				if reverse {
					r = rows[len(rows)-1-i]
				}
				if more, err := fn(string(r.k), r.v); err != nil || !more {
					return err
				}
			}
			return nil
		}
		page, err = s.list(prefix, lower, upper, reverse, least)
	} else {
		page, err = s.page(lower, upper, reverse, first, size)
	}
	for {
		if err != nil {
			return fmt.Errorf("scan %q: %w", prefix, err)
		}
		for _, r := range page {
			more, err := fn(string(r.k), r.v)
			if err != nil {
				return err
			}
			if !more {
				return nil
			}
		}
		if len(page) < size {
			return nil
		}
		size = min(2*size, maxPage)
		last := page[len(page)-1].k
		if reverse {
			upper = last
		} else {
			lower, first = last, false
		}
		page, err = s.page(lower, upper, reverse, first, size)
	}
}

// listSQL reads the first page of a prefix in order (%s: ASC or DESC) and,
// in the same statement (one snapshot), the commit sequence it is as of:
// the first branch's row.
const listSQL = "SELECT seq, NULL::bytea, NULL::bytea FROM hearth_lock WHERE id = 1 " +
	"UNION ALL (SELECT NULL, k, v FROM hearth_kv WHERE k >= $1 AND k < $2 ORDER BY k %s LIMIT %d)"

var (
	listAsc  = fmt.Sprintf(listSQL, "ASC", firstPage)
	listDesc = fmt.Sprintf(listSQL, "DESC", firstPage)
)

// list reads the first page of prefix, [lower, upper), in scan order, and
// keeps it in the cache if it is every record under the prefix.
func (s *Store) list(prefix string, lower, upper []byte, reverse bool, least *uint64) ([]row, error) {
	s.dbLists.Add(1)
	q := listAsc
	if reverse {
		q = listDesc
	}
	ctx, cancel := s.ctx()
	defer cancel()
	res, err := s.pool.Query(ctx, q, lower, upper)
	if err != nil {
		return nil, classify(err)
	}
	var at *int64
	rows, err := pgx.CollectRows(res, func(r pgx.CollectableRow) (row, error) {
		var x row
		var seq *int64
		err := r.Scan(&seq, &x.k, &x.v)
		if seq != nil {
			at = seq
		}
		return x, err
	})
	if err != nil {
		return nil, classify(err)
	}
	// The sequence's row, wherever the engine put it, is not a record;
	// UNION ALL promises no order, so the records are put in it here.
	rows = slices.DeleteFunc(rows, func(r row) bool { return r.k == nil })
	slices.SortFunc(rows, func(a, b row) int { return bytes.Compare(a.k, b.k) })
	if at != nil {
		if len(rows) < firstPage {
			s.cache.fillList(prefix, slices.Clone(rows), uint64(*at))
		}
		if least != nil {
			*least = max(*least, uint64(*at))
		}
	}
	if reverse {
		slices.Reverse(rows)
	}
	return rows, nil
}

type row struct{ k, v []byte }

// page reads up to size records in [lower, upper) (upper nil: no bound)
// in order; after the first forward page lower itself is excluded.
func (s *Store) page(lower, upper []byte, reverse, inclusive bool, size int) ([]row, error) {
	q := "SELECT k, v FROM hearth_kv WHERE k >= $1"
	if !inclusive {
		q = "SELECT k, v FROM hearth_kv WHERE k > $1"
	}
	args := []any{lower}
	if upper != nil {
		q += " AND k < $2"
		args = append(args, upper)
	}
	if reverse {
		q += " ORDER BY k DESC"
	} else {
		q += " ORDER BY k"
	}
	q += fmt.Sprintf(" LIMIT %d", size)
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, classify(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.k, &x.v)
		return x, err
	})
	if err != nil {
		return nil, classify(err)
	}
	return out, nil
}

// prefixEnd is the first key after every key starting with p; nil if none.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// op is one staged write: a delete when del.
type op struct {
	k, v []byte
	del  bool
}

// batch stages writes and commits them in one transaction holding the
// writer lock (its section's, or its own).
type batch struct {
	s     *Store
	sec   *section
	ops   []op
	notes []string
	// empties are prefixes with no record once the batch commits
	// (NoteEmpty).
	empties []string
	done    bool
}

// NewBatch starts a batch that takes the writer lock for its commit.
func (s *Store) NewBatch() store.Batch { return &batch{s: s} }

func (b *batch) Put(key string, v any) error {
	val, err := store.EncodeJSON(key, v)
	if err != nil {
		return err
	}
	return b.PutRaw(key, val)
}

func (b *batch) PutRaw(key string, val []byte) error {
	// Non-nil even when empty: pgx sends a nil slice as NULL.
	b.ops = append(b.ops, op{k: []byte(key), v: append([]byte{}, val...)})
	return nil
}

func (b *batch) Delete(key string) { b.ops = append(b.ops, op{k: []byte(key), del: true}) }

// Notify adds a notification delivered to every Listen if the batch commits.
func (b *batch) Notify(payload string) { b.notes = append(b.notes, payload) }

// NoteEmpty implements store.EmptyNoter.
func (b *batch) NoteEmpty(prefix string) {
	if strings.HasSuffix(prefix, "/") {
		b.empties = append(b.empties, prefix)
	}
}

func (b *batch) Discard() { b.done = true }

func (b *batch) Empty() bool { return len(b.ops) == 0 && len(b.notes) == 0 }

func (b *batch) Commit() error {
	wait, err := b.CommitAsync()
	if err != nil {
		return err
	}
	return wait()
}

// CommitAsync (store.AsyncCommitter) sends a batch that commits in its
// held section — its writes and COMMIT, pipelined — and returns without
// waiting for the answer: the caller lets the next change take the lock
// meanwhile, whose own lock statement the database queues until this
// COMMIT is done, so the round trip is not spent holding the lock. wait
// reads the answer; nothing is acknowledged before it returns nil. Any
// other batch commits before CommitAsync returns.
func (b *batch) CommitAsync() (wait func() error, err error) {
	if b.done {
		return nil, errors.New("commit: batch already used")
	}
	b.done = true
	if len(b.ops) == 0 && len(b.notes) == 0 {
		return noWait, nil
	}
	if b.sec != nil {
		if conn := b.sec.take(); conn != nil {
			return b.s.sendCommit(conn, b, b.sec.seq), nil
		}
	}
	if err := b.commitOwnRetried(); err != nil {
		return nil, err
	}
	return noWait, nil
}

func noWait() error { return nil }

func (b *batch) commitOwnRetried() error {
	// A batch of its own decided nothing from reads, so a serialisation
	// conflict (CockroachDB's transaction retry error) is retried here.
	var err error
	for try := 0; try < 3; try++ {
		if err = b.commitOwn(); !isRetryable(err) {
			return err
		}
	}
	return err
}

// commitOwn commits the batch in a transaction of its own that takes the
// writer lock: BEGIN, the lock, the writes and COMMIT in one round trip.
func (b *batch) commitOwn() error {
	ctx, cancel := b.s.ctx()
	defer cancel()
	conn, err := b.s.writers.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("commit: take the writer lock: %w", classify(err))
	}
	return b.s.sendCommit(conn, b, 0)()
}

// isRetryable reports a serialisation failure: nothing was committed and
// the same transaction may simply run again.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// catchUpWait bounds the wait of a new lock holder for the invalidation
// of the commit before it (well over a notification's usual way, well
// under the round trips it saves).
const catchUpWait = time.Millisecond

// Statements that open a transaction holding the writer lock. The lock
// statement takes the number of the transaction's commit too: rolled back
// with it when nothing is committed, so the sequence counts commits only,
// and a commit needs no statement of its own for it.
const (
	beginSQL = "BEGIN"
	lockSQL  = "UPDATE hearth_lock SET seq = seq + 1 WHERE id = 1 RETURNING seq"
)

// notifySQL sends a commit's notifications, in order, in one statement:
// $2 the payloads, of which the first $3 are invalidation parts that get
// "inv:<seq>" in front (the sequence this transaction's lock statement
// took). PostgreSQL evaluates a volatile function of the select list after
// the sort, so ORDER BY is the order sent.
const notifySQL = "SELECT pg_notify($1, CASE WHEN t.i <= $3 THEN $4 || l.seq::text || t.n ELSE t.n END) " +
	"FROM hearth_lock l CROSS JOIN unnest($2::text[]) WITH ORDINALITY AS t(n, i) WHERE l.id = 1 ORDER BY t.i"

// sendCommit sends the batch's statements on conn with COMMIT after them,
// pipelined (if one fails, PostgreSQL skips the rest up to the pipeline's
// end, COMMIT included), and returns the function that reads the answer:
// one round trip in all. seq is the commit's number, taken by the lock of
// conn's transaction; with seq 0 conn holds no transaction yet and the
// pipeline opens one that takes the writer lock (and the number). conn is
// released by the returned function; one left inside a transaction (a
// failure) is closed by the pool rather than reused.
func (s *Store) sendCommit(conn *pgxpool.Conn, b *batch, seq uint64) (wait func() error) {
	// From here the database may move past the cache at any moment.
	s.cache.release()
	ctx, cancel := s.ctx()
	// The batch's final value of each key, in two statements whatever its
	// size (a sweep writes thousands of records): one upsert of arrays and
	// one delete. Later writes of a key win, as in Pebble's batches.
	last := make(map[string]int, len(b.ops))
	for i, o := range b.ops {
		last[string(o.k)] = i
	}
	var putK, putV, delK [][]byte
	written := make([]string, 0, len(last))
	// What a small commit wrote goes with its invalidation (cache.go).
	var carry []string
	if len(last) <= maxCarryKeys {
		carry = make([]string, 0, len(last))
	}
	for i, o := range b.ops {
		if last[string(o.k)] != i {
			continue
		}
		written = append(written, string(o.k))
		if carry != nil {
			carry = append(carry, carryLine(o.v, o.del))
		}
		if o.del {
			delK = append(delK, o.k)
		} else {
			putK, putV = append(putK, o.k), append(putV, o.v)
		}
	}
	// A prefix noted empty that the batch writes under is not.
	empties := slices.DeleteFunc(slices.Clone(b.empties), func(p string) bool {
		return slices.ContainsFunc(written, func(k string) bool { return strings.HasPrefix(k, p) })
	})
	var pb pgx.Batch
	seqAt := -1
	if seq == 0 {
		pb.Queue(beginSQL)
		seqAt = pb.Len()
		pb.Queue(lockSQL)
	}
	if len(delK) > 0 {
		pb.Queue("DELETE FROM hearth_kv WHERE k = ANY($1)", delK)
	}
	if len(putK) > 0 {
		pb.Queue("INSERT INTO hearth_kv (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) "+
			"ON CONFLICT (k) DO UPDATE SET v = excluded.v", putK, putV)
	}
	// The commit's invalidation ahead of the caller's notifications, so a
	// replica woken by those reads past it (cache.go).
	if !s.crdb {
		parts := invParts(written, carry)
		pb.Queue(notifySQL, notifyChannel, append(parts, b.notes...), len(parts), invPrefix)
	}
	pb.Queue("COMMIT")
	br := conn.SendBatch(ctx, &pb)
	return func() error {
		defer cancel()
		defer conn.Release()
		var err error
		for i := 0; i < pb.Len() && err == nil; i++ {
			if i == seqAt {
				err = br.QueryRow().Scan(&seq)
			} else {
				_, err = br.Exec()
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("commit: %w", classify(err))
		}
		if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
			// COMMIT of a failed transaction answers ROLLBACK, not an error.
			return fmt.Errorf("commit: %w", classify(errors.New("transaction did not commit")))
		}
		s.cache.committed(seq, putK, putV, delK, empties)
		return nil
	}
}

// section is a held writer lock: a connection inside a transaction that
// has locked the row, and that the section's first batch commits in.
type section struct {
	s    *Store
	conn *pgxpool.Conn
	// seq is the number the section's commit takes; seq-1 is the last
	// commit before it.
	seq uint64
	// read are the records read when the lock was taken, nil for a key
	// that does not exist: valid until the section's batch commits.
	read map[string][]byte
}

// take hands the lock's connection to a committing batch, once.
func (sec *section) take() *pgxpool.Conn {
	conn := sec.conn
	sec.conn = nil
	return conn
}

// Lock takes the writer lock and returns a view of the store whose first
// committed batch commits with it (later ones take the lock anew). Reads
// through the view see every change committed before the lock was taken.
// The view must be used by one goroutine, and no write may go through the
// Store itself while it is held (that write would wait for this lock).
// A process runs one section at a time (the control plane holds its own
// mutex around it): a waiting Lock holds a writer connection, and the
// holder's reads take read connections.
//
// The records of read are read in the same round trip as the lock (BEGIN,
// the row lock and the read are pipelined), and reads of them through the
// view cost nothing until its batch commits.
func (s *Store) Lock(ctx context.Context, read ...string) (store.KV, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, s.op)
	defer cancel()
	var sec *section
	// A connection the database closed while it sat idle (a database
	// restarted since) fails at its first use; the writers, unlike the
	// reads, may go unused through an outage, so each of the pool's idle
	// connections may be such a one. Taking the lock commits nothing, so
	// it is simply tried again on another.
	for try := 0; ; try++ {
		conn, err := s.writers.Acquire(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("take the writer lock: %w", classify(err))
		}
		sec = &section{s: s, conn: conn, read: make(map[string][]byte, len(read))}
		err = sec.begin(ctx, read)
		if err == nil {
			break
		}
		dead := conn.Conn().IsClosed()
		conn.Release() // inside a failed transaction or closed: the pool drops it
		if !dead || try == writerConns || ctx.Err() != nil {
			return nil, nil, fmt.Errorf("take the writer lock: %w", classify(err))
		}
	}
	unlock := func() {
		if conn := sec.take(); conn != nil {
			s.cache.release()
			ctx, cancel := s.ctx()
			defer cancel()
			_, _ = conn.Exec(ctx, "ROLLBACK")
			conn.Release()
		}
	}
	return &view{Store: s, sec: sec}, unlock, nil
}

// begin opens the section's transaction, takes the lock and reads keys,
// in one round trip.
func (sec *section) begin(ctx context.Context, keys []string) error {
	var pb pgx.Batch
	pb.Queue(beginSQL)
	pb.Queue(lockSQL)
	ks := make([][]byte, len(keys))
	for i, k := range keys {
		ks[i] = []byte(k)
		sec.read[k] = nil
	}
	if len(keys) > 0 {
		pb.Queue("SELECT k, v FROM hearth_kv WHERE k = ANY($1)", ks)
	}
	br := sec.conn.SendBatch(ctx, &pb)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return err
	}
	if err := br.QueryRow().Scan(&sec.seq); err != nil {
		return err
	}
	if len(keys) > 0 {
		rows, err := br.Query()
		if err != nil {
			return err
		}
		for rows.Next() {
			var k, v []byte
			if err := rows.Scan(&k, &v); err != nil {
				rows.Close()
				return err
			}
			sec.read[string(k)] = v
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	if err := br.Close(); err != nil {
		return err
	}
	// Nobody else commits until this section does: the cache, once at
	// the commit before it, answers every read (cache.lookup). Another
	// process's commit just before is announced at the moment this lock
	// was granted; its invalidation is worth a moment's wait, against a
	// round trip for each read it would otherwise cost.
	prev := sec.seq - 1
	sec.s.cache.catchUp(prev, catchUpWait)
	sec.s.cache.hold(prev)
	for k, v := range sec.read {
		sec.s.cache.fill(k, cached{val: v, found: v != nil}, prev)
	}
	return nil
}

// view is a Store whose batches commit in a held section.
type view struct {
	*Store
	sec *section
}

// Get serves a record read with the lock while the section is open.
func (v *view) Get(key string, val any) error {
	if raw, ok := v.sec.read[key]; ok && v.sec.conn != nil {
		if raw == nil {
			return store.ErrNotFound
		}
		if err := json.Unmarshal(raw, val); err != nil {
			return fmt.Errorf("decode %q: %w", key, err)
		}
		return nil
	}
	return v.Store.Get(key, val)
}

func (v *view) NewBatch() store.Batch { return &batch{s: v.Store, sec: v.sec} }

func (v *view) Put(key string, val any) error { return store.PutOne(v.NewBatch, key, val) }

func (v *view) Delete(key string) error { return store.DeleteOne(v.NewBatch, key) }

// Close of a view closes nothing: the Store is its owner's.
func (v *view) Close() error { return nil }

// Listen delivers every notification committed by any process to fn, on a
// connection of its own, until ctx ends. Each time its LISTEN is in force
// (the first time too: a waiter may have started before) it calls fn("")
// so the caller rechecks whatever it may have missed; after a lost
// connection it reconnects with a growing pause.
func (s *Store) Listen(ctx context.Context, fn func(payload string)) error {
	if s.crdb {
		<-ctx.Done()
		return nil
	}
	pause := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := s.listenOnce(ctx, fn)
		if ctx.Err() != nil {
			break
		}
		s.log.Warn("database notifications lost; reconnecting", "err", err, "in", pause)
		fn("")
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
	return nil
}

func (s *Store) listenOnce(ctx context.Context, fn func(string)) error {
	cfg, err := pgx.ParseConfig(s.url)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, s.op)
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		cancel()
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(cctx, "LISTEN "+notifyChannel)
	if err != nil {
		cancel()
		return err
	}
	// Every commit after this read is announced to this connection: the
	// cache starts from it and stops with the connection.
	var base int64
	err = conn.QueryRow(cctx, "SELECT seq FROM hearth_lock WHERE id = 1").Scan(&base)
	cancel()
	if err != nil {
		return err
	}
	s.cache.start(uint64(base))
	defer s.cache.stop()
	fn("")
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		if !s.cache.apply(n.Payload) {
			fn(n.Payload)
		}
	}
}

// classify marks the errors that mean "the database cannot answer now"
// (connection lost or refused, the server shutting down or overloaded, a
// timeout, a serialisation conflict) as store.ErrUnavailable: nothing was
// committed and the request may be tried again.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch {
		case strings.HasPrefix(pgErr.Code, "08"), // connection exception
			strings.HasPrefix(pgErr.Code, "57P"), // admin shutdown, cannot connect now
			pgErr.Code == "53300",                // too many connections
			pgErr.Code == "40001",                // serialization failure
			pgErr.Code == "40P01":                // deadlock detected
			return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		return err
	}
	// Everything else pgx reports (dial, I/O, a closed connection,
	// deadlines) is the database out of reach.
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}
