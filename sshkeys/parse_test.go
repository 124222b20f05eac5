package sshkeys

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"
)

// Security-key lines cannot be generated without hardware; these were built
// from fixed key material and are checked against ssh-keygen below like the
// rest.
const (
	skEd25519Line = "sk-ssh-ed25519@openssh.com AAAAGnNrLXNzaC1lZDI1NTE5QG9wZW5zc2guY29tAAAAIDtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdopAAAABHNzaDo= yubikey"
	skECDSALine   = "sk-ecdsa-sha2-nistp256@openssh.com AAAAInNrLWVjZHNhLXNoYTItbmlzdHAyNTZAb3BlbnNzaC5jb20AAAAIbmlzdHAyNTYAAABBBCbvzr0O6eNKZpGH4Ys6kSKy9zOUW2Scyfn5Ien52tgSkCOL3pzHuzMNFQxncE3SWucFUgV0S28xv0BwdFhy0OYAAAAEc3NoOg== solokey"
)

// authorizedLine returns "type base64" for a crypto public key.
func authorizedLine(t testing.TB, pub crypto.PublicKey) string {
	t.Helper()
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(string(ssh.MarshalAuthorizedKey(k)), "\n")
}

func newEd25519Line(t testing.TB) string {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authorizedLine(t, pub)
}

func newECDSALine(t testing.TB, c elliptic.Curve) string {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return authorizedLine(t, &k.PublicKey)
}

func newRSALine(t testing.TB, bits int) string {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	return authorizedLine(t, &k.PublicKey)
}

// keygenFingerprint asks the real ssh-keygen for a line's size and
// fingerprint.
func keygenFingerprint(t *testing.T, line string) (int, string) {
	t.Helper()
	bin, err := exec.LookPath("ssh-keygen")
	if err != nil {
		t.Fatalf("ssh-keygen not found (apt-get install openssh-client): %v", err)
	}
	p := filepath.Join(t.TempDir(), "key.pub")
	if err := os.WriteFile(p, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-lf", p).CombinedOutput()
	if err != nil {
		t.Fatalf("ssh-keygen -lf: %v: %s", err, out)
	}
	f := strings.Fields(string(out))
	if len(f) < 2 {
		t.Fatalf("ssh-keygen output %q", out)
	}
	bits, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("ssh-keygen output %q: %v", out, err)
	}
	return bits, f[1]
}

func TestParseAccepts(t *testing.T) {
	ed := newEd25519Line(t)
	tests := []struct {
		name    string
		in      string
		typ     string
		comment string
		line    string // expected canonical line; "" means the trimmed input
	}{
		{name: "ed25519", in: ed + " alice@laptop", typ: "ssh-ed25519", comment: "alice@laptop"},
		{name: "ed25519 no comment", in: ed, typ: "ssh-ed25519"},
		{name: "ecdsa p256", in: newECDSALine(t, elliptic.P256()) + " p256", typ: "ecdsa-sha2-nistp256", comment: "p256"},
		{name: "ecdsa p384", in: newECDSALine(t, elliptic.P384()) + " p384", typ: "ecdsa-sha2-nistp384", comment: "p384"},
		{name: "ecdsa p521", in: newECDSALine(t, elliptic.P521()) + " p521", typ: "ecdsa-sha2-nistp521", comment: "p521"},
		{name: "rsa 2048", in: newRSALine(t, 2048) + " rsa", typ: "ssh-rsa", comment: "rsa"},
		{name: "rsa 3072", in: newRSALine(t, 3072), typ: "ssh-rsa"},
		{name: "sk ed25519", in: skEd25519Line, typ: "sk-ssh-ed25519@openssh.com", comment: "yubikey"},
		{name: "sk ecdsa", in: skECDSALine, typ: "sk-ecdsa-sha2-nistp256@openssh.com", comment: "solokey"},
		{name: "surrounding space trimmed", in: " \t" + ed + " bob \t ", typ: "ssh-ed25519", comment: "bob", line: ed + " bob"},
		{name: "tab separators canonicalised", in: strings.Replace(ed, " ", "\t", 1) + "\tcarol", typ: "ssh-ed25519", comment: "carol", line: ed + " carol"},
		{name: "comment with spaces", in: ed + " work key 2", typ: "ssh-ed25519", comment: "work key 2"},
		{name: "unicode comment", in: ed + " José’s clé 🔑", typ: "ssh-ed25519", comment: "José’s clé 🔑"},
		{name: "comment at limit", in: ed + " " + strings.Repeat("c", MaxCommentLen), typ: "ssh-ed25519", comment: strings.Repeat("c", MaxCommentLen)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got.Type != tc.typ {
				t.Errorf("Type = %q, want %q", got.Type, tc.typ)
			}
			if got.Comment != tc.comment {
				t.Errorf("Comment = %q, want %q", got.Comment, tc.comment)
			}
			wantLine := tc.line
			if wantLine == "" {
				wantLine = strings.TrimSpace(tc.in)
			}
			if got.Line != wantLine {
				t.Errorf("Line = %q, want %q", got.Line, wantLine)
			}
			bits, fp := keygenFingerprint(t, got.Line)
			if got.Fingerprint != fp {
				t.Errorf("Fingerprint = %q, ssh-keygen says %q", got.Fingerprint, fp)
			}
			if got.Bits != bits {
				t.Errorf("Bits = %d, ssh-keygen says %d", got.Bits, bits)
			}
		})
	}
}

func TestParseRejects(t *testing.T) {
	ed := newEd25519Line(t)
	edBlob := strings.Fields(ed)[1]

	_, edPriv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	privBlock, err := ssh.MarshalPrivateKey(edPriv, "")
	if err != nil {
		t.Fatal(err)
	}
	privPEM := string(pem.EncodeToMemory(privBlock))

	// A certificate for ed's key, signed by a throwaway CA.
	_, caPriv, _ := ed25519.GenerateKey(rand.Reader)
	caSigner, err := ssh.NewSignerFromKey(caPriv)
	if err != nil {
		t.Fatal(err)
	}
	edKey, _, _, _, err := ssh.ParseAuthorizedKey([]byte(ed))
	if err != nil {
		t.Fatal(err)
	}
	cert := &ssh.Certificate{Key: edKey, CertType: ssh.UserCert, ValidPrincipals: []string{"root"}, ValidBefore: ssh.CertTimeInfinity}
	if err := cert.SignCert(rand.Reader, caSigner); err != nil {
		t.Fatal(err)
	}
	certLine := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(cert)))

	dssBlob := ssh.Marshal(struct {
		T          string
		P, Q, G, Y *big.Int
	}{"ssh-dss", big.NewInt(23), big.NewInt(11), big.NewInt(4), big.NewInt(8)})
	dssLine := "ssh-dss " + base64.StdEncoding.EncodeToString(dssBlob)

	rawEd, _ := base64.StdEncoding.DecodeString(edBlob)
	junkLine := "ssh-ed25519 " + base64.StdEncoding.EncodeToString(append(rawEd, 0, 0, 0, 1, 'x'))
	truncLine := "ssh-ed25519 " + base64.StdEncoding.EncodeToString(rawEd[:len(rawEd)-5])

	tests := []struct {
		name string
		in   string
		want string // substring of the error
	}{
		{"empty", "", "empty"},
		{"blank", " \t ", "empty"},
		{"comment line", "# " + ed, "comment"},
		{"type only", "ssh-ed25519", "expected"},
		{"command option", `command="x" ` + ed, "options"},
		{"from option", `from="10.0.0.0/8" ` + ed, "options"},
		{"restrict option", "restrict " + ed, "options"},
		{"several options", `no-pty,command="ls -l" ` + ed, "options"},
		{"type repeated", "ssh-ed25519 " + ed, "options"},
		{"two lines", ed + "\n" + ed, "single line"},
		{"trailing newline", ed + "\n", "single line"},
		{"trailing CRLF", ed + "\r\n", "single line"},
		{"embedded CR", ed + " a\rb", "single line"},
		{"NUL in comment", ed + " a\x00b", "NUL"},
		{"escape in comment", ed + " a\x1b[31mb", "control"},
		{"tab in comment", ed + " a\tb", "non-printable"},
		{"bidi override in comment", ed + " evil\u202egnp.exe", "non-printable"},
		{"DEL in comment", ed + " a\x7f", "control"},
		{"invalid utf-8", ed + " caf\xe9", "UTF-8"},
		{"private key PEM", privPEM, "private key"},
		{"private key one line", "-----BEGIN OPENSSH PRIVATE KEY----- b3BlbnNzaC1rZXk=", "private key"},
		{"rsa private key header", "-----BEGIN RSA PRIVATE KEY-----", "private key"},
		{"rfc4716", "---- BEGIN SSH2 PUBLIC KEY ----", "RFC 4716"},
		{"rsa 1024", newRSALine(t, 1024), "at least 2048"},
		{"ssh-dss", dssLine, "DSA"},
		{"certificate", certLine, "certificates"},
		{"type mismatch rsa", "ssh-rsa " + edBlob, "does not match"},
		{"type mismatch ecdsa curve", "ecdsa-sha2-nistp384 " + strings.Fields(newECDSALine(t, elliptic.P256()))[1], "does not match"},
		{"rsa-sha2-256 type word", "rsa-sha2-256 " + strings.Fields(newRSALine(t, 2048))[1], "unsupported key type"},
		{"unknown type", "ssh-foo " + edBlob, "unsupported key type"},
		{"bad base64", "ssh-ed25519 AAAA!!!! x", "malformed"},
		{"truncated blob", truncLine, "malformed"},
		{"trailing junk in blob", junkLine, "malformed"},
		{"very long", ed + " " + strings.Repeat("a", MaxLineLen), "longer than"},
		{"comment too long", ed + " " + strings.Repeat("c", MaxCommentLen+1), "comment longer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.in)
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", got)
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is %T, want *ParseError", err, err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
			if got != (PublicKey{}) {
				t.Errorf("non-zero key returned with error: %+v", got)
			}
		})
	}
}

// The message must never echo the input: a pasted private key must not end
// up in API responses or logs.
func TestParseErrorDoesNotEchoPrivateKey(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	body := base64.StdEncoding.EncodeToString(block.Bytes)
	_, err = Parse(string(pem.EncodeToMemory(block)))
	if err == nil {
		t.Fatal("private key accepted")
	}
	if strings.Contains(err.Error(), body[:40]) {
		t.Fatalf("error echoes key material: %v", err)
	}
}

func FuzzParse(f *testing.F) {
	ed := newEd25519Line(f)
	for _, s := range []string{
		ed, ed + " comment", " " + ed + "\t", `command="x" ` + ed, ed + "\n" + ed,
		skEd25519Line, skECDSALine, newECDSALine(f, elliptic.P256()) + " x",
		"ssh-ed25519 ssh-ed25519 " + strings.Fields(ed)[1], "# " + ed, "", "ssh-rsa AAAA",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		pk, err := Parse(in)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is %T, want *ParseError", err, err)
			}
			return
		}
		if strings.ContainsAny(pk.Line, "\n\r\x00") {
			t.Fatalf("accepted line contains a line break or NUL: %q", pk.Line)
		}
		k, _, opts, rest, err := ssh.ParseAuthorizedKey([]byte(pk.Line))
		if err != nil || len(opts) > 0 || len(rest) > 0 {
			t.Fatalf("canonical line %q: err=%v options=%q rest=%q", pk.Line, err, opts, rest)
		}
		if fp := ssh.FingerprintSHA256(k); fp != pk.Fingerprint {
			t.Fatalf("re-parsed fingerprint %s, want %s", fp, pk.Fingerprint)
		}
		again, err := Parse(pk.Line)
		if err != nil {
			t.Fatalf("canonical line %q rejected: %v", pk.Line, err)
		}
		if again != pk {
			t.Fatalf("re-parse differs: %+v vs %+v", again, pk)
		}
	})
}
