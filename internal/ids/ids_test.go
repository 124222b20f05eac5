package ids

import (
	"strings"
	"testing"
)

func TestNewShape(t *testing.T) {
	for _, c := range []struct {
		prefix string
		n      int
	}{{"srv_", 24}, {"hearth_live_", 32}, {"chatcmpl-", 29}, {"", 1}, {"x_", 0}, {"", 200}} {
		id := New(c.prefix, c.n)
		if len(id) != len(c.prefix)+c.n || !strings.HasPrefix(id, c.prefix) {
			t.Fatalf("New(%q, %d) = %q", c.prefix, c.n, id)
		}
		if !Valid(id, c.prefix, c.n) {
			t.Fatalf("Valid rejects New(%q, %d) = %q", c.prefix, c.n, id)
		}
	}
}

func TestNewUnique(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := New("k_", 20)
		if seen[id] {
			t.Fatalf("duplicate %q", id)
		}
		seen[id] = true
	}
}

// Every character is equally likely. Without the rejection of bytes ≥ 248
// the first eight characters would come up 25% more often, which this
// chi-square bound catches by far; a fair source exceeds it with
// probability far below one in a billion.
func TestNewUniform(t *testing.T) {
	const perChar = 1000
	counts := map[byte]int{}
	s := New("", 62*perChar)
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	if len(counts) != 62 {
		t.Fatalf("%d distinct characters, want 62", len(counts))
	}
	chi2 := 0.0
	for c, k := range counts {
		if strings.IndexByte(Alphabet, c) < 0 {
			t.Fatalf("%q is not base62", c)
		}
		d := float64(k - perChar)
		chi2 += d * d / perChar
	}
	if chi2 > 160 { // 61 degrees of freedom: mean 61, sd 11
		t.Fatalf("chi-square %.1f over 62 characters: not uniform (%v)", chi2, counts)
	}
}

func TestIsBase62(t *testing.T) {
	for c := range 256 {
		want := strings.IndexByte(Alphabet, byte(c)) >= 0
		if got := IsBase62(byte(c)); got != want {
			t.Errorf("IsBase62(%q) = %v, want %v", byte(c), got, want)
		}
	}
}

func TestValid(t *testing.T) {
	for _, c := range []struct {
		s    string
		want bool
	}{
		{"fw_" + strings.Repeat("a", 24), true},
		{"fw_" + strings.Repeat("Z9", 12), true},
		{"fw_" + strings.Repeat("a", 23), false},
		{"fw_" + strings.Repeat("a", 25), false},
		{"sk_" + strings.Repeat("a", 24), false},
		{"fw_" + strings.Repeat("a", 23) + "-", false},
		{"fw_" + strings.Repeat("a", 23) + "é"[:1], false},
		{"", false},
	} {
		if got := Valid(c.s, "fw_", 24); got != c.want {
			t.Errorf("Valid(%q) = %v, want %v", c.s, got, c.want)
		}
	}
}

func BenchmarkNew(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = New("chatcmpl-", 29)
	}
}
