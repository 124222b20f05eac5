package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// KV is what a store offers its callers, whatever engine is underneath:
// embedded Pebble (Store) or a shared SQL database (package pgstore). Keys
// order bytewise in both.
type KV interface {
	// Get decodes the record at key into v, or returns ErrNotFound.
	Get(key string, v any) error
	// Has reports whether key exists.
	Has(key string) (bool, error)
	// Put writes one record durably.
	Put(key string, v any) error
	// Delete removes one record durably; a missing key is not an error.
	Delete(key string) error
	// Scan visits the records under prefix in key order (or reverse) from
	// start, until fn returns false or an error.
	Scan(prefix, start string, reverse bool, fn func(key string, val []byte) (bool, error)) error
	// NewBatch starts a set of writes that commit together or not at all.
	NewBatch() Batch
	// Close releases the store.
	Close() error
}

// Batch collects writes that commit together or not at all. A batch is
// used once: after Commit or Discard it must not be touched.
type Batch interface {
	// Put adds a record write.
	Put(key string, v any) error
	// PutRaw adds a raw value write.
	PutRaw(key string, val []byte) error
	// Delete adds a delete.
	Delete(key string)
	// Empty reports whether nothing was staged.
	Empty() bool
	// Commit applies the writes atomically and durably.
	Commit() error
	// Discard drops an uncommitted batch.
	Discard()
}

// Shared is implemented by stores that several processes use at once (a
// database behind replicas of the control plane). Writers of every process
// serialise through Lock; while one holds it, no other process commits.
type Shared interface {
	KV
	// Lock blocks until this process holds the database's writer lock or
	// ctx ends, and returns the store to write through while it is held:
	// its first committed batch commits in the lock's own transaction, so
	// a holder whose lock was lost (its connection dropped) cannot commit.
	// unlock must be called exactly once. The records of read are read
	// with the lock (in its round trip, on a database): reads of them
	// through w cost nothing until w's first batch commits.
	Lock(ctx context.Context, read ...string) (w KV, unlock func(), err error)
	// Listen calls fn with the payload of every Notify committed by any
	// process, until ctx ends; it reconnects by itself after an outage and
	// calls fn with "" each time it (re)connects (notifications may have been
	// missed in between).
	Listen(ctx context.Context, fn func(payload string)) error
}

// AsyncCommitter is implemented by batches that can be applied (visible
// to every later read and change) without waiting for their sync to disk:
// the caller releases its locks and then waits, so concurrent changes
// share one sync (group commit). What is acknowledged is still durable:
// callers answer only after wait returns nil.
type AsyncCommitter interface {
	CommitAsync() (wait func() error, err error)
}

// Notifier is implemented by batches of a Shared store: a notification
// added to a batch is delivered to every Listen when, and only if, the
// batch commits.
type Notifier interface {
	Notify(payload string)
}

// EmptyNoter is implemented by batches of a store that keeps whole
// prefixes in a read cache: NoteEmpty states that no record exists under
// prefix (ending in "/") once the batch commits, as under a prefix named
// after an ID the batch creates, so that its first scan is answered
// without asking the database. A prefix the batch itself writes under is
// not kept.
type EmptyNoter interface {
	NoteEmpty(prefix string)
}

// MultiGetter is implemented by stores that read many keys at once: a
// database in one round trip, where a Get per key would cost one each.
type MultiGetter interface {
	// GetMany calls fn with the raw record of every key of keys that
	// exists, in no particular order; missing keys are skipped.
	GetMany(keys []string, fn func(key string, val []byte) error) error
}

// GetMany reads many records through kv's MultiGetter, or with a Get per
// key for a store without one (an embedded store reads locally anyway).
func GetMany(kv KV, keys []string, fn func(key string, val []byte) error) error {
	if mg, ok := kv.(MultiGetter); ok {
		return mg.GetMany(keys, fn)
	}
	for _, k := range keys {
		var raw json.RawMessage
		err := kv.Get(k, &raw)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if err := fn(k, raw); err != nil {
			return err
		}
	}
	return nil
}

// RawGetter is implemented by stores that can hand out a record's stored
// bytes themselves: with a read cache, the same slice for as long as the
// record is unchanged, so a caller may keep what it decoded from that
// slice and skip decoding it again.
type RawGetter interface {
	// GetRaw returns the record at key, or ErrNotFound. The bytes are
	// shared: they must not be modified.
	GetRaw(key string) ([]byte, error)
}

// Lagger is implemented by stores of a database shared by several
// processes that keep a read cache (package pgstore).
type Lagger interface {
	// Lagging returns a reader whose reads may be as of a commit a moment
	// ago (on the way to this process) but never older than what it read
	// before, for one goroutine.
	Lagging() KV
}

// Lagging returns a reader of kv for reads that may lag the newest commit
// by a moment, such as a node's own long-poll and report, which a later
// wake-up or report corrects: kv's cache where it has one, else kv itself
// (an embedded store is always current).
func Lagging(kv KV) KV {
	if l, ok := kv.(Lagger); ok {
		return l.Lagging()
	}
	return kv
}

// ErrUnavailable is the error a store returns when its database cannot be
// reached; errors.Is(err, ErrUnavailable) holds. Nothing was committed.
var ErrUnavailable = fmt.Errorf("store: database unavailable")

// PutOne writes one record as a batch of its own: Put for every engine.
func PutOne(newBatch func() Batch, key string, v any) error {
	b := newBatch()
	if err := b.Put(key, v); err != nil {
		b.Discard()
		return err
	}
	return b.Commit()
}

// DeleteOne removes one record as a batch of its own.
func DeleteOne(newBatch func() Batch, key string) error {
	b := newBatch()
	b.Delete(key)
	return b.Commit()
}

// EncodeJSON is the one record encoding every engine stores.
func EncodeJSON(key string, v any) ([]byte, error) {
	val, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %q: %w", key, err)
	}
	return val, nil
}

// Lock takes kv's writer lock if it is Shared and returns the store to
// write through until unlock. An embedded store has one process, whose own
// mutex is the lock: it is returned as is.
func Lock(ctx context.Context, kv KV, read ...string) (w KV, unlock func(), err error) {
	if sh, ok := kv.(Shared); ok {
		return sh.Lock(ctx, read...)
	}
	return kv, func() {}, nil
}

var _ KV = (*Store)(nil)
