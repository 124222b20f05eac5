package apikeys

import (
	"testing"
	"time"
)

func TestRequestsPerMinute(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	_, m := issued(t, "dk_rpm")
	m.RequestsPerMinute = 3
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		q := k.Admit("dk_rpm")
		if !q.Allowed || q.Requests != (Window{Limit: 3, Remaining: int64(2 - i), Reset: time.Duration(i+1) * 20 * time.Second}) || q.Tokens != (Window{}) {
			t.Fatalf("request %d: %+v", i, q)
		}
	}
	q := k.Admit("dk_rpm")
	if q.Allowed || q.RetryAfter != 20*time.Second || q.Requests.Remaining != 0 || q.Requests.Reset != time.Minute {
		t.Fatalf("4th request in the minute: %+v", q)
	}
	// The bucket refills continuously: a request's worth after 20 s.
	clk.Add(20 * time.Second)
	if q := k.Admit("dk_rpm"); !q.Allowed || q.Requests.Remaining != 0 {
		t.Fatalf("after 20 s: %+v", q)
	}
	clk.Add(time.Hour)
	if q := k.Admit("dk_rpm"); !q.Allowed || q.Requests.Remaining != 2 {
		t.Fatalf("after an hour the bucket is full, not more: %+v", q)
	}
	// An unlimited or unknown key is always allowed, without headers.
	if q := k.Admit("dk_nope"); !q.Allowed || q.Limited() {
		t.Fatalf("unknown key %+v", q)
	}
}

// Tokens are charged after a generation: a request admitted under the
// limit may leave it below zero, and the key then waits until a token is
// back.
func TestTokensPerMinute(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	_, m := issued(t, "dk_tpm")
	m.TokensPerMinute = 600 // 10 per second
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if q := k.Admit("dk_tpm"); !q.Allowed || q.Tokens != (Window{Limit: 600, Remaining: 600}) || q.Requests != (Window{}) {
		t.Fatalf("first request: %+v", q)
	}
	k.RecordUsage("dk_tpm", 1, 500, 200) // 700: 100 over
	q := k.Admit("dk_tpm")
	if q.Allowed || q.Tokens.Remaining != 0 || q.RetryAfter != 10100*time.Millisecond {
		t.Fatalf("over the token limit: %+v", q)
	}
	if q.Tokens.Reset != 70*time.Second {
		t.Fatalf("reset %v, want 70s (700 tokens at 10/s)", q.Tokens.Reset)
	}
	clk.Add(10 * time.Second)
	if q := k.Admit("dk_tpm"); q.Allowed {
		t.Fatalf("at zero: %+v", q)
	}
	clk.Add(100 * time.Millisecond)
	if q := k.Admit("dk_tpm"); !q.Allowed || q.Tokens.Remaining != 1 {
		t.Fatalf("back above zero: %+v", q)
	}
}

// Changing a key's limits with a new revision keeps what it used; lifting
// them removes the limiter.
func TestLimitsChangeKeepsUse(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	_, m := issued(t, "dk_l")
	m.RequestsPerMinute = 10
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	for range 8 {
		k.Admit("dk_l")
	}
	m.RequestsPerMinute = 20
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if q := k.Admit("dk_l"); q.Requests.Limit != 20 || q.Requests.Remaining != 1 {
		t.Fatalf("after raising the limit: %+v", q)
	}
	m.RequestsPerMinute = 1
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if q := k.Admit("dk_l"); !q.Allowed || q.Requests.Remaining != 0 {
		t.Fatalf("after lowering the limit: %+v", q)
	}
	m.RequestsPerMinute = 0
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if q := k.Admit("dk_l"); !q.Allowed || q.Limited() {
			t.Fatalf("after lifting the limit: %+v", q)
		}
	}
}

func TestStaticLimits(t *testing.T) {
	clk := newClock()
	s := NewStatic()
	s.Now = clk.Now
	_, key := s.AddLimited("l", 1, 100)
	if q := s.Admit(key.ID); !q.Allowed || q.Requests.Limit != 1 || q.Tokens.Limit != 100 {
		t.Fatalf("%+v", q)
	}
	if q := s.Admit(key.ID); q.Allowed || q.RetryAfter != time.Minute {
		t.Fatalf("%+v", q)
	}
	clk.Add(time.Minute)
	s.RecordUsage(key.ID, 1, 100, 1)
	if q := s.Admit(key.ID); q.Allowed || q.Tokens.Remaining != 0 {
		t.Fatalf("over the token limit: %+v", q)
	}
}
