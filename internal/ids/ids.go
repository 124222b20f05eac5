// Package ids makes the random identifiers and secrets hearth hands out: a
// fixed prefix that names the kind ("srv_", "hearth_live_", "chatcmpl-")
// followed by crypto-random base62 characters.
//
// The standard library has no base62 encoder (crypto/rand.Text is base32,
// which would change every ID's length and alphabet), so the few lines of
// rejection sampling live here once.
package ids

import (
	"crypto/rand"
	"strings"
)

// Alphabet is the base62 alphabet, in the order characters are drawn.
const Alphabet = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// New returns prefix followed by n uniformly random base62 characters from
// crypto/rand. It cannot fail: since Go 1.24 crypto/rand.Read never returns
// an error (the program aborts if the kernel cannot supply randomness).
func New(prefix string, n int) string {
	var b strings.Builder
	b.Grow(len(prefix) + n)
	b.WriteString(prefix)
	// Bytes ≥ 248 (= 4·62) are rejected so that every character is equally
	// likely; one in 32 bytes is dropped, so one buffer nearly always does.
	var buf [64]byte
	for n > 0 {
		rand.Read(buf[:])
		for _, c := range buf {
			if c >= 248 {
				continue
			}
			b.WriteByte(Alphabet[c%62])
			if n--; n == 0 {
				break
			}
		}
	}
	return b.String()
}

// IsBase62 reports whether c is in Alphabet. It is a few comparisons, cheap
// enough for checking every byte of a bearer token on the request path.
func IsBase62(c byte) bool {
	return c-'0' < 10 || c-'A' < 26 || c-'a' < 26
}

// Valid reports whether s is prefix followed by exactly n base62
// characters: the shape New(prefix, n) makes.
func Valid(s, prefix string, n int) bool {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || len(rest) != n {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if !IsBase62(rest[i]) {
			return false
		}
	}
	return true
}
