// Package store is hearth's one state package: a thin typed layer over an
// embedded Pebble database. Every write is synced before it returns, and a
// change that touches several records is one batch, so a crash never leaves a
// half-written change and nothing that was acknowledged is lost.
//
// Records are JSON values under string keys. Callers own their key space by
// prefix (for example "apikey/" or "srv/"); the store knows no record kinds.
package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/vfs"
)

// ErrNotFound is returned by Get for a key that does not exist.
var ErrNotFound = errors.New("store: not found")

// Store is an open Pebble database.
type Store struct {
	db *pebble.DB
}

// Options configure Open.
type Options struct {
	// FS replaces the real filesystem, e.g. vfs.NewMem() or a crashable
	// in-memory filesystem in tests.
	FS vfs.FS
}

// Open opens (creating if needed) the database in dir.
func Open(dir string, o Options) (*Store, error) {
	po := &pebble.Options{Logger: quietLogger{}}
	fs := vfs.Default
	if o.FS != nil {
		po.FS = o.FS
		fs = o.FS
	}
	if err := ensureDir(fs, dir); err != nil {
		return nil, fmt.Errorf("open state in %s: %w", dir, err)
	}
	db, err := pebble.Open(dir, po)
	if err != nil {
		return nil, fmt.Errorf("open state in %s: %w", dir, err)
	}
	return &Store{db: db}, nil
}

// Close flushes and closes the database.
func (s *Store) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("close state: %w", err)
	}
	return nil
}

// Get decodes the record at key into v.
func (s *Store) Get(key string, v any) error {
	val, closer, err := s.db.Get([]byte(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return ErrNotFound
	}
	if err != nil {
		return fmt.Errorf("get %q: %w", key, err)
	}
	defer closer.Close()
	if err := json.Unmarshal(val, v); err != nil {
		return fmt.Errorf("decode %q: %w", key, err)
	}
	return nil
}

// Has reports whether key exists.
func (s *Store) Has(key string) (bool, error) {
	_, closer, err := s.db.Get([]byte(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("get %q: %w", key, err)
	}
	closer.Close()
	return true, nil
}

// Put writes one record, synced.
func (s *Store) Put(key string, v any) error { return PutOne(s.NewBatch, key, v) }

// Delete removes one record, synced. Deleting a missing key is not an error.
func (s *Store) Delete(key string) error { return DeleteOne(s.NewBatch, key) }

// Scan calls fn for every record whose key starts with prefix, in key order
// (or reverse key order), until fn returns false or an error. A non-empty
// start resumes a scan: forward it is the first key visited; in reverse only
// keys before it are visited.
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
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return fmt.Errorf("scan %q: %w", prefix, err)
	}
	defer it.Close()
	valid := it.First()
	next := it.Next
	if reverse {
		valid = it.Last()
		next = it.Prev
	}
	for ; valid; valid = next() {
		val, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("scan %q: %w", prefix, err)
		}
		more, err := fn(string(it.Key()), val)
		if err != nil {
			return err
		}
		if !more {
			break
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("scan %q: %w", prefix, err)
	}
	return nil
}

// ScanJSON is Scan with each value decoded into a fresh T.
func ScanJSON[T any](s KV, prefix string, fn func(key string, v T) (bool, error)) error {
	return s.Scan(prefix, "", false, func(key string, val []byte) (bool, error) {
		var v T
		if err := json.Unmarshal(val, &v); err != nil {
			return false, fmt.Errorf("decode %q: %w", key, err)
		}
		return fn(key, v)
	})
}

// pebbleBatch is a Pebble batch: it commits atomically and synced.
type pebbleBatch struct {
	db *pebble.DB
	b  *pebble.Batch
}

// NewBatch starts an empty batch.
func (s *Store) NewBatch() Batch { return &pebbleBatch{db: s.db, b: s.db.NewBatch()} }

// Put adds a record write to the batch.
func (b *pebbleBatch) Put(key string, v any) error {
	val, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %q: %w", key, err)
	}
	return b.PutRaw(key, val)
}

// PutRaw adds a raw value write to the batch.
func (b *pebbleBatch) PutRaw(key string, val []byte) error {
	if err := b.b.Set([]byte(key), val, nil); err != nil {
		return fmt.Errorf("batch set %q: %w", key, err)
	}
	return nil
}

// Delete adds a delete to the batch.
func (b *pebbleBatch) Delete(key string) {
	// A Pebble batch Delete only fails when the batch is already committed,
	// which this type never allows to be reused.
	_ = b.b.Delete([]byte(key), nil)
}

// Commit applies the batch atomically and syncs it to disk.
func (b *pebbleBatch) Commit() error {
	defer b.b.Close()
	if err := b.b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// CommitAsync applies the batch and returns the wait for its WAL sync
// (Pebble's own visibility is the same either way: a batch is readable
// once applied, before its sync).
func (b *pebbleBatch) CommitAsync() (func() error, error) {
	if err := b.db.ApplyNoSyncWait(b.b, pebble.Sync); err != nil {
		_ = b.b.Close()
		return nil, fmt.Errorf("commit: %w", err)
	}
	return func() error {
		defer b.b.Close()
		if err := b.b.SyncWait(); err != nil {
			return fmt.Errorf("commit: sync: %w", err)
		}
		return nil
	}, nil
}

// Empty reports whether nothing was staged.
func (b *pebbleBatch) Empty() bool { return b.b.Empty() }

// Discard drops an uncommitted batch.
func (b *pebbleBatch) Discard() { _ = b.b.Close() }

// ensureDir creates dir and any missing parents durably. Pebble syncs what it
// writes inside dir but not dir's own entry in its parent, so without this a
// crash soon after the first start could lose a freshly created state
// directory with every synced write in it.
func ensureDir(fs vfs.FS, dir string) error {
	if dir == "" {
		return nil
	}
	if _, err := fs.Stat(dir); err == nil {
		return nil
	}
	parent := fs.PathDir(dir)
	if parent != dir {
		if err := ensureDir(fs, parent); err != nil {
			return err
		}
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create directory: %w", err)
	}
	d, err := fs.OpenDir(parent)
	if err != nil {
		return fmt.Errorf("open parent directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync parent directory: %w", err)
	}
	return nil
}

func prefixEnd(p []byte) []byte {
	end := bytes.Clone(p)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil // prefix is all 0xff: no upper bound
}

// quietLogger keeps Pebble's informational chatter out of hearthd's log;
// errors still surface through returned errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}
