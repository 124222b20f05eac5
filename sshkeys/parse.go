// Package sshkeys validates OpenSSH public keys and keeps them in a user's
// authorized_keys file.
//
// Parse is the single gate every key passes through: the management API calls
// it when a key is added, and the authorized_keys writer calls it again before
// anything reaches disk, so a line that could change what sshd does beyond
// "this key may log in" (options, extra lines, certificates) never gets
// written.
package sshkeys

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/crypto/ssh"
)

// Limits on what Parse accepts.
const (
	// MaxLineLen bounds the whole input. A 16384-bit RSA key, the largest
	// OpenSSH accepts, is about 2.8 KB of base64.
	MaxLineLen = 8192
	// MaxCommentLen bounds the comment, in bytes.
	MaxCommentLen = 255
	// MinRSABits is the smallest RSA modulus accepted.
	MinRSABits = 2048
	// MaxRSABits matches OpenSSH's own upper limit (SSH_RSA_MAXIMUM_MODULUS_SIZE).
	MaxRSABits = 16384
)

// accepted reports whether Parse accepts key type t.
func accepted(t string) bool {
	switch t {
	case ssh.KeyAlgoED25519,
		ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
		ssh.KeyAlgoRSA,
		ssh.KeyAlgoSKED25519, ssh.KeyAlgoSKECDSA256:
		return true
	}
	return false
}

// AcceptedTypes lists the key types Parse accepts, for error messages and
// API documentation.
func AcceptedTypes() []string {
	return []string{
		ssh.KeyAlgoED25519,
		ssh.KeyAlgoECDSA256, ssh.KeyAlgoECDSA384, ssh.KeyAlgoECDSA521,
		ssh.KeyAlgoRSA,
		ssh.KeyAlgoSKED25519, ssh.KeyAlgoSKECDSA256,
	}
}

// PublicKey is a validated OpenSSH public key line.
type PublicKey struct {
	Type        string // e.g. ssh-ed25519
	Fingerprint string // "SHA256:" + unpadded base64, as ssh-keygen -lf prints
	Line        string // canonical authorized_keys line: "type base64 [comment]"
	Comment     string
	Bits        int
}

// ParseError is the error Parse returns. Its message is meant to be shown to
// the person who submitted the key; it never repeats the input, because
// people sometimes paste a private key by mistake.
type ParseError struct {
	Msg string // what is wrong, in plain words
	Err error  // underlying cause, if any
}

func (e *ParseError) Error() string {
	if e.Err != nil {
		return "invalid SSH public key: " + e.Msg + ": " + e.Err.Error()
	}
	return "invalid SSH public key: " + e.Msg
}

func (e *ParseError) Unwrap() error { return e.Err }

func parseErr(format string, args ...any) error {
	return &ParseError{Msg: fmt.Sprintf(format, args...)}
}

// Parse validates one OpenSSH public key line of the form
// "type base64 [comment]", as found in a .pub file.
//
// Decisions worth knowing:
//   - Spaces and tabs around the line are trimmed. Any line break (LF or CR),
//     including a single trailing newline, is rejected: the value must be
//     exactly one line, and silently dropping a newline would make the
//     accepted input differ from what was stored.
//   - authorized_keys options (command=, from=, no-pty, restrict, ...) are
//     rejected; access is granted by key only.
//   - Certificates (*-cert-v01@openssh.com) are rejected: a certificate only
//     means something to sshd next to a cert-authority option, and its
//     principals and validity are not something the management API models.
//   - ssh-dss and RSA keys shorter than MinRSABits are rejected as weak.
//   - The comment must be printable UTF-8 (no control or format characters)
//     of at most MaxCommentLen bytes; inner spacing is kept as given.
func Parse(line string) (PublicKey, error) {
	if err := checkLine(line); err != nil {
		return PublicKey{}, err
	}
	s := strings.Trim(line, " \t")
	if s == "" {
		return PublicKey{}, parseErr("empty")
	}
	if s[0] == '#' {
		return PublicKey{}, parseErr("is a comment, not a key")
	}

	typeWord := s
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		typeWord = s[:i]
	} else {
		return PublicKey{}, parseErr("expected \"type base64 [comment]\"")
	}
	switch {
	case typeWord == ssh.KeyAlgoDSA:
		return PublicKey{}, parseErr("DSA (ssh-dss) keys are not supported; use ssh-ed25519")
	case strings.HasSuffix(typeWord, "-cert-v01@openssh.com"):
		return PublicKey{}, parseErr("certificates are not supported; submit the plain public key")
	case !accepted(typeWord):
		if looksLikeOptions(typeWord) {
			return PublicKey{}, parseErr("authorized_keys options (such as command= or from=) are not allowed")
		}
		return PublicKey{}, parseErr("unsupported key type %q; accepted: %s", truncate(typeWord, 64), strings.Join(AcceptedTypes(), ", "))
	}

	key, comment, options, rest, err := ssh.ParseAuthorizedKey([]byte(s))
	if err != nil {
		if k := blobKey(s[len(typeWord):]); k != nil && k.Type() != typeWord {
			return PublicKey{}, parseErr("key type %q does not match the key data (%s)", typeWord, k.Type())
		}
		return PublicKey{}, &ParseError{Msg: "malformed key data", Err: err}
	}
	if len(options) > 0 {
		// The library falls back to reading the first field as options when
		// the rest does not parse, e.g. "ssh-ed25519 ssh-ed25519 AAAA...".
		return PublicKey{}, parseErr("authorized_keys options are not allowed")
	}
	if len(rest) > 0 {
		return PublicKey{}, parseErr("must be a single line")
	}
	if key.Type() != typeWord {
		return PublicKey{}, parseErr("key type %q does not match the key data (%s)", typeWord, key.Type())
	}
	if !accepted(key.Type()) {
		return PublicKey{}, parseErr("unsupported key type %q", key.Type())
	}

	bits, err := keyBits(key)
	if err != nil {
		return PublicKey{}, err
	}
	if key.Type() == ssh.KeyAlgoRSA {
		if bits < MinRSABits {
			return PublicKey{}, parseErr("RSA key is %d bits; at least %d are required", bits, MinRSABits)
		}
		if bits > MaxRSABits {
			return PublicKey{}, parseErr("RSA key is %d bits; at most %d are supported", bits, MaxRSABits)
		}
	}

	if err := checkComment(comment); err != nil {
		return PublicKey{}, err
	}

	canon := key.Type() + " " + base64.StdEncoding.EncodeToString(key.Marshal())
	if comment != "" {
		canon += " " + comment
	}
	return PublicKey{
		Type:        key.Type(),
		Fingerprint: ssh.FingerprintSHA256(key),
		Line:        canon,
		Comment:     comment,
		Bits:        bits,
	}, nil
}

// checkLine refuses what cannot be one public key line, whatever its
// fields: too long, a private key, the SSH2 format, bad UTF-8, line breaks
// and control characters.
func checkLine(line string) error {
	if len(line) > MaxLineLen {
		return parseErr("longer than %d bytes", MaxLineLen)
	}
	if looksPrivate(line) {
		return parseErr("this looks like a private key; submit the public key (the .pub file) instead, and treat the private key as exposed")
	}
	if strings.Contains(line, "BEGIN SSH2 PUBLIC KEY") {
		return parseErr("RFC 4716 (SSH2) format is not supported; convert it with `ssh-keygen -i -f key.pub`")
	}
	if !utf8.ValidString(line) {
		return parseErr("not valid UTF-8")
	}
	for i := 0; i < len(line); i++ {
		switch c := line[i]; {
		case c == '\n' || c == '\r':
			return parseErr("must be a single line without line breaks")
		case c == 0:
			return parseErr("contains a NUL byte")
		case c == '\t':
		case c < 0x20 || c == 0x7f:
			return parseErr("contains control characters")
		}
	}
	return nil
}

// blobKey decodes the key in "base64 [comment]", for a clearer error when the
// library rejects a line; nil if it does not decode.
func blobKey(s string) ssh.PublicKey {
	f := strings.Fields(s)
	if len(f) == 0 {
		return nil
	}
	b, err := base64.StdEncoding.DecodeString(f[0])
	if err != nil {
		return nil
	}
	k, err := ssh.ParsePublicKey(b)
	if err != nil {
		return nil
	}
	return k
}

func looksPrivate(s string) bool {
	return strings.Contains(s, "-----BEGIN") ||
		strings.Contains(s, "PRIVATE KEY") ||
		strings.Contains(s, "PuTTY-User-Key-File")
}

// looksLikeOptions recognises the first field of an authorized_keys line that
// starts with options, so the error can say so instead of "unknown type".
func looksLikeOptions(field string) bool {
	if strings.ContainsAny(field, "=\",") {
		return true
	}
	switch strings.ToLower(field) {
	case "restrict", "cert-authority", "no-pty", "no-port-forwarding",
		"no-agent-forwarding", "no-x11-forwarding", "no-user-rc", "pty",
		"port-forwarding", "agent-forwarding", "x11-forwarding", "user-rc",
		"no-touch-required", "verify-required":
		return true
	}
	return false
}

func keyBits(k ssh.PublicKey) (int, error) {
	ck, ok := k.(ssh.CryptoPublicKey)
	if !ok {
		return 0, parseErr("unsupported key type %q", k.Type())
	}
	switch pk := ck.CryptoPublicKey().(type) {
	case *rsa.PublicKey:
		return pk.N.BitLen(), nil
	case *ecdsa.PublicKey:
		return pk.Curve.Params().BitSize, nil
	case ed25519.PublicKey:
		return 256, nil
	default:
		return 0, parseErr("unsupported key type %q", k.Type())
	}
}

func checkComment(c string) error {
	if len(c) > MaxCommentLen {
		return parseErr("comment longer than %d bytes", MaxCommentLen)
	}
	for _, r := range c {
		// unicode.IsPrint admits letters, marks, numbers, punctuation,
		// symbols and the ASCII space; it excludes tabs, control and format
		// characters (e.g. bidi overrides) that could disguise a line.
		if !unicode.IsPrint(r) {
			return parseErr("comment contains a non-printable character (%U)", r)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Key is one desired authorized key as the control plane hands it down.
// ID names the key in the marker line (letters, digits, '_', '-', '.');
// Fingerprint, when set, must match the key.
type Key struct {
	ID          string `json:"id"`
	PublicKey   string `json:"public_key"`
	Fingerprint string `json:"fingerprint"`
}

// Keys keeps a set of managed keys in effect.
type Keys interface {
	// Sync makes keys exactly the set of managed keys. Every key is
	// validated first; if any is invalid nothing is changed.
	Sync(ctx context.Context, keys []Key) error
}

// ErrInvalidKey marks Sync errors caused by the desired keys themselves,
// as opposed to the file system.
var ErrInvalidKey = errors.New("invalid key")

// validate checks a desired key set and returns the parsed keys in order.
func validate(keys []Key) ([]PublicKey, error) {
	out := make([]PublicKey, len(keys))
	seen := make(map[string]bool, len(keys))
	for i, k := range keys {
		if err := checkID(k.ID); err != nil {
			return nil, fmt.Errorf("%w: key #%d: %w", ErrInvalidKey, i, err)
		}
		if seen[k.ID] {
			return nil, fmt.Errorf("%w: key %s: duplicate id", ErrInvalidKey, k.ID)
		}
		seen[k.ID] = true
		pk, err := Parse(k.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("%w: key %s: %w", ErrInvalidKey, k.ID, err)
		}
		if k.Fingerprint != "" && k.Fingerprint != pk.Fingerprint {
			return nil, fmt.Errorf("%w: key %s: fingerprint %s does not match the key (%s)", ErrInvalidKey, k.ID, k.Fingerprint, pk.Fingerprint)
		}
		out[i] = pk
	}
	return out, nil
}

// checkID keeps key ids safe to put in a marker comment line.
func checkID(id string) error {
	if id == "" {
		return errors.New("empty id")
	}
	if len(id) > 128 {
		return errors.New("id longer than 128 bytes")
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.'
		if !ok {
			return fmt.Errorf("id %q may only contain letters, digits, '_', '-' and '.'", truncate(id, 32))
		}
	}
	return nil
}
