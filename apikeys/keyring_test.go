package apikeys

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/store"
)

// openDir opens a store and keyring in dir.
func openDir(t *testing.T, dir string, logger *slog.Logger) (*store.Store, *Keyring, func(testing.TB)) {
	t.Helper()
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	k, err := Open(st, logger)
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	var once sync.Once
	closeBoth := func(tb testing.TB) {
		once.Do(func() {
			if err := k.Close(); err != nil {
				tb.Errorf("close keyring: %v", err)
			}
			if err := st.Close(); err != nil {
				tb.Errorf("close store: %v", err)
			}
		})
	}
	t.Cleanup(func() { closeBoth(t) })
	return st, k, closeBoth
}

func bearer(tok string) []byte { return []byte("Bearer " + tok) }

func mustCreate(t testing.TB, k *Keyring, name string) (string, Key) {
	t.Helper()
	secret, key, err := k.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	return secret, key
}

var (
	secretRE = regexp.MustCompile(`^hearth_live_[0-9A-Za-z]{32}$`)
	idRE     = regexp.MustCompile(`^key_[0-9A-Za-z]{20}$`)
)

func TestCreateAuthenticateRevokeList(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)

	s1, k1 := mustCreate(t, k, "laptop")
	s2, k2 := mustCreate(t, k, "ci runner")
	for _, s := range []string{s1, s2} {
		if !secretRE.MatchString(s) {
			t.Fatalf("secret %q does not match %v", s, secretRE)
		}
	}
	if s1 == s2 || k1.ID == k2.ID {
		t.Fatal("two keys share a secret or id")
	}
	for _, key := range []Key{k1, k2} {
		if !idRE.MatchString(key.ID) {
			t.Errorf("id %q does not match %v", key.ID, idRE)
		}
		if key.CreatedAt.IsZero() || key.Revoked() {
			t.Errorf("new key %+v: want created, not revoked", key)
		}
	}
	if want := "hearth_live_…" + s1[len(s1)-4:]; k1.Hint != want {
		t.Errorf("hint %q, want %q", k1.Hint, want)
	}

	got, err := k.Authenticate(bearer(s1))
	if err != nil || got.ID != k1.ID || got.Name != "laptop" {
		t.Fatalf("Authenticate(s1) = %+v, %v; want %s", got, err, k1.ID)
	}
	got, err = k.Authenticate(bearer(s2))
	if err != nil || got.ID != k2.ID {
		t.Fatalf("Authenticate(s2) = %+v, %v; want %s", got, err, k2.ID)
	}

	if err := k.Revoke(k1.ID); err != nil {
		t.Fatal(err)
	}
	// The very next request with the revoked key fails; the other still works.
	if _, err := k.Authenticate(bearer(s1)); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked key: got %v, want ErrRevoked", err)
	}
	if _, err := k.Authenticate(bearer(s2)); err != nil {
		t.Fatalf("other key after revoke: %v", err)
	}

	list := k.List()
	if len(list) != 2 || list[0].ID != k1.ID || list[1].ID != k2.ID {
		t.Fatalf("List = %+v; want [%s %s] oldest first", list, k1.ID, k2.ID)
	}
	if !list[0].Revoked() || list[1].Revoked() {
		t.Fatalf("List revoked flags wrong: %+v", list)
	}
	first := *list[0].RevokedAt

	// Revoking again succeeds and keeps the first revocation time.
	if err := k.Revoke(k1.ID); err != nil {
		t.Fatalf("second revoke: %v", err)
	}
	if again, _ := k.Get(k1.ID); !again.RevokedAt.Equal(first) {
		t.Fatalf("second revoke moved revoked_at from %v to %v", first, again.RevokedAt)
	}
	if err := k.Revoke("key_doesnotexist000000"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke unknown: got %v, want ErrNotFound", err)
	}
	if _, err := k.Get("key_nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get unknown: got %v, want ErrNotFound", err)
	}
}

func TestCreateValidatesName(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	bad := []string{"", "   ", strings.Repeat("a", 65), "tab\there", "new\nline", "nul\x00", "\xff\xfe", "bell\a"}
	for _, name := range bad {
		if _, _, err := k.Create(name); !errors.Is(err, ErrInvalidName) {
			t.Errorf("Create(%q) = %v, want ErrInvalidName", name, err)
		}
	}
	good := []string{"a", strings.Repeat("é", 64), "prod – eu west #1", "ключ"}
	for _, name := range good {
		if _, key, err := k.Create(name); err != nil || key.Name != name {
			t.Errorf("Create(%q) = %+v, %v", name, key, err)
		}
	}
	if n := len(k.List()); n != len(good) {
		t.Fatalf("List has %d keys, want %d (rejected names must not be stored)", n, len(good))
	}
}

func TestAuthenticateRejects(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	secret, key := mustCreate(t, k, "good")
	body := secret[len(Prefix):]
	other := Prefix + strings.Repeat("A", 32) // well-formed, never issued

	tests := []struct {
		name   string
		header string
		want   error
	}{
		{"canonical", "Bearer " + secret, nil},
		{"lowercase scheme", "bearer " + secret, nil},
		{"uppercase scheme", "BEARER " + secret, nil},
		{"several spaces", "Bearer   " + secret, nil},
		{"empty", "", ErrMissing},
		{"scheme only", "Bearer", ErrMalformed},
		{"scheme and space", "Bearer ", ErrMalformed},
		{"no space", "Bearer" + secret, ErrMalformed},
		{"basic scheme", "Basic " + secret, ErrMalformed},
		{"bare token", secret, ErrMalformed},
		{"tab separator", "Bearer\t" + secret, ErrMalformed},
		{"openai key", "Bearer sk-" + strings.Repeat("x", 48), ErrForeignKey},
		{"other env", "Bearer hearth_test_" + body, ErrForeignKey},
		{"prefix case", "Bearer HEARTH_LIVE_" + body, ErrForeignKey},
		{"too short", "Bearer " + secret[:len(secret)-1], ErrMalformed},
		{"too long", "Bearer " + secret + "A", ErrMalformed},
		{"prefix only", "Bearer " + Prefix, ErrMalformed},
		{"trailing space", "Bearer " + secret + " ", ErrMalformed},
		{"bad alphabet", "Bearer " + Prefix + strings.Repeat("-", 32), ErrMalformed},
		{"non-ascii", "Bearer " + Prefix + "é" + body[2:], ErrMalformed},
		{"unknown key", "Bearer " + other, ErrUnknownKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := k.Authenticate([]byte(tt.header))
			if !errors.Is(err, tt.want) {
				t.Fatalf("Authenticate(%q) error = %v, want %v", tt.header, err, tt.want)
			}
			if tt.want == nil && got.ID != key.ID {
				t.Fatalf("authenticated as %q, want %q", got.ID, key.ID)
			}
			if tt.want != nil && got.ID != "" {
				t.Fatalf("failed authentication returned key %+v", got)
			}
		})
	}

	// A token that differs from a valid one in any single character fails.
	for i := len(Prefix); i < len(secret); i++ {
		b := []byte(secret)
		if b[i] == 'a' {
			b[i] = 'b'
		} else {
			b[i] = 'a'
		}
		if _, err := k.Authenticate(bearer(string(b))); !errors.Is(err, ErrUnknownKey) {
			t.Fatalf("token altered at %d: got %v, want ErrUnknownKey", i, err)
		}
	}
}

func TestReason(t *testing.T) {
	want := map[error]string{
		nil: "", ErrMissing: "missing", ErrMalformed: "malformed", ErrForeignKey: "foreign",
		ErrUnknownKey: "unknown", ErrRevoked: "revoked", errors.New("x"): "error",
	}
	for err, w := range want {
		if got := Reason(err); got != w {
			t.Errorf("Reason(%v) = %q, want %q", err, got, w)
		}
	}
}

func TestPersistenceAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	_, k, closeAll := openDir(t, dir, nil)
	s1, k1 := mustCreate(t, k, "one")
	s2, k2 := mustCreate(t, k, "two")
	if err := k.Revoke(k2.ID); err != nil {
		t.Fatal(err)
	}
	before := k.List()
	closeAll(t)

	_, k, _ = openDir(t, dir, nil)
	if got, err := k.Authenticate(bearer(s1)); err != nil || got.ID != k1.ID {
		t.Fatalf("after reopen Authenticate(s1) = %+v, %v", got, err)
	}
	if _, err := k.Authenticate(bearer(s2)); !errors.Is(err, ErrRevoked) {
		t.Fatalf("after reopen revoked key: got %v, want ErrRevoked", err)
	}
	after := k.List()
	if len(after) != len(before) {
		t.Fatalf("after reopen %d keys, want %d", len(after), len(before))
	}
	for i := range before {
		b, a := before[i], after[i]
		if a.ID != b.ID || a.Name != b.Name || a.Hint != b.Hint || !a.CreatedAt.Equal(b.CreatedAt) ||
			a.Revoked() != b.Revoked() || (a.Revoked() && !a.RevokedAt.Equal(*b.RevokedAt)) {
			t.Errorf("key %d changed across reopen:\nbefore %+v\nafter  %+v", i, b, a)
		}
	}
}

func TestClosedKeyringRefusesChanges(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	secret, key := mustCreate(t, k, "x")
	if err := k.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := k.Create("y"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Create after Close: %v, want ErrClosed", err)
	}
	if err := k.Revoke(key.ID); !errors.Is(err, ErrClosed) {
		t.Fatalf("Revoke after Close: %v, want ErrClosed", err)
	}
	if _, err := k.Authenticate(bearer(secret)); err != nil {
		t.Fatalf("Authenticate after Close: %v", err)
	}
}

func TestOpenRejectsCorruptRecord(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Put(keyPrefix+"key_a", record{Key: Key{ID: "key_a"}, SHA256: "nothex"}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(st, nil); err == nil {
		t.Fatal("Open accepted a record with a bad hash")
	}
	if err := st.Put(keyPrefix+"key_a", record{Key: Key{ID: "key_b"}, SHA256: strings.Repeat("0", 64)}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(st, nil); err == nil {
		t.Fatal("Open accepted a record whose id does not match its key")
	}
}

// TestSecretNeverStoredOrLogged scans every value in the store, every byte
// of the Pebble directory and all log output for the plaintext.
func TestSecretNeverStoredOrLogged(t *testing.T) {
	dir := t.TempDir()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	st, k, closeAll := openDir(t, dir, logger)

	var secrets []string
	var keys []Key
	for i := range 3 {
		s, key := mustCreate(t, k, fmt.Sprintf("key %d", i))
		secrets = append(secrets, s)
		keys = append(keys, key)
		if _, err := k.Authenticate(bearer(s)); err != nil {
			t.Fatal(err)
		}
		k.RecordUsage(key.ID, 1, 10, 20)
	}
	if err := k.Revoke(keys[0].ID); err != nil {
		t.Fatal(err)
	}
	_, _ = k.Authenticate(bearer(secrets[0])) // a failure must not log the token either
	if err := k.Flush(); err != nil {
		t.Fatal(err)
	}

	// Values as the store returns them.
	var values [][]byte
	if err := st.Scan("", "", false, func(key string, val []byte) (bool, error) {
		values = append(values, bytes.Clone(val))
		return true, nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(values) != 3 {
		t.Fatalf("store holds %d records, want 3", len(values))
	}

	closeAll(t)
	var files [][]byte
	if err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		files = append(files, b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	raw := bytes.Join(files, nil)

	for i, s := range secrets {
		body := []byte(s[len(Prefix):]) // the random part alone
		for _, v := range values {
			if bytes.Contains(v, body) {
				t.Errorf("secret %d found in a store value: %s", i, v)
			}
		}
		if bytes.Contains(raw, body) {
			t.Errorf("secret %d found in the Pebble directory", i)
		}
		if bytes.Contains(logs.Bytes(), body) {
			t.Errorf("secret %d found in the log: %s", i, logs.Bytes())
		}
		// Controls: the hash is stored and the key's id is logged, so the
		// scans above are looking at the right bytes.
		sum := sha256.Sum256([]byte(s))
		if !bytes.Contains(raw, []byte(hex.EncodeToString(sum[:]))) {
			t.Errorf("hash of secret %d not found in the Pebble directory; scan is blind", i)
		}
		if !bytes.Contains(logs.Bytes(), []byte(keys[i].ID)) {
			t.Errorf("key %s not in the log; log capture is blind", keys[i].ID)
		}
	}
}

func TestUsageTotals(t *testing.T) {
	dir := t.TempDir()
	_, k, closeAll := openDir(t, dir, nil)
	_, a := mustCreate(t, k, "a")
	_, b := mustCreate(t, k, "b")

	k.RecordUsage(a.ID, 1, 100, 7)
	k.RecordUsage(a.ID, 2, 50, 3)
	k.RecordUsage(b.ID, 1, 0, 0)
	k.RecordUsage("key_unknown", 5, 5, 5) // ignored

	want := map[string]Usage{
		a.ID: {Requests: 3, PromptTokens: 150, CompletionTokens: 10},
		b.ID: {Requests: 1},
	}
	check := func(stage string, k *Keyring) {
		t.Helper()
		list := k.List()
		if len(list) != 2 {
			t.Fatalf("%s: %d keys, want 2", stage, len(list))
		}
		for _, key := range list {
			if key.Usage != want[key.ID] {
				t.Errorf("%s: usage of %s = %+v, want %+v", stage, key.ID, key.Usage, want[key.ID])
			}
		}
	}
	check("unflushed", k)

	// Revoking writes the record; the totals it carries must stay right.
	if err := k.Revoke(b.ID); err != nil {
		t.Fatal(err)
	}
	k.RecordUsage(b.ID, 1, 1, 1) // a request that was in flight at revocation
	want[b.ID] = Usage{Requests: 2, PromptTokens: 1, CompletionTokens: 1}
	check("after revoke", k)

	closeAll(t)
	_, k, _ = openDir(t, dir, nil)
	check("after reopen", k)

	// Totals keep accumulating from the persisted values.
	k.RecordUsage(a.ID, 1, 1, 1)
	want[a.ID] = Usage{Requests: 4, PromptTokens: 151, CompletionTokens: 11}
	check("after more usage", k)
}

func TestRunFlushesPeriodically(t *testing.T) {
	dir := t.TempDir()
	st, k, _ := openDir(t, dir, nil)
	_, key := mustCreate(t, k, "a")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- k.Run(ctx, 10*time.Millisecond) }()

	k.RecordUsage(key.ID, 1, 2, 3)
	// The flush is periodic, so poll the store rather than the keyring.
	testutil.WaitFor(t, 10*time.Second, "Run to flush the usage to the store", func() bool {
		var r record
		if err := st.Get(keyPrefix+key.ID, &r); err != nil {
			t.Fatal(err)
		}
		return r.Usage == (Usage{Requests: 1, PromptTokens: 2, CompletionTokens: 3})
	})

	// Cancelling Run flushes what is left.
	k.RecordUsage(key.ID, 1, 0, 0)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	var r record
	if err := st.Get(keyPrefix+key.ID, &r); err != nil {
		t.Fatal(err)
	}
	if r.Usage.Requests != 2 {
		t.Fatalf("after Run returned, stored requests = %d, want 2", r.Usage.Requests)
	}
	if err := k.Run(ctx, 0); err == nil {
		t.Fatal("Run accepted a zero interval")
	}
}

// TestConcurrentUse runs Authenticate, RecordUsage, Revoke, Create and Flush
// together; run it with -race.
func TestConcurrentUse(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	const nKeys, workers, rounds = 8, 4, 2000
	secrets := make([]string, nKeys)
	keys := make([]Key, nKeys)
	for i := range nKeys {
		secrets[i], keys[i] = mustCreate(t, k, fmt.Sprintf("k%d", i))
	}

	var wg sync.WaitGroup
	errs := make(chan error, workers+2)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				i := (w + r) % nKeys
				got, err := k.Authenticate(bearer(secrets[i]))
				switch {
				case err == nil:
					if got.ID != keys[i].ID {
						errs <- fmt.Errorf("token %d authenticated as %s", i, got.ID)
						return
					}
				case errors.Is(err, ErrRevoked):
					if i%2 == 1 {
						errs <- fmt.Errorf("key %d reported revoked but never was", i)
						return
					}
				default:
					errs <- fmt.Errorf("authenticate: %w", err)
					return
				}
				// Count every request, revoked or not, so the totals are exact.
				k.RecordUsage(keys[i].ID, 1, 2, 3)
			}
		})
	}
	wg.Go(func() {
		for i := 0; i < nKeys; i += 2 {
			if err := k.Revoke(keys[i].ID); err != nil {
				errs <- err
				return
			}
			// Takes effect for the very next request, from any goroutine.
			if _, err := k.Authenticate(bearer(secrets[i])); !errors.Is(err, ErrRevoked) {
				errs <- fmt.Errorf("right after Revoke: %v", err)
				return
			}
		}
	})
	wg.Go(func() {
		for i := range 5 {
			if _, _, err := k.Create(fmt.Sprintf("extra %d", i)); err != nil {
				errs <- err
				return
			}
			if err := k.Flush(); err != nil {
				errs <- err
				return
			}
			_ = k.List()
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	var total Usage
	for _, key := range k.List() {
		total.Requests += key.Usage.Requests
		total.PromptTokens += key.Usage.PromptTokens
		total.CompletionTokens += key.Usage.CompletionTokens
	}
	n := int64(workers * rounds)
	if want := (Usage{n, 2 * n, 3 * n}); total != want {
		t.Fatalf("usage totals %+v, want %+v", total, want)
	}
	for i := 0; i < nKeys; i += 2 {
		if _, err := k.Authenticate(bearer(secrets[i])); !errors.Is(err, ErrRevoked) {
			t.Errorf("key %d after revoke: %v", i, err)
		}
	}
}

func TestAuthenticateDoesNotAllocate(t *testing.T) {
	_, k, _ := openDir(t, t.TempDir(), nil)
	secret, key := mustCreate(t, k, "a")
	ok := bearer(secret)
	revoked, rkey := mustCreate(t, k, "b")
	if err := k.Revoke(rkey.ID); err != nil {
		t.Fatal(err)
	}
	headers := [][]byte{ok, bearer(revoked), []byte("Bearer sk-abc"), []byte("Bearer " + Prefix + "short"), nil}
	for _, h := range headers {
		allocs := testing.AllocsPerRun(200, func() {
			_, _ = k.Authenticate(h)
			k.RecordUsage(key.ID, 1, 1, 1)
		})
		if allocs != 0 {
			t.Errorf("Authenticate(%q)+RecordUsage allocates %.1f times per call", h, allocs)
		}
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	st, err := store.Open(b.TempDir(), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	k, err := Open(st, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Close()
	// A realistic keyring: a handful of keys, the one in use among them.
	for i := range 20 {
		mustCreate(b, k, fmt.Sprintf("k%d", i))
	}
	secret, key := mustCreate(b, k, "bench")
	h := bearer(secret)

	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k.Authenticate(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := k.Authenticate(h); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("foreign", func(b *testing.B) {
		b.ReportAllocs()
		fh := []byte("Bearer sk-proj-abcdefghijklmnopqrstuvwxyz0123456789")
		for b.Loop() {
			_, _ = k.Authenticate(fh)
		}
	})
	b.Run("record-usage-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k.RecordUsage(key.ID, 1, 10, 20)
			}
		})
	})
}
