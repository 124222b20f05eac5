package apikeys

import (
	"crypto/sha256"
	"sync"
	"time"
)

// Static is an in-memory Authenticator for tests of the deployment API. It
// parses headers exactly like Keyring, so it fails with the same errors,
// enforces rate limits with the same limiter, and records usage so tests
// can check what a request was charged.
type Static struct {
	// Now is the clock of the rate limits; nil is time.Now. Set it before
	// the first key is added.
	Now func() time.Time

	mu       sync.Mutex
	byHash   map[[sha256.Size]byte]Key
	usage    map[string]Usage
	outcomes map[string][]Outcome
	limits   map[string]*limiter
}

// NewStatic returns an empty Static.
func NewStatic() *Static {
	return &Static{byHash: map[[sha256.Size]byte]Key{}, usage: map[string]Usage{}, outcomes: map[string][]Outcome{},
		limits: map[string]*limiter{}}
}

func (s *Static) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Add creates a key named name and returns its secret.
func (s *Static) Add(name string) (string, Key) { return s.AddLimited(name, 0, 0) }

// AddLimited creates a key with per-minute request and token limits (0:
// unlimited) and returns its secret.
func (s *Static) AddLimited(name string, rpm, tpm int) (string, Key) {
	secret, sum := newToken()
	k := Key{ID: newKeyID(), Name: name, Hint: hint(secret), Source: SourceLocal, CreatedAt: s.now().UTC(),
		RequestsPerMinute: rpm, TokensPerMinute: tpm}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byHash[sum] = k
	if rpm > 0 || tpm > 0 {
		s.limits[k.ID] = newLimiter(rpm, tpm, s.now())
	}
	return secret, k
}

// Admit implements Authenticator.
func (s *Static) Admit(id string, reserve int64) Quota {
	s.mu.Lock()
	l := s.limits[id]
	s.mu.Unlock()
	if l == nil {
		return Quota{Allowed: true}
	}
	return l.admit(reserve, s.now())
}

// Release implements Authenticator.
func (s *Static) Release(id string, reserved int64) {
	s.mu.Lock()
	l := s.limits[id]
	s.mu.Unlock()
	if l != nil {
		l.release(reserved, s.now())
	}
}

// Revoke revokes the key with the given id.
func (s *Static) Revoke(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for h, k := range s.byHash {
		if k.ID == id {
			if k.RevokedAt == nil {
				now := time.Now().UTC()
				k.RevokedAt = &now
				s.byHash[h] = k
			}
			return nil
		}
	}
	return ErrNotFound
}

// Usage returns what has been recorded for id.
func (s *Static) Usage(id string) Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usage[id]
}

// Authenticate implements Authenticator.
func (s *Static) Authenticate(header []byte) (Key, error) {
	tok, err := parseBearer(header)
	if err != nil {
		return Key{}, err
	}
	sum := sha256.Sum256(tok)
	s.mu.Lock()
	defer s.mu.Unlock()
	k, ok := s.byHash[sum]
	if !ok {
		return Key{}, ErrUnknownKey
	}
	if k.RevokedAt != nil {
		return Key{}, ErrRevoked
	}
	return k, nil
}

// RecordUsage implements Authenticator.
func (s *Static) RecordUsage(id string, requests, promptTokens, completionTokens int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.limits[id]; l != nil {
		l.charge(promptTokens+completionTokens, s.now())
	}
	for _, k := range s.byHash {
		if k.ID == id {
			u := s.usage[id]
			u.Requests += requests
			u.PromptTokens += promptTokens
			u.CompletionTokens += completionTokens
			s.usage[id] = u
			return
		}
	}
}

// RecordOutcome implements Authenticator: it keeps every outcome, for tests.
func (s *Static) RecordOutcome(id string, o Outcome) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.outcomes[id] = append(s.outcomes[id], o)
}

// Outcomes returns the outcomes recorded for id, in order.
func (s *Static) Outcomes(id string) []Outcome {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Outcome(nil), s.outcomes[id]...)
}
