package apikeys

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/hearthd/hearth/internal/ids"
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
)

// newToken returns a fresh secret token and its hash.
func newToken() (string, [sha256.Size]byte) {
	tok := ids.New(Prefix, secretChars)
	return tok, sha256.Sum256([]byte(tok))
}

// newKeyID returns a fresh key ID.
func newKeyID() string { return ids.New(idPrefix, idChars) }

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
		if !ids.IsBase62(c) {
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
