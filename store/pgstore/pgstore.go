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
// INSERT … ON CONFLICT, SELECT … FOR UPDATE. LISTEN/NOTIFY, which
// CockroachDB lacks, only speeds up waking a node's long-poll; the control
// plane polls as well.
package pgstore

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"strings"
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
}

// Store is a PostgreSQL database holding the control plane's records.
type Store struct {
	pool *pgxpool.Pool
	url  string
	op   time.Duration
	log  *slog.Logger
	// crdb is set on CockroachDB, which has neither advisory locks nor
	// LISTEN/NOTIFY: notifications are dropped and Listen only waits.
	crdb bool
}

var (
	_ store.Shared   = (*Store)(nil)
	_ store.Notifier = (*batch)(nil)
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
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("database: %w", err)
	}
	s := &Store{pool: pool, url: url, op: o.OpTimeout, log: o.Logger}
	pctx, cancel := context.WithTimeout(ctx, o.OpTimeout)
	defer cancel()
	var version string
	if err := pool.QueryRow(pctx, "SELECT version()").Scan(&version); err != nil {
		pool.Close()
		return nil, fmt.Errorf("database %s: %w", redact(cfg), classify(err))
	}
	s.crdb = strings.Contains(version, "CockroachDB")
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
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

// Close closes the connection pool.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

func (s *Store) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), s.op)
}

// Get decodes the record at key into v.
func (s *Store) Get(key string, v any) error {
	ctx, cancel := s.ctx()
	defer cancel()
	var val []byte
	err := s.pool.QueryRow(ctx, "SELECT v FROM hearth_kv WHERE k = $1", []byte(key)).Scan(&val)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("get %q: %w", key, classify(err))
	}
	if err := json.Unmarshal(val, v); err != nil {
		return fmt.Errorf("decode %q: %w", key, err)
	}
	return nil
}

// GetMany reads the records of keys in one query (store.MultiGetter).
func (s *Store) GetMany(keys []string, fn func(key string, val []byte) error) error {
	if len(keys) == 0 {
		return nil
	}
	ks := make([][]byte, len(keys))
	for i, k := range keys {
		ks[i] = []byte(k)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	rows, err := s.pool.Query(ctx, "SELECT k, v FROM hearth_kv WHERE k = ANY($1)", ks)
	if err != nil {
		return fmt.Errorf("get %d keys: %w", len(keys), classify(err))
	}
	defer rows.Close()
	for rows.Next() {
		var k, v []byte
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("get %d keys: %w", len(keys), classify(err))
		}
		if err := fn(string(k), v); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("get %d keys: %w", len(keys), classify(err))
	}
	return nil
}

// Has reports whether key exists.
func (s *Store) Has(key string) (bool, error) {
	ctx, cancel := s.ctx()
	defer cancel()
	var one int
	err := s.pool.QueryRow(ctx, "SELECT 1 FROM hearth_kv WHERE k = $1", []byte(key)).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %q: %w", key, classify(err))
	}
	return true, nil
}

// Put writes one record.
func (s *Store) Put(key string, v any) error { return store.PutOne(s.NewBatch, key, v) }

// Delete removes one record.
func (s *Store) Delete(key string) error { return store.DeleteOne(s.NewBatch, key) }

// Scan visits the records under prefix page by page. Unlike Pebble's
// iterator it is not one snapshot: a record changed during a long scan may
// be seen as of any page. Callers that need one view hold the writer lock.
func (s *Store) Scan(prefix, start string, reverse bool, fn func(key string, val []byte) (bool, error)) error {
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
	for {
		page, err := s.page(lower, upper, reverse, first, size)
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
	}
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
	done  bool
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

func (b *batch) Discard() { b.done = true }

func (b *batch) Empty() bool { return len(b.ops) == 0 && len(b.notes) == 0 }

func (b *batch) Commit() error {
	if b.done {
		return errors.New("commit: batch already used")
	}
	b.done = true
	if len(b.ops) == 0 && len(b.notes) == 0 {
		return nil
	}
	if b.sec != nil {
		if conn := b.sec.take(); conn != nil {
			return b.s.commitIn(conn, b, false)
		}
	}
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
	conn, err := b.s.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("commit: take the writer lock: %w", classify(err))
	}
	return b.s.commitIn(conn, b, true)
}

// isRetryable reports a serialisation failure: nothing was committed and
// the same transaction may simply run again.
func isRetryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// Statements that open a transaction holding the writer lock.
const (
	beginSQL = "BEGIN"
	lockSQL  = "SELECT id FROM hearth_lock WHERE id = 1 FOR UPDATE"
)

// commitIn applies the batch on conn and commits it, in one round trip:
// the statements are pipelined with COMMIT after them (if one fails,
// PostgreSQL skips the rest up to the pipeline's end, COMMIT included).
// With begin, conn holds no transaction yet and the pipeline opens one
// that takes the writer lock; otherwise conn's transaction holds it. conn
// is released either way; one left inside a transaction (a failure) is
// closed by the pool rather than reused.
func (s *Store) commitIn(conn *pgxpool.Conn, b *batch, begin bool) error {
	defer conn.Release()
	ctx, cancel := s.ctx()
	defer cancel()
	// The batch's final value of each key, in two statements whatever its
	// size (a sweep writes thousands of records): one upsert of arrays and
	// one delete. Later writes of a key win, as in Pebble's batches.
	last := make(map[string]int, len(b.ops))
	for i, o := range b.ops {
		last[string(o.k)] = i
	}
	var putK, putV, delK [][]byte
	for i, o := range b.ops {
		if last[string(o.k)] != i {
			continue
		}
		if o.del {
			delK = append(delK, o.k)
		} else {
			putK, putV = append(putK, o.k), append(putV, o.v)
		}
	}
	var pb pgx.Batch
	if begin {
		pb.Queue(beginSQL)
		pb.Queue(lockSQL)
	}
	if len(delK) > 0 {
		pb.Queue("DELETE FROM hearth_kv WHERE k = ANY($1)", delK)
	}
	if len(putK) > 0 {
		pb.Queue("INSERT INTO hearth_kv (k, v) SELECT * FROM unnest($1::bytea[], $2::bytea[]) "+
			"ON CONFLICT (k) DO UPDATE SET v = excluded.v", putK, putV)
	}
	if !s.crdb {
		for _, n := range b.notes {
			pb.Queue("SELECT pg_notify($1, $2)", notifyChannel, n)
		}
	}
	pb.Queue("COMMIT")
	if err := conn.SendBatch(ctx, &pb).Close(); err != nil {
		return fmt.Errorf("commit: %w", classify(err))
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		// COMMIT of a failed transaction answers ROLLBACK, not an error.
		return fmt.Errorf("commit: %w", classify(errors.New("transaction did not commit")))
	}
	return nil
}

// section is a held writer lock: a connection inside a transaction that
// has locked the row, and that the section's first batch commits in.
type section struct {
	s    *Store
	conn *pgxpool.Conn
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
// mutex around it): a waiting Lock holds a pooled connection, and the
// holder's reads need another.
//
// The records of read are read in the same round trip as the lock (BEGIN,
// the row lock and the read are pipelined), and reads of them through the
// view cost nothing until its batch commits.
func (s *Store) Lock(ctx context.Context, read ...string) (store.KV, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, s.op)
	defer cancel()
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("take the writer lock: %w", classify(err))
	}
	sec := &section{s: s, conn: conn, read: make(map[string][]byte, len(read))}
	if err := sec.begin(ctx, read); err != nil {
		conn.Release() // inside a failed transaction: the pool closes it
		return nil, nil, fmt.Errorf("take the writer lock: %w", classify(err))
	}
	unlock := func() {
		if conn := sec.take(); conn != nil {
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
	for range 2 {
		if _, err := br.Exec(); err != nil {
			return err
		}
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
	return br.Close()
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
// connection of its own, until ctx ends. After a lost connection it
// reconnects with a growing pause and calls fn("") so the caller rechecks
// whatever it may have missed.
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
	cancel()
	if err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		fn(n.Payload)
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
