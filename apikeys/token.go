package apikeys

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

const (
	// Prefix starts every deployment API key. It makes hearth keys
	// recognisable to secret scanners and lets Authenticate reject keys meant
	// for other services (for example "sk-…") before doing any work.
	Prefix = "hearth_live_"

	secretChars = 32 // 32 base62 chars ≈ 190.5 bits of entropy
	idChars     = 20 // ≈ 119 bits: unguessable, but IDs are not secrets
	tokenLen    = len(Prefix) + secretChars
	hintChars   = 4

	idPrefix = "key_"

	alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
)

// isBase62 is a lookup table for the token alphabet, so validating a token on
// the hot path is one array index per byte.
var isBase62 = func() (t [256]bool) {
	for i := 0; i < len(alphabet); i++ {
		t[alphabet[i]] = true
	}
	return t
}()

// randomBase62 returns n crypto-random characters from the base62 alphabet.
// The standard library has no base62 encoder; rejection sampling (dropping
// bytes ≥ 248 = 4·62) keeps every character exactly uniform.
func randomBase62(n int) (string, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, n+n/4+8)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("read random bytes: %w", err)
		}
		for _, b := range buf {
			if b >= 248 {
				continue
			}
			out = append(out, alphabet[b%62])
			if len(out) == n {
				break
			}
		}
	}
	return string(out), nil
}

// newToken returns a fresh secret token and its hash.
func newToken() (string, [sha256.Size]byte, error) {
	s, err := randomBase62(secretChars)
	if err != nil {
		return "", [sha256.Size]byte{}, err
	}
	tok := Prefix + s
	return tok, sha256.Sum256([]byte(tok)), nil
}

// hint is the non-secret reminder shown in listings: the prefix and the last
// few characters, enough to tell keys apart without weakening them much
// (4 of 32 characters leaves ≈ 166 bits unknown).
func hint(token string) string {
	return Prefix + "…" + token[len(token)-hintChars:]
}

func hashHex(h [sha256.Size]byte) string { return hex.EncodeToString(h[:]) }

// parseBearer extracts a hearth token from a raw Authorization header value.
// It never allocates; the returned slice aliases header.
func parseBearer(header []byte) ([]byte, error) {
	if len(header) == 0 {
		return nil, ErrMissing
	}
	const scheme = "bearer"
	if len(header) < len(scheme) || !asciiEqualFold(header[:len(scheme)], scheme) {
		return nil, ErrMalformed
	}
	rest := header[len(scheme):]
	// RFC 9110 §11.4: the scheme is followed by one or more spaces.
	i := 0
	for i < len(rest) && rest[i] == ' ' {
		i++
	}
	if i == 0 || i == len(rest) {
		return nil, ErrMalformed
	}
	tok := rest[i:]
	if len(tok) < len(Prefix) || string(tok[:len(Prefix)]) != Prefix {
		return nil, ErrForeignKey
	}
	if len(tok) != tokenLen {
		return nil, ErrMalformed
	}
	for _, c := range tok[len(Prefix):] {
		if !isBase62[c] {
			return nil, ErrMalformed
		}
	}
	return tok, nil
}

// asciiEqualFold compares b with the lower-case ASCII string s, ignoring the
// case of b.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range b {
		c := b[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != s[i] {
			return false
		}
	}
	return true
}
