package apikeys

import (
	"sync"
	"testing"
	"time"

	"github.com/hearthd/hearth/nodeapi"
)

func pending(t *testing.T, k *Keyring) []nodeapi.UsageBucket {
	t.Helper()
	b, more, err := k.PendingUsage(1 << 20)
	if err != nil || more {
		t.Fatalf("pending usage: %v (more %v)", err, more)
	}
	return b
}

// TestUsageBuckets: a managed key's requests count per minute; an ended
// minute is sealed with the next number, kept until acknowledged, and
// numbers go on across a restart. Local keys count none.
func TestUsageBuckets(t *testing.T) {
	clk := newClock() // 10:00:00
	dir := t.TempDir()
	st, k := openClocked(t, dir, clk)
	_, m := issued(t, "dk_b")
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	_, local := mustCreate(t, k, "local")
	k.RecordUsage("dk_b", 1, 10, 20)
	k.RecordOutcome("dk_b", Outcome{TTFT: 120 * time.Millisecond, ReasoningTokens: 5})
	k.RecordOutcome("dk_b", Outcome{Failed: true})
	k.RecordUsage(local.ID, 1, 1, 1)
	k.RecordOutcome(local.ID, Outcome{Failed: true})
	clk.Add(30 * time.Second)
	k.RecordUsage("dk_b", 1, 5, 5)
	if err := k.SealUsage(false); err != nil {
		t.Fatal(err)
	}
	if b := pending(t, k); len(b) != 0 {
		t.Fatalf("a minute not ended was sealed: %+v", b)
	}
	clk.Add(time.Minute) // 10:01:30
	k.RecordUsage("dk_b", 1, 1, 1)
	if err := k.Flush(); err != nil { // the flush seals too
		t.Fatal(err)
	}
	b := pending(t, k)
	want := nodeapi.UsageBucket{Seq: 1, KeyID: "dk_b", Minute: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), Requests: 2,
		PromptTokens: 15, CompletionTokens: 25, ReasoningTokens: 5, Errors: 1}
	if len(b) != 1 || b[0].Seq != want.Seq || b[0].KeyID != want.KeyID || !b[0].Minute.Equal(want.Minute) ||
		b[0].Requests != 2 || b[0].PromptTokens != 15 || b[0].CompletionTokens != 25 || b[0].ReasoningTokens != 5 ||
		b[0].Errors != 1 || len(b[0].TTFT) != nodeapi.TTFTBin(120*time.Millisecond)+1 || b[0].TTFT[len(b[0].TTFT)-1] != 1 {
		t.Fatalf("sealed %+v, want %+v and one TTFT in the 100–150 ms bin", b, want)
	}
	// A shutdown seals the minute in progress; a restart numbers on.
	closeKeyring(t, st, k)
	_, k = openClocked(t, dir, clk)
	b = pending(t, k)
	if len(b) != 2 || b[1].Seq != 2 || b[1].Requests != 1 || !b[1].Minute.Equal(want.Minute.Add(time.Minute)) {
		t.Fatalf("after a restart: %+v", b)
	}
	if err := k.AckUsage(1); err != nil {
		t.Fatal(err)
	}
	if b = pending(t, k); len(b) != 1 || b[0].Seq != 2 {
		t.Fatalf("after the acknowledgement of 1: %+v", b)
	}
	k.RecordUsage("dk_b", 1, 0, 0)
	clk.Add(time.Minute)
	if err := k.SealUsage(false); err != nil {
		t.Fatal(err)
	}
	if b = pending(t, k); len(b) != 2 || b[1].Seq != 3 {
		t.Fatalf("numbers did not go on: %+v", b)
	}
	if err := k.AckUsage(3); err != nil {
		t.Fatal(err)
	}
	if b = pending(t, k); len(b) != 0 {
		t.Fatalf("acknowledged buckets kept: %+v", b)
	}
}

// TestUsageBucketsOutliveTheKeys: a key taken out of the managed set, or
// a wipe, seals what the keys did so far; the buckets stay until sent.
func TestUsageBucketsOutliveTheKeys(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	_, m1 := issued(t, "dk_one")
	_, m2 := issued(t, "dk_two")
	if err := k.SetManaged([]Managed{m1, m2}); err != nil {
		t.Fatal(err)
	}
	k.RecordUsage("dk_one", 1, 1, 1)
	k.RecordUsage("dk_two", 2, 2, 2)
	if err := k.SetManaged([]Managed{m2}); err != nil {
		t.Fatal(err)
	}
	if b := pending(t, k); len(b) != 1 || b[0].KeyID != "dk_one" || b[0].Requests != 1 {
		t.Fatalf("after dk_one left: %+v", b)
	}
	if err := k.Wipe(); err != nil {
		t.Fatal(err)
	}
	b := pending(t, k)
	if len(b) != 2 || b[1].KeyID != "dk_two" || b[1].Requests != 2 {
		t.Fatalf("after the wipe: %+v", b)
	}
	if _, err := k.Get("dk_two"); err == nil {
		t.Fatal("the wipe kept the key")
	}
}

// TestUsageBucketsConcurrent: counts recorded while minutes are sealed
// are all in some bucket (run with -race).
func TestUsageBucketsConcurrent(t *testing.T) {
	clk := newClock()
	_, k := openClocked(t, t.TempDir(), clk)
	_, m := issued(t, "dk_c")
	if err := k.SetManaged([]Managed{m}); err != nil {
		t.Fatal(err)
	}
	const workers, each = 4, 500
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				k.RecordUsage("dk_c", 1, 2, 3)
				k.RecordOutcome("dk_c", Outcome{TTFT: time.Millisecond})
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			clk.Add(10 * time.Second)
			if err := k.SealUsage(false); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	if err := k.SealUsage(true); err != nil {
		t.Fatal(err)
	}
	var req, prompt, ttft uint64
	for _, b := range pending(t, k) {
		req += b.Requests
		prompt += b.PromptTokens
		for _, c := range b.TTFT {
			ttft += c
		}
	}
	if req != workers*each || prompt != 2*workers*each || ttft != workers*each {
		t.Fatalf("requests %d, prompt tokens %d, TTFTs %d; want %d, %d, %d", req, prompt, ttft, workers*each, 2*workers*each, workers*each)
	}
}
