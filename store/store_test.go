package store

import (
	"bytes"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/vfs"

	"github.com/hearthd/hearth/store/storetest"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

func openMem(t *testing.T) *Store {
	t.Helper()
	s, err := Open("db", Options{FS: vfs.NewMem()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestGetPutHasDelete(t *testing.T) {
	s := openMem(t)
	var r rec
	if err := s.Get("a/1", &r); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get missing = %v, want ErrNotFound", err)
	}
	if ok, err := s.Has("a/1"); err != nil || ok {
		t.Fatalf("Has missing = %v, %v", ok, err)
	}
	if err := s.Put("a/1", rec{"one", 1}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("a/1", &r); err != nil || r != (rec{"one", 1}) {
		t.Fatalf("Get = %+v, %v", r, err)
	}
	if ok, err := s.Has("a/1"); err != nil || !ok {
		t.Fatalf("Has = %v, %v", ok, err)
	}
	if err := s.Put("a/1", rec{"uno", 2}); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("a/1", &r); err != nil || r != (rec{"uno", 2}) {
		t.Fatalf("Get after overwrite = %+v, %v", r, err)
	}
	if err := s.Delete("a/1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("a/1", &r); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get deleted = %v, want ErrNotFound", err)
	}
	if err := s.Delete("a/1"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if err := s.Put("bad", func() {}); err == nil {
		t.Fatal("Put of an unencodable value succeeded")
	}
	b := s.NewBatch()
	if err := b.PutRaw("raw", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := s.Get("raw", &r); err == nil || errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a non-JSON value = %v, want a decode error", err)
	}
}

func TestScan(t *testing.T) {
	s := openMem(t)
	for _, k := range []string{"a/1", "a/2", "a/3", "a0", "b/1", "a"} {
		if err := s.Put(k, rec{Name: k}); err != nil {
			t.Fatal(err)
		}
	}
	scan := func(prefix, start string, reverse bool, limit int) []string {
		t.Helper()
		var got []string
		err := s.Scan(prefix, start, reverse, func(key string, val []byte) (bool, error) {
			got = append(got, key)
			return limit == 0 || len(got) < limit, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	tests := []struct {
		prefix, start string
		reverse       bool
		limit         int
		want          string
	}{
		{"a/", "", false, 0, "[a/1 a/2 a/3]"},
		{"a/", "", true, 0, "[a/3 a/2 a/1]"},
		{"a/", "a/2", false, 0, "[a/2 a/3]"},
		{"a/", "a/2", true, 0, "[a/1]"},
		{"a/", "", false, 2, "[a/1 a/2]"},
		{"b/", "", false, 0, "[b/1]"},
		{"c/", "", false, 0, "[]"},
		{"", "", false, 0, "[a a/1 a/2 a/3 a0 b/1]"},
	}
	for _, tt := range tests {
		if got := fmt.Sprint(scan(tt.prefix, tt.start, tt.reverse, tt.limit)); got != tt.want {
			t.Errorf("Scan(%q, %q, reverse=%v, limit %d) = %s, want %s",
				tt.prefix, tt.start, tt.reverse, tt.limit, got, tt.want)
		}
	}

	boom := errors.New("boom")
	if err := s.Scan("a/", "", false, func(string, []byte) (bool, error) { return true, boom }); !errors.Is(err, boom) {
		t.Fatalf("Scan callback error = %v, want boom", err)
	}

	var names []string
	if err := ScanJSON(s, "a/", func(key string, r rec) (bool, error) {
		if r.Name != key {
			return false, fmt.Errorf("record %q decoded as %+v", key, r)
		}
		names = append(names, r.Name)
		return true, nil
	}); err != nil || fmt.Sprint(names) != "[a/1 a/2 a/3]" {
		t.Fatalf("ScanJSON = %v, %v", names, err)
	}
}

func TestBatchAllOrNothing(t *testing.T) {
	s := openMem(t)
	if err := s.Put("gone", rec{}); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	if err := b.Put("x", rec{N: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.Put("y", rec{N: 2}); err != nil {
		t.Fatal(err)
	}
	b.Delete("gone")
	// Nothing is visible before Commit.
	if ok, _ := s.Has("x"); ok {
		t.Fatal("batch write visible before Commit")
	}
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]bool{"x": true, "y": true, "gone": false} {
		if ok, err := s.Has(k); err != nil || ok != want {
			t.Errorf("after Commit Has(%q) = %v, %v; want %v", k, ok, err, want)
		}
	}

	d := s.NewBatch()
	if err := d.Put("z", rec{}); err != nil {
		t.Fatal(err)
	}
	d.Discard()
	if ok, _ := s.Has("z"); ok {
		t.Fatal("discarded batch was applied")
	}
}

func TestPrefixEnd(t *testing.T) {
	for in, want := range map[string][]byte{
		"a/":         []byte("a0"),
		"a":          []byte("b"),
		"a\xff":      []byte("b"),
		"\xff\xff":   nil,
		"ab\xff\xff": []byte("ac"),
	} {
		if got := prefixEnd([]byte(in)); !bytes.Equal(got, want) {
			t.Errorf("prefixEnd(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestReopenOnDisk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nested", "state")
	s, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put("k", rec{"v", 7}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var r rec
	if err := s.Get("k", &r); err != nil || r != (rec{"v", 7}) {
		t.Fatalf("after reopen Get = %+v, %v", r, err)
	}
}

// TestCrashKeepsAcknowledgedWrites cuts the power (discarding everything not
// synced) after each acknowledged write, starting from a state directory the
// store itself created.
func TestCrashKeepsAcknowledgedWrites(t *testing.T) {
	fs := storetest.NewCrashFS(t) // the store makes its directory itself
	const dir = "var/lib/hearthd"
	open := func() *Store {
		t.Helper()
		s, err := Open(dir, Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	crash := func(s *Store) *Store {
		fs.Crash(func() { _ = s.Close() })
		return open()
	}
	want := map[string]rec{}
	check := func(stage string, s *Store) {
		t.Helper()
		got := map[string]rec{}
		if err := ScanJSON(s, "", func(k string, r rec) (bool, error) {
			got[k] = r
			return true, nil
		}); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: after crash %v, want %v", stage, got, want)
		}
	}

	s := open()
	for i := range 3 {
		k := fmt.Sprintf("k/%d", i)
		if err := s.Put(k, rec{k, i}); err != nil {
			t.Fatal(err)
		}
		want[k] = rec{k, i}
		s = crash(s)
		check("put "+k, s)
	}

	b := s.NewBatch()
	for _, k := range []string{"b/1", "b/2"} {
		if err := b.Put(k, rec{Name: k}); err != nil {
			t.Fatal(err)
		}
		want[k] = rec{Name: k}
	}
	b.Delete("k/0")
	delete(want, "k/0")
	if err := b.Commit(); err != nil {
		t.Fatal(err)
	}
	s = crash(s)
	check("batch", s)

	if err := s.Delete("k/1"); err != nil {
		t.Fatal(err)
	}
	delete(want, "k/1")
	s = crash(s)
	check("delete", s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
