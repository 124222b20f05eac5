package control

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
)

// ID and secret prefixes. Everything after the prefix is crypto-random
// base62.
const (
	prefixServer     = "srv_"
	prefixSSHKey     = "sk_"
	prefixRule       = "fw_"
	prefixNode       = "node_"
	prefixAPIToken   = "tok_"
	prefixEnrollment = "enr_"
	prefixRequest    = "req_"

	secretAPIToken   = "hct_"
	secretEnrollment = "hce_"
	secretNode       = "hcn_"

	idLen     = 24 // 24 base62 chars ≈ 143 bits
	secretLen = 40 // ≈ 238 bits
)

const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// randomBase62 returns n uniformly random base62 characters. Bytes ≥ 248 are
// rejected so that every character is equally likely (248 = 4·62).
func randomBase62(n int) (string, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, n+n/4+8)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("read random: %w", err)
		}
		for _, b := range buf {
			if b >= 248 {
				continue
			}
			out = append(out, base62[b%62])
			if len(out) == n {
				break
			}
		}
	}
	return string(out), nil
}

func newID(prefix string) (string, error) {
	s, err := randomBase62(idLen)
	if err != nil {
		return "", err
	}
	return prefix + s, nil
}

func newSecret(prefix string) (string, error) {
	s, err := randomBase62(secretLen)
	if err != nil {
		return "", err
	}
	return prefix + s, nil
}

// hashSecret is the stored form of a token or credential. Secrets are long
// and random, so a plain SHA-256 (no salt, no stretching) is enough and lets
// the hash itself be the lookup key.
func hashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// hashesEqual compares two stored hashes in constant time.
func hashesEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// validID reports whether s is prefix followed by idLen base62 characters.
func validID(s, prefix string) bool {
	if len(s) != len(prefix)+idLen || s[:len(prefix)] != prefix {
		return false
	}
	for i := len(prefix); i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}
