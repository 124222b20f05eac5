package control

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"

	"github.com/hearthd/hearth/internal/ids"
)

// ID and secret prefixes. Everything after the prefix is crypto-random
// base62 (internal/ids).
const (
	prefixServer     = "srv_"
	prefixSSHKey     = "sk_"
	prefixRule       = "fw_"
	prefixNode       = "node_"
	prefixAPIToken   = "tok_"
	prefixProject    = "prj_"
	prefixEnrollment = "enr_"
	prefixRequest    = "req_"

	secretAPIToken   = "hct_"
	secretEnrollment = "hce_"
	secretNode       = "hcn_"

	idLen     = 24 // 24 base62 chars ≈ 143 bits
	secretLen = 40 // ≈ 238 bits
)

func newID(prefix string) string { return ids.New(prefix, idLen) }

func newSecret(prefix string) string { return ids.New(prefix, secretLen) }

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
func validID(s, prefix string) bool { return ids.Valid(s, prefix, idLen) }
