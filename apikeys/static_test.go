package apikeys

import (
	"errors"
	"testing"
)

func TestStatic(t *testing.T) {
	s := NewStatic()
	secret, key := s.Add("fake")
	other, okey := s.Add("other")
	if !secretRE.MatchString(secret) || !idRE.MatchString(key.ID) || key.Name != "fake" {
		t.Fatalf("Add = %q, %+v", secret, key)
	}

	if got, err := s.Authenticate(bearer(secret)); err != nil || got.ID != key.ID {
		t.Fatalf("Authenticate = %+v, %v", got, err)
	}
	// Same parsing, same errors as Keyring.
	for h, want := range map[string]error{
		"":                                       ErrMissing,
		"Bearer":                                 ErrMalformed,
		"Bearer sk-abc":                          ErrForeignKey,
		"Bearer " + Prefix:                       ErrMalformed,
		"Bearer " + secret[:len(secret)-1] + "!": ErrMalformed,
	} {
		if _, err := s.Authenticate([]byte(h)); !errors.Is(err, want) {
			t.Errorf("Authenticate(%q) = %v, want %v", h, err, want)
		}
	}
	if _, err := s.Authenticate(bearer(Prefix + "00000000000000000000000000000000")); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("unknown key: %v", err)
	}

	s.RecordUsage(key.ID, 1, 2, 3)
	s.RecordUsage(key.ID, 1, 2, 3)
	s.RecordUsage("key_unknown", 1, 1, 1)
	if u := s.Usage(key.ID); u != (Usage{2, 4, 6}) {
		t.Errorf("Usage = %+v", u)
	}
	if u := s.Usage("key_unknown"); u != (Usage{}) {
		t.Errorf("usage recorded for an unknown key: %+v", u)
	}

	if err := s.Revoke(key.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(bearer(secret)); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked: %v", err)
	}
	if got, err := s.Authenticate(bearer(other)); err != nil || got.ID != okey.ID {
		t.Fatalf("other key after revoke: %+v, %v", got, err)
	}
	if err := s.Revoke("key_missing"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("revoke unknown: %v", err)
	}
}
