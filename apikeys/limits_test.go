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
		q := k.Admit("dk_rpm", 0)
		if !q.Allowed || q.Requests != (Window{Limit: 3, Remaining: int64(2 - i), Reset: time.Duration(i+1) * 20 * time.Second}) || q.Tokens != (Window{}) {
			t.Fatalf("request %d: %+v", i, q)
		}
	}
	q := k.Admit("dk_rpm", 0)
	if q.Allowed || q.RetryAfter != 20*time.Second || q.Requests.Remaining != 0 || q.Requests.Reset != time.Minute {
		t.Fatalf("4th request in the minute: %+v", q)
	}
	// The bucket refills continuously: a request's worth after 20 s.
	clk.Add(20 * time.Second)
	if q := k.Admit("dk_rpm", 0); !q.Allowed || q.Requests.Remaining != 0 {
		t.Fatalf("after 20 s: %+v", q)
	}
	clk.Add(time.Hour)
	if q := k.Admit("dk_rpm", 0); !q.Allowed || q.Requests.Remaining != 2 {
		t.Fatalf("after an hour the bucket is full, not more: %+v", q)
	}
	// An unlimited or unknown key is always allowed, without headers.
	if q := k.Admit("dk_nope", 0); !q.Allowed || q.Limited() {
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
	if q := k.Admit("dk_tpm", 0); !q.Allowed || q.Tokens != (Window{Limit: 600, Remaining: 600}) || q.Requests != (Window{}) {
		t.Fatalf("first request: %+v", q)
	}
	k.RecordUsage("dk_tpm", 1, 500, 200) // 700: 100 over
	q := k.Admit("dk_tpm", 0)
	if q.Allowed || q.Tokens.Remaining != 0 || q.RetryAfter != 10100*time.Millisecond {
		t.Fatalf("over the token limit: %+v", q)
	}
	if q.Tokens.Reset != 70*time.Second {
		t.Fatalf("reset %v, want 70s (700 tokens at 10/s)", q.Tokens.Reset)
	}
	clk.Add(10 * time.Second)
	if q := k.Admit("dk_tpm", 0); q.Allowed {
		t.Fatalf("at zero: %+v", q)
	}
	clk.Add(100 * time.Millisecond)
	if q := k.Admit("dk_tpm", 0); !q.Allowed || q.Tokens.Remaining != 1 {
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
		k.Admit("dk_l", 0)
	}
	m.RequestsPerMinute = 20
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if q := k.Admit("dk_l", 0); q.Requests.Limit != 20 || q.Requests.Remaining != 1 {
		t.Fatalf("after raising the limit: %+v", q)
	}
	m.RequestsPerMinute = 1
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	if q := k.Admit("dk_l", 0); !q.Allowed || q.Requests.Remaining != 0 {
		t.Fatalf("after lowering the limit: %+v", q)
	}
	m.RequestsPerMinute = 0
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if q := k.Admit("dk_l", 0); !q.Allowed || q.Limited() {
			t.Fatalf("after lifting the limit: %+v", q)
		}
	}
}

func TestStaticLimits(t *testing.T) {
	clk := newClock()
	s := NewStatic()
	s.Now = clk.Now
	_, key := s.AddLimited("l", 1, 100)
	if q := s.Admit(key.ID, 0); !q.Allowed || q.Requests.Limit != 1 || q.Tokens.Limit != 100 {
		t.Fatalf("%+v", q)
	}
	if q := s.Admit(key.ID, 0); q.Allowed || q.RetryAfter != time.Minute {
		t.Fatalf("%+v", q)
	}
	clk.Add(time.Minute)
	s.RecordUsage(key.ID, 1, 100, 1)
	if q := s.Admit(key.ID, 0); q.Allowed || q.Tokens.Remaining != 0 {
		t.Fatalf("over the token limit: %+v", q)
	}
}

// A request reserves its estimated tokens at admission, so requests sent
// together cannot all start on the same tokens: once the reservations
// use the limit up, the next is refused until one is settled (its real
// tokens charged, its reservation given back). A reservation is at most
// the whole limit.
func TestTokensReservedAtAdmission(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	_, m := issued(t, "dk_res")
	m.TokensPerMinute = 100
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	q1 := k.Admit("dk_res", 60)
	if !q1.Allowed || q1.Reserved != 60 || q1.Tokens.Remaining != 40 {
		t.Fatalf("first: %+v", q1)
	}
	// 40 left: the second is admitted (a whole token is left) and goes
	// 20 below zero; the third waits.
	q2 := k.Admit("dk_res", 60)
	if !q2.Allowed || q2.Reserved != 60 || q2.Tokens.Remaining != 0 {
		t.Fatalf("second: %+v", q2)
	}
	if q := k.Admit("dk_res", 1); q.Allowed || q.Reserved != 0 || q.RetryAfter != 12600*time.Millisecond {
		t.Fatalf("third, over the reservations: %+v", q)
	}
	// The first used 10 of its 60: charged 10, 60 back: 30 left.
	k.RecordUsage("dk_res", 1, 4, 6)
	k.Release("dk_res", q1.Reserved)
	if q := k.Admit("dk_res", 0); !q.Allowed || q.Tokens.Remaining != 30 {
		t.Fatalf("after the first settled: %+v", q)
	}
	// The second used more than it reserved: the difference is charged.
	k.RecordUsage("dk_res", 1, 50, 50) // 100 of 60: 30 - 100 + 60 = -10
	k.Release("dk_res", q2.Reserved)
	if q := k.Admit("dk_res", 0); q.Allowed || q.Tokens.Remaining != 0 {
		t.Fatalf("after the second settled over its reservation: %+v", q)
	}
	clk.Add(time.Hour)
	// A reservation larger than the limit takes the whole limit, no more.
	q := k.Admit("dk_res", 5000)
	if !q.Allowed || q.Reserved != 100 || q.Tokens.Remaining != 0 || q.Tokens.Reset != time.Minute {
		t.Fatalf("huge reservation: %+v", q)
	}
	k.Release("dk_res", q.Reserved)
	if q := k.Admit("dk_res", 0); !q.Allowed || q.Tokens.Remaining != 100 {
		t.Fatalf("released: %+v", q)
	}
	// A key without a token limit reserves nothing.
	_, m2 := issued(t, "dk_free")
	if err := k.SetManaged([]Managed{m, m2}); err != nil {
		t.Fatal(err)
	}
	if q := k.Admit("dk_free", 500); !q.Allowed || q.Reserved != 0 {
		t.Fatalf("unlimited key: %+v", q)
	}
}
