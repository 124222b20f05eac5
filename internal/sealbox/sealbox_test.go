package sealbox

import (
	"bytes"
	"errors"
	"path/filepath"
	"testing"

	"github.com/hearthd/hearth/store"
)

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSealOpen(t *testing.T) {
	b, err := Load(openStore(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	ad := []byte("purpose")
	sealed := b.Seal([]byte("prefix"), []byte("the thinking"), ad)
	if !bytes.HasPrefix(sealed, []byte("prefix")) || bytes.Contains(sealed, []byte("thinking")) {
		t.Fatalf("sealed %q: prefix lost or plaintext visible", sealed)
	}
	sealed = sealed[len("prefix"):]
	got, err := b.Open(nil, sealed, ad)
	if err != nil || string(got) != "the thinking" {
		t.Fatalf("Open = %q, %v", got, err)
	}
	// Two seals of the same text differ (a fresh nonce each).
	if bytes.Equal(sealed, b.Seal(nil, []byte("the thinking"), ad)) {
		t.Error("two seals are the same")
	}
	for name, bad := range map[string][]byte{
		"tampered": append(append([]byte{}, sealed[:len(sealed)-1]...), sealed[len(sealed)-1]^1),
		"cut":      sealed[:10],
		"empty":    nil,
	} {
		if _, err := b.Open(nil, bad, ad); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: Open err = %v, want ErrOpen", name, err)
		}
	}
	if _, err := b.Open(nil, sealed, []byte("another purpose")); !errors.Is(err, ErrOpen) {
		t.Errorf("another ad: Open err = %v, want ErrOpen", err)
	}
}

// The key outlives a restart: what was sealed before opens after.
func TestKeySurvivesRestart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	st := openStore(t, dir)
	b, err := Load(st)
	if err != nil {
		t.Fatal(err)
	}
	sealed := b.Seal(nil, []byte("x"), nil)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = openStore(t, dir)
	defer st.Close()
	b2, err := Load(st)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := b2.Open(nil, sealed, nil); err != nil || string(got) != "x" {
		t.Fatalf("after a restart: Open = %q, %v", got, err)
	}
	// Another daemon's key does not open it.
	other, err := Load(openStore(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Open(nil, sealed, nil); !errors.Is(err, ErrOpen) {
		t.Errorf("another key opened it: %v", err)
	}
}

// Rotate makes everything sealed before unopenable, also after a restart.
func TestRotate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	st := openStore(t, dir)
	b, err := Load(st)
	if err != nil {
		t.Fatal(err)
	}
	old := b.Seal(nil, []byte("x"), nil)
	if err := b.Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Open(nil, old, nil); !errors.Is(err, ErrOpen) {
		t.Errorf("rotated: old seal opened (%v)", err)
	}
	fresh := b.Seal(nil, []byte("y"), nil)
	_ = st.Close()
	st = openStore(t, dir)
	defer st.Close()
	b2, err := Load(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b2.Open(nil, old, nil); !errors.Is(err, ErrOpen) {
		t.Errorf("rotated and restarted: old seal opened (%v)", err)
	}
	if got, err := b2.Open(nil, fresh, nil); err != nil || string(got) != "y" {
		t.Errorf("rotated and restarted: new seal = %q, %v", got, err)
	}
}

func TestNewRefusesBadKey(t *testing.T) {
	if _, err := New(make([]byte, 7)); err == nil {
		t.Error("a 7-byte key was taken")
	}
	if _, err := New(make([]byte, 32)); err != nil {
		t.Error(err)
	}
}
