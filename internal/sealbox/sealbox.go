// Package sealbox seals what a daemon hands a client only to get it back
// unchanged (the Responses API's encrypted reasoning items): AES-256-GCM
// under a random key of the daemon's, kept in its state store so that a
// restart opens what was sealed before it. The key never leaves the store
// and is never logged; Rotate replaces it (a node's wipe), after which
// nothing sealed before opens.
package sealbox

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/hearthd/hearth/store"
)

// keyRecord is where the key lives in the store.
const keyRecord = "sealbox/key"

// keyLen is AES-256's key.
const keyLen = 32

// Box seals and opens with the current key. It is safe for concurrent use.
type Box struct {
	kv   store.KV // nil for a box made with New: Rotate keeps the key in memory only
	aead atomic.Pointer[cipher.AEAD]
}

// ErrOpen is the error of Open for anything this box did not seal, or
// sealed under a key it no longer has: tampered with, cut, or another
// daemon's.
var ErrOpen = errors.New("sealbox: not sealed by this key")

// Load returns the box of the key in kv, making and storing a key on
// first use.
func Load(kv store.KV) (*Box, error) {
	var k []byte
	err := kv.Get(keyRecord, &k)
	switch {
	case err == nil && len(k) == keyLen:
	case err == nil || errors.Is(err, store.ErrNotFound):
		if k, err = newKey(kv); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("load sealing key: %w", err)
	}
	b := &Box{kv: kv}
	return b, b.use(k)
}

// New returns a box over key (32 bytes), kept nowhere: for tests.
func New(key []byte) (*Box, error) {
	b := &Box{}
	return b, b.use(key)
}

// Ephemeral returns a box over a random key kept nowhere: what it seals
// opens only in this process, until Rotate (tests).
func Ephemeral() *Box {
	k, _ := newKey(nil) // stores nothing, so cannot fail
	b := &Box{}
	_ = b.use(k) // a 32-byte key always makes a cipher
	return b
}

// newKey makes a random key and stores it.
func newKey(kv store.KV) ([]byte, error) {
	k := make([]byte, keyLen)
	_, _ = rand.Read(k) // crypto/rand never fails
	if kv != nil {
		if err := kv.Put(keyRecord, k); err != nil {
			return nil, fmt.Errorf("store sealing key: %w", err)
		}
	}
	return k, nil
}

func (b *Box) use(k []byte) error {
	block, err := aes.NewCipher(k)
	if err != nil {
		return fmt.Errorf("sealing key: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return fmt.Errorf("sealing key: %w", err)
	}
	b.aead.Store(&aead)
	return nil
}

// Rotate replaces the key with a new one, stored before it is used:
// nothing sealed before opens afterwards.
func (b *Box) Rotate() error {
	k, err := newKey(b.kv)
	if err != nil {
		return err
	}
	return b.use(k)
}

// Seal appends to dst the sealed plaintext: a random nonce, then the
// ciphertext and its tag. ad is authenticated with it (what it is for,
// so that one use's sealed value is not accepted by another).
func (b *Box) Seal(dst, plaintext, ad []byte) []byte {
	aead := *b.aead.Load()
	n := aead.NonceSize()
	start := len(dst)
	dst = append(dst, make([]byte, n)...)
	_, _ = rand.Read(dst[start:]) // crypto/rand never fails
	return aead.Seal(dst, dst[start:start+n], plaintext, ad)
}

// Open appends to dst the plaintext of sealed, which Seal made with the
// same ad under the current key, or returns ErrOpen.
func (b *Box) Open(dst, sealed, ad []byte) ([]byte, error) {
	aead := *b.aead.Load()
	n := aead.NonceSize()
	if len(sealed) < n+aead.Overhead() {
		return nil, ErrOpen
	}
	out, err := aead.Open(dst, sealed[:n], sealed[n:], ad)
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}
