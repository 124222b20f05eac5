package apikeys

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// Usage over time. Beside its cumulative totals, every managed key counts
// what it does per minute (open buckets, in memory). A minute that has
// ended is sealed: written to the store as a usage bucket with the next
// sequence number, where it stays until the control plane has accepted a
// report that carries it (AckUsage). Only managed keys count so: their
// buckets are the control plane's; a standalone node has none to send.
const (
	bucketPrefix = "keyusage/"   // <seq, zero-padded> → nodeapi.UsageBucket
	keyBucketSeq = "keyusageseq" // the last sequence number given
	// maxPendingBuckets bounds the sealed buckets kept while the control
	// plane is away: 100 keys busy every minute for about two weeks. Past
	// it the oldest go, with a warning.
	maxPendingBuckets = 2_000_000
)

// Outcome is how one request of a key went, beyond the tokens RecordUsage
// counts: its time to first token (0 if nothing reached the client), the
// reasoning tokens among its completion tokens, and whether it failed.
type Outcome struct {
	TTFT            time.Duration
	ReasoningTokens int64
	Failed          bool
}

// openBuckets are one key's counts of the minutes not sealed yet, shared by
// every index generation (like counters).
type openBuckets struct {
	mu   sync.Mutex
	mins map[int64]*bucketCounts // minute (Unix seconds) → counts
}

type bucketCounts struct {
	requests, prompt, completion, reasoning, errors uint64
	ttft                                            [nodeapi.TTFTBins]uint64
}

// at returns the counts of the minute of now, with b.mu held.
func (b *openBuckets) at(now time.Time) *bucketCounts {
	m := now.Unix() / 60 * 60
	c := b.mins[m]
	if c == nil {
		c = &bucketCounts{}
		b.mins[m] = c
	}
	return c
}

func (b *openBuckets) record(now time.Time, requests, prompt, completion int64) {
	b.mu.Lock()
	c := b.at(now)
	c.requests += uint64(max(requests, 0))
	c.prompt += uint64(max(prompt, 0))
	c.completion += uint64(max(completion, 0))
	b.mu.Unlock()
}

func (b *openBuckets) outcome(now time.Time, o Outcome) {
	b.mu.Lock()
	c := b.at(now)
	c.reasoning += uint64(max(o.ReasoningTokens, 0))
	if o.Failed {
		c.errors++
	}
	if o.TTFT > 0 {
		c.ttft[nodeapi.TTFTBin(o.TTFT)]++
	}
	b.mu.Unlock()
}

// restore puts counts taken back (their seal failed).
func (b *openBuckets) restore(mins map[int64]*bucketCounts) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for m, c := range mins {
		cur := b.mins[m]
		if cur == nil {
			b.mins[m] = c
			continue
		}
		cur.requests += c.requests
		cur.prompt += c.prompt
		cur.completion += c.completion
		cur.reasoning += c.reasoning
		cur.errors += c.errors
		for i, n := range c.ttft {
			cur.ttft[i] += n
		}
	}
}

// take removes and returns the minutes before until (all, if until is 0).
func (b *openBuckets) take(until int64) map[int64]*bucketCounts {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out map[int64]*bucketCounts
	for m, c := range b.mins {
		if until != 0 && m >= until {
			continue
		}
		if out == nil {
			out = map[int64]*bucketCounts{}
		}
		out[m] = c
		delete(b.mins, m)
	}
	return out
}

// RecordOutcome notes how a request of the key ended, for its usage over
// time (a managed key's minute buckets). Unknown IDs and local keys are
// ignored.
func (k *Keyring) RecordOutcome(id string, o Outcome) {
	e, ok := k.idx.Load().byID[id]
	if !ok || e.open == nil {
		return
	}
	e.open.outcome(k.now(), o)
}

// SealUsage writes the ended minutes of every managed key's open buckets
// to the store as usage buckets, numbered on from the last; with all, the
// current minute too (a wipe, a shutdown). One synced batch.
func (k *Keyring) SealUsage(all bool) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.sealLocked(k.idx.Load().byID, all)
}

// sealLocked seals the open buckets of entries (all minutes, or those
// ended); with k.mu held.
func (k *Keyring) sealLocked(entries map[string]*entry, all bool) error {
	until := k.now().Unix() / 60 * 60
	if all {
		until = 0
	}
	type taken struct {
		e    *entry
		mins map[int64]*bucketCounts
	}
	var took []taken
	var buckets []nodeapi.UsageBucket
	for id, e := range entries {
		if e.open == nil {
			continue
		}
		mins := e.open.take(until)
		if len(mins) == 0 {
			continue
		}
		took = append(took, taken{e, mins})
		for m, c := range mins {
			b := nodeapi.UsageBucket{KeyID: id, Minute: time.Unix(m, 0).UTC(), Requests: c.requests,
				PromptTokens: c.prompt, CompletionTokens: c.completion, ReasoningTokens: c.reasoning, Errors: c.errors,
				TTFT: nodeapi.TrimTTFT(append([]uint64(nil), c.ttft[:]...))}
			if b.Requests+b.PromptTokens+b.CompletionTokens+b.Errors+uint64(len(b.TTFT)) > 0 {
				buckets = append(buckets, b)
			}
		}
	}
	if len(buckets) == 0 {
		return nil
	}
	// Minutes in order, so that a report's buckets are too.
	slices.SortFunc(buckets, func(a, b nodeapi.UsageBucket) int {
		if c := a.Minute.Compare(b.Minute); c != 0 {
			return c
		}
		return strings.Compare(a.KeyID, b.KeyID)
	})
	err := k.writeBuckets(buckets)
	if err != nil {
		// Nothing was stored (nor numbered): the counts go back, to be
		// sealed at the next try.
		for _, t := range took {
			t.e.open.restore(t.mins)
		}
	}
	return err
}

// writeBuckets numbers buckets on from the last sequence number and
// stores them, dropping the oldest beyond maxPendingBuckets.
func (k *Keyring) writeBuckets(buckets []nodeapi.UsageBucket) error {
	seq := k.bucketSeq
	batch := k.st.NewBatch()
	for i := range buckets {
		seq++
		buckets[i].Seq = seq
		if err := batch.Put(bucketKey(seq), buckets[i]); err != nil {
			batch.Discard()
			return fmt.Errorf("seal usage: %w", err)
		}
	}
	if err := batch.Put(keyBucketSeq, seq); err != nil {
		batch.Discard()
		return fmt.Errorf("seal usage: %w", err)
	}
	drop := max(k.pending+len(buckets)-maxPendingBuckets, 0)
	if drop > 0 {
		n := 0
		err := k.st.Scan(bucketPrefix, "", false, func(key string, _ []byte) (bool, error) {
			batch.Delete(key)
			n++
			return n < drop, nil
		})
		if err != nil {
			batch.Discard()
			return fmt.Errorf("seal usage: %w", err)
		}
		k.log.Warn("usage buckets the control plane did not take were dropped, oldest first", "buckets", n)
	}
	if err := batch.Commit(); err != nil {
		return fmt.Errorf("seal usage: %w", err)
	}
	k.bucketSeq = seq
	k.pending += len(buckets) - drop
	return nil
}

func bucketKey(seq uint64) string { return fmt.Sprintf("%s%020d", bucketPrefix, seq) }

// PendingUsage returns up to limit sealed usage buckets not yet
// acknowledged, oldest first, and whether more wait behind them.
func (k *Keyring) PendingUsage(limit int) ([]nodeapi.UsageBucket, bool, error) {
	var out []nodeapi.UsageBucket
	more := false
	err := k.st.Scan(bucketPrefix, "", false, func(key string, val []byte) (bool, error) {
		if len(out) == limit {
			more = true
			return false, nil
		}
		var b nodeapi.UsageBucket
		if err := json.Unmarshal(val, &b); err != nil {
			return false, fmt.Errorf("decode %s: %w", key, err)
		}
		out = append(out, b)
		return true, nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("pending usage: %w", err)
	}
	return out, more, nil
}

// AckUsage drops the sealed buckets up to seq: the control plane accepted
// a report that carried them.
func (k *Keyring) AckUsage(seq uint64) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	b := k.st.NewBatch()
	n := 0
	err := k.st.Scan(bucketPrefix, "", false, func(key string, _ []byte) (bool, error) {
		if key > bucketKey(seq) {
			return false, nil
		}
		b.Delete(key)
		n++
		return true, nil
	})
	if err != nil || n == 0 {
		b.Discard()
		if err != nil {
			return fmt.Errorf("acknowledge usage: %w", err)
		}
		return nil
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("acknowledge usage: %w", err)
	}
	k.pending = max(k.pending-n, 0)
	return nil
}

// loadBuckets reads the last sequence number given and counts the buckets
// still waiting, at Open.
func (k *Keyring) loadBuckets(st *store.Store) error {
	if err := st.Get(keyBucketSeq, &k.bucketSeq); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("load usage sequence: %w", err)
	}
	return st.Scan(bucketPrefix, "", false, func(string, []byte) (bool, error) {
		k.pending++
		return true, nil
	})
}
