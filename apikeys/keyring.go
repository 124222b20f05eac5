// Package apikeys owns deployment API keys: creating, listing and revoking
// them, authenticating the "Authorization: Bearer hearth_live_…" header on the
// deployment API, and counting each key's usage.
//
// Only a SHA-256 hash of each key is stored. The plaintext is returned once,
// by Create, and is never stored or logged.
//
// The daemon is the only process that opens the state, so the hearthd keys
// CLI talks to it over a local admin unix socket (AdminHandler, AdminClient)
// and opens the state itself only when no daemon is running (RunCLI).
package apikeys

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/hearthd/hearth/store"
)

// keyPrefix is this package's key space in the store.
const keyPrefix = "apikey/"

// Authentication failures. They are distinct so metrics and logs can say why
// a request was refused (see Reason); the deployment API answers all of them
// with the same 401 so a caller learns nothing about which keys exist.
var (
	ErrMissing    = errors.New("apikeys: no credentials")
	ErrMalformed  = errors.New("apikeys: malformed credentials")
	ErrForeignKey = errors.New("apikeys: not a hearth key")
	ErrUnknownKey = errors.New("apikeys: unknown key")
	ErrRevoked    = errors.New("apikeys: key revoked")
	ErrExpired    = errors.New("apikeys: key expired")
)

// Management errors.
var (
	ErrNotFound    = errors.New("apikeys: key not found")
	ErrInvalidName = errors.New("apikeys: name must be 1-64 printable characters")
	ErrClosed      = errors.New("apikeys: keyring closed")
	// ErrManaged refuses a local change to a key the control plane issued:
	// it changes only with the desired state.
	ErrManaged = errors.New("apikeys: key is managed by the control plane; delete it through the management API")
)

// Reason returns a short, stable label for an authentication error, for
// metric labels and logs: "missing", "malformed", "foreign", "unknown",
// "revoked", "expired", "" for nil and "error" for anything else.
func Reason(err error) string {
	switch err {
	case nil:
		return ""
	case ErrMissing:
		return "missing"
	case ErrMalformed:
		return "malformed"
	case ErrForeignKey:
		return "foreign"
	case ErrUnknownKey:
		return "unknown"
	case ErrRevoked:
		return "revoked"
	case ErrExpired:
		return "expired"
	}
	return "error"
}

// Authenticator is what the deployment API needs: check a request's
// Authorization header, apply the key's rate limits and report what an
// authenticated request used. Keyring is the real one; Static is a fake
// for tests.
type Authenticator interface {
	// Authenticate checks a raw Authorization header value. Any error means
	// 401; use Reason to label it.
	Authenticate(header []byte) (Key, error)
	// Admit charges one request to the key's per-minute limits, reserves
	// reserve tokens (its estimate) of its tokens per minute, and says
	// whether it may run. A key without limits (or an unknown one) is
	// always allowed and reserves nothing.
	Admit(id string, reserve int64) Quota
	// Release gives back the tokens Admit reserved (Quota.Reserved), once
	// the request's real tokens are recorded (RecordUsage).
	Release(id string, reserved int64)
	// RecordUsage adds to a key's usage totals, and charges the tokens to
	// its tokens-per-minute limit. Unknown IDs are ignored.
	RecordUsage(id string, requests, promptTokens, completionTokens int64)
	// RecordOutcome notes how a request of the key ended (time to first
	// token, reasoning tokens, failure), for its usage over time.
	RecordOutcome(id string, o Outcome)
}

var (
	_ Authenticator = (*Keyring)(nil)
	_ Authenticator = (*Static)(nil)
)

// Key sources: made on the box (hearthd keys) or issued by the management
// API and received with the desired state.
const (
	SourceLocal   = "local"
	SourceManaged = "managed"
)

// Key describes one API key. It never holds the secret.
type Key struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	Hint string `json:"hint,omitempty"`
	// Source is SourceLocal or SourceManaged.
	Source    string     `json:"source"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// ExpiresAt, if set, is when the key stops working (managed keys).
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	// RequestsPerMinute and TokensPerMinute limit the key; 0 is unlimited.
	RequestsPerMinute int `json:"requests_per_minute,omitempty"`
	TokensPerMinute   int `json:"tokens_per_minute,omitempty"`
	// Usage and LastUsedAt hold the key's totals in List and Get;
	// Authenticate leaves them zero.
	Usage      Usage      `json:"usage"`
	LastUsedAt *time.Time `json:"last_used_at,omitempty"`
}

// Revoked reports whether the key has been revoked.
func (k Key) Revoked() bool { return k.RevokedAt != nil }

// Usage is what requests made with a key have consumed.
type Usage struct {
	Requests         int64 `json:"requests"`
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// record is a Key as stored: the key plus the hash of its secret.
type record struct {
	Key
	SHA256 string `json:"sha256"`
}

// Keyring is the set of API keys, held in memory and persisted in the store.
//
// Reads (Authenticate, Admit, RecordUsage) go through an immutable index
// behind an atomic pointer, so the hot path takes no lock (a limited key
// takes its own limiter's); writers build a new index and swap it in after
// the change is synced to the store.
type Keyring struct {
	st  *store.Store
	log *slog.Logger
	now func() time.Time

	idx atomic.Pointer[index]

	mu     sync.Mutex // serialises writers: Create, Revoke, Flush, Close
	closed bool
	// bucketSeq is the last usage bucket's sequence number, pending how
	// many sealed buckets wait for the control plane (buckets.go); both
	// guarded by mu.
	bucketSeq uint64
	pending   int
}

// index is never modified after it is published.
type index struct {
	byHash map[[sha256.Size]byte]*entry
	byID   map[string]*entry
}

type entry struct {
	key  Key // Usage and LastUsedAt are zero here; the live ones are in usage
	hash [sha256.Size]byte
	// expires is key.ExpiresAt in Unix nanoseconds, 0 for never: checked
	// on every request.
	expires int64
	// usage and limits are shared by every index generation, so counts
	// recorded while a writer swaps the index are not lost. limits is nil
	// for a key without limits.
	usage  *counters
	limits *limiter
	// open counts a managed key's minutes until they are sealed
	// (buckets.go); nil for a local key.
	open *openBuckets
}

type counters struct {
	requests, prompt, completion atomic.Int64
	lastUsed                     atomic.Int64 // Unix nanoseconds, 0 never
	flushed                      Usage        // last persisted totals; guarded by Keyring.mu
}

func (c *counters) load() Usage {
	return Usage{
		Requests:         c.requests.Load(),
		PromptTokens:     c.prompt.Load(),
		CompletionTokens: c.completion.Load(),
	}
}

// Options configure OpenWith.
type Options struct {
	// Logger receives key events (never secrets). Nil discards.
	Logger *slog.Logger
	// Now is the clock for expiry, rate limits and last use. Nil is
	// time.Now.
	Now func() time.Time
}

// Open loads every key from st. The caller keeps ownership of st and closes
// it after Close.
func Open(st *store.Store, logger *slog.Logger) (*Keyring, error) {
	return OpenWith(st, Options{Logger: logger})
}

// OpenWith is Open with a clock.
func OpenWith(st *store.Store, o Options) (*Keyring, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	k := &Keyring{st: st, log: o.Logger, now: o.Now}
	ix := newIndex()
	err := store.ScanJSON(st, keyPrefix, func(sk string, r record) (bool, error) {
		e, err := k.entryFromRecord(sk, r)
		if err != nil {
			return false, err
		}
		ix.add(e)
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("load api keys: %w", err)
	}
	if err := k.loadBuckets(st); err != nil {
		return nil, err
	}
	k.idx.Store(ix)
	return k, nil
}

func newIndex() *index {
	return &index{byHash: map[[sha256.Size]byte]*entry{}, byID: map[string]*entry{}}
}

func (ix *index) add(e *entry) {
	ix.byHash[e.hash] = e
	ix.byID[e.key.ID] = e
}

func (k *Keyring) entryFromRecord(storeKey string, r record) (*entry, error) {
	if r.ID == "" || storeKey != keyPrefix+r.ID {
		return nil, fmt.Errorf("api key record %q has id %q", storeKey, r.ID)
	}
	h, err := hex.DecodeString(r.SHA256)
	if err != nil || len(h) != sha256.Size {
		return nil, fmt.Errorf("api key record %q: bad hash", storeKey)
	}
	if r.Source == "" {
		r.Source = SourceLocal // written before keys had a source
	}
	e := k.newEntry(r.Key, [sha256.Size]byte(h), &counters{flushed: r.Usage})
	e.usage.requests.Store(r.Usage.Requests)
	e.usage.prompt.Store(r.Usage.PromptTokens)
	e.usage.completion.Store(r.Usage.CompletionTokens)
	if r.LastUsedAt != nil {
		e.usage.lastUsed.Store(r.LastUsedAt.UnixNano())
	}
	return e, nil
}

// newEntry builds the index entry of key, with its live counters and a
// limiter if it has limits.
func (k *Keyring) newEntry(key Key, hash [sha256.Size]byte, usage *counters) *entry {
	key.Usage, key.LastUsedAt = Usage{}, nil
	e := &entry{key: key, hash: hash, usage: usage}
	if key.ExpiresAt != nil {
		e.expires = key.ExpiresAt.UnixNano()
	}
	if key.RequestsPerMinute > 0 || key.TokensPerMinute > 0 {
		e.limits = newLimiter(key.RequestsPerMinute, key.TokensPerMinute, k.now())
	}
	if key.Source == SourceManaged {
		e.open = &openBuckets{mins: map[int64]*bucketCounts{}}
	}
	return e
}

// ValidateName checks a key name: 1 to 64 printable characters, not all
// spaces.
func ValidateName(name string) error {
	if !utf8.ValidString(name) {
		return ErrInvalidName
	}
	n := utf8.RuneCountInString(name)
	if n < 1 || n > 64 || strings.TrimSpace(name) == "" {
		return ErrInvalidName
	}
	for _, r := range name {
		if !unicode.IsPrint(r) {
			return ErrInvalidName
		}
	}
	return nil
}

// Create makes a new key and returns its secret. This is the only time the
// secret exists outside the caller's hands: only its SHA-256 is kept.
//
// A fast, unsalted hash is right here, unlike for passwords: the secret is
// 32 uniformly random base62 characters (≈190 bits), so there is no
// dictionary to try and brute force is out of reach however fast the hash
// is. Slow password hashes (bcrypt, argon2) buy nothing against that and
// would cost milliseconds on every request; SHA-256 costs well under a
// microsecond and lets the hash itself be the lookup key.
func (k *Keyring) Create(name string) (string, Key, error) {
	if err := ValidateName(name); err != nil {
		return "", Key{}, err
	}
	secret, sum := newToken()
	key := Key{
		ID:        newKeyID(),
		Name:      name,
		Hint:      hint(secret),
		Source:    SourceLocal,
		CreatedAt: k.now().UTC(),
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return "", Key{}, ErrClosed
	}
	if err := k.st.Put(keyPrefix+key.ID, record{Key: key, SHA256: hashHex(sum)}); err != nil {
		return "", Key{}, fmt.Errorf("create api key: %w", err)
	}
	k.publish(k.newEntry(key, sum, &counters{}))
	k.log.Info("api key created", "id", key.ID, "name", key.Name)
	return secret, key, nil
}

// publish swaps in a new index with e added or replaced. Callers hold mu.
func (k *Keyring) publish(e *entry) {
	old := k.idx.Load()
	ix := &index{byHash: maps.Clone(old.byHash), byID: maps.Clone(old.byID)}
	ix.byHash[e.hash] = e
	ix.byID[e.key.ID] = e
	k.idx.Store(ix)
}

// List returns every key, revoked ones included, oldest first, with usage
// totals that include counts not yet flushed to the store.
func (k *Keyring) List() []Key {
	ix := k.idx.Load()
	out := make([]Key, 0, len(ix.byID))
	for _, e := range ix.byID {
		out = append(out, e.withUsage())
	}
	slices.SortFunc(out, func(a, b Key) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Get returns one key with its current usage totals.
func (k *Keyring) Get(id string) (Key, error) {
	e, ok := k.idx.Load().byID[id]
	if !ok {
		return Key{}, ErrNotFound
	}
	return e.withUsage(), nil
}

// withUsage is the key with its live usage totals.
func (e *entry) withUsage() Key {
	key := e.key
	key.Usage = e.usage.load()
	if ns := e.usage.lastUsed.Load(); ns != 0 {
		t := time.Unix(0, ns).UTC()
		key.LastUsedAt = &t
	}
	return key
}

// Revoke revokes a key. The revocation is synced to the store and applies to
// every request that starts after Revoke returns. Revoking an already
// revoked key succeeds and keeps the original revocation time, so retries are
// safe; an unknown id is ErrNotFound.
func (k *Keyring) Revoke(id string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	e, ok := k.idx.Load().byID[id]
	if !ok {
		return ErrNotFound
	}
	if e.key.Source == SourceManaged {
		return ErrManaged
	}
	if e.key.Revoked() {
		return nil
	}
	now := k.now().UTC()
	ne := *e
	ne.key.RevokedAt = &now
	u := e.usage.load()
	if err := k.st.Put(keyPrefix+id, ne.record(u)); err != nil {
		return fmt.Errorf("revoke api key %s: %w", id, err)
	}
	e.usage.flushed = u
	k.publish(&ne)
	k.log.Info("api key revoked", "id", id, "name", e.key.Name)
	return nil
}

func (e *entry) record(u Usage) record {
	r := record{Key: e.key, SHA256: hashHex(e.hash)}
	r.Usage = u
	if ns := e.usage.lastUsed.Load(); ns != 0 {
		t := time.Unix(0, ns).UTC()
		r.LastUsedAt = &t
	}
	return r
}

// Authenticate checks a raw Authorization header value ("Bearer hearth_live_…")
// and returns the key it names. It takes no lock and does not allocate.
func (k *Keyring) Authenticate(header []byte) (Key, error) {
	tok, err := parseBearer(header)
	if err != nil {
		return Key{}, err
	}
	sum := sha256.Sum256(tok)
	// The map is keyed by the hash, so any timing difference in the lookup
	// depends only on the SHA-256 of the presented token, which tells an
	// attacker nothing about a stored secret. The constant-time compare keeps
	// the final decision free of data-dependent timing all the same.
	e, ok := k.idx.Load().byHash[sum]
	if !ok || subtle.ConstantTimeCompare(e.hash[:], sum[:]) != 1 {
		return Key{}, ErrUnknownKey
	}
	if e.key.RevokedAt != nil {
		return Key{}, ErrRevoked
	}
	if e.expires != 0 && k.now().UnixNano() >= e.expires {
		return Key{}, ErrExpired
	}
	return e.key, nil
}

// Admit implements Authenticator: a key without limits costs one map
// lookup; a limited one takes its own limiter's lock.
func (k *Keyring) Admit(id string, reserve int64) Quota {
	e, ok := k.idx.Load().byID[id]
	if !ok || e.limits == nil {
		return Quota{Allowed: true}
	}
	return e.limits.admit(reserve, k.now())
}

// Release implements Authenticator.
func (k *Keyring) Release(id string, reserved int64) {
	if e, ok := k.idx.Load().byID[id]; ok && e.limits != nil {
		e.limits.release(reserved, k.now())
	}
}

// RecordUsage adds to a key's usage totals, notes its last use and charges
// the tokens to its limit; a managed key's counts also go to its minute
// (buckets.go). Totals reach the store on the next Flush (Run, Close).
// Unknown IDs are ignored.
func (k *Keyring) RecordUsage(id string, requests, promptTokens, completionTokens int64) {
	e, ok := k.idx.Load().byID[id]
	if !ok {
		return
	}
	now := k.now()
	e.usage.lastUsed.Store(now.UnixNano())
	if e.limits != nil {
		e.limits.charge(promptTokens+completionTokens, now)
	}
	if requests != 0 {
		e.usage.requests.Add(requests)
	}
	if promptTokens != 0 {
		e.usage.prompt.Add(promptTokens)
	}
	if completionTokens != 0 {
		e.usage.completion.Add(completionTokens)
	}
	if e.open != nil {
		e.open.record(now, requests, promptTokens, completionTokens)
	}
}

// Flush writes usage totals that changed since the last flush to the store,
// in one synced batch, and seals the managed keys' ended minutes.
func (k *Keyring) Flush() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	return errors.Join(k.flushLocked(), k.sealLocked(k.idx.Load().byID, false))
}

func (k *Keyring) flushLocked() error {
	type pending struct {
		c *counters
		u Usage
	}
	var done []pending
	b := k.st.NewBatch()
	for id, e := range k.idx.Load().byID {
		u := e.usage.load()
		if u == e.usage.flushed {
			continue
		}
		if err := b.Put(keyPrefix+id, e.record(u)); err != nil {
			b.Discard()
			return fmt.Errorf("flush api key usage: %w", err)
		}
		done = append(done, pending{e.usage, u})
	}
	if len(done) == 0 {
		b.Discard()
		return nil
	}
	if err := b.Commit(); err != nil {
		return fmt.Errorf("flush api key usage: %w", err)
	}
	for _, p := range done {
		p.c.flushed = p.u
	}
	return nil
}

// Run flushes usage totals every interval until ctx is done, then flushes
// once more. A failed flush is logged and retried on the next tick.
func (k *Keyring) Run(ctx context.Context, interval time.Duration) error {
	if interval <= 0 {
		return fmt.Errorf("apikeys: flush interval must be positive, got %v", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := k.Flush(); err != nil {
				k.log.Error("flush api key usage", "err", err)
			}
			return nil
		case <-t.C:
			if err := k.Flush(); err != nil {
				k.log.Error("flush api key usage", "err", err)
			}
		}
	}
}

// Close flushes usage totals and stops further changes. Authenticate keeps
// working on the last loaded keys. It does not close the store.
func (k *Keyring) Close() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	err := errors.Join(k.flushLocked(), k.sealLocked(k.idx.Load().byID, true))
	k.closed = true
	return err
}
