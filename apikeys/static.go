package apikeys

import (
	"crypto/sha256"
	"sync"
	"time"
)

// Static is an in-memory Authenticator for tests of the deployment API. It
// parses headers exactly like Keyring, so it fails with the same errors, and
// records usage so tests can check what a request was charged.
type Static struct {
	mu     sync.Mutex
	byHash map[[sha256.Size]byte]Key
	usage  map[string]Usage
}

// NewStatic returns an empty Static.
func NewStatic() *Static {
	return &Static{byHash: map[[sha256.Size]byte]Key{}, usage: map[string]Usage{}}
}

// Add creates a key named name and returns its secret.
func (s *Static) Add(name string) (string, Key) {
	secret, sum, err := newToken()
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	id, err := randomBase62(idChars)
	if err != nil {
		panic(err)
	}
	k := Key{ID: idPrefix + id, Name: name, Hint: hint(secret), CreatedAt: time.Now().UTC()}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.byHash[sum] = k
	return secret, k
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
