package nodeapi_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/hearthd/hearth/nodeapi"
)

func TestUsageBucketWire(t *testing.T) {
	b := nodeapi.UsageBucket{Seq: 3, KeyID: "dk_1", Minute: time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC), Requests: 2,
		PromptTokens: 10, CompletionTokens: 7, ReasoningTokens: 1, Errors: 1, TTFT: []uint64{0, 2}}
	got, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"seq":3,"key_id":"dk_1","minute":"2030-01-02T03:04:00Z","requests":2,"prompt_tokens":10,"completion_tokens":7,"reasoning_tokens":1,"errors":1,"ttft":[0,2]}`
	if string(got) != want {
		t.Fatalf("wire\n got %s\nwant %s", got, want)
	}
}

func TestTTFTHistogram(t *testing.T) {
	for _, c := range []struct {
		d   time.Duration
		bin int
	}{{0, 0}, {5 * time.Millisecond, 0}, {5*time.Millisecond + 1, 1}, {120 * time.Millisecond, 7}, {time.Minute, 23}, {2 * time.Minute, 24}} {
		if got := nodeapi.TTFTBin(c.d); got != c.bin {
			t.Errorf("TTFTBin(%v) = %d, want %d", c.d, got, c.bin)
		}
	}
	if _, ok := nodeapi.TTFTQuantile(nil, 0.5); ok {
		t.Error("a quantile of an empty histogram")
	}
	// 10 in (100, 150] ms: the median is in the middle of the bin.
	h := make([]uint64, 8)
	h[7] = 10
	if v, ok := nodeapi.TTFTQuantile(h, 0.5); !ok || v != 125 {
		t.Errorf("median %v %v, want 125", v, ok)
	}
	// 9 fast and 1 above every bound: p95 is the last bound, p50 in the first bin.
	h = make([]uint64, nodeapi.TTFTBins)
	h[0], h[nodeapi.TTFTBins-1] = 9, 1
	if v, _ := nodeapi.TTFTQuantile(h, 0.95); v != 60000 {
		t.Errorf("p95 %v, want 60000", v)
	}
	if v, _ := nodeapi.TTFTQuantile(h, 0.5); v <= 0 || v > 5 {
		t.Errorf("p50 %v, want within (0, 5]", v)
	}
	if got := nodeapi.AddTTFT([]uint64{1}, []uint64{0, 0, 3, 0}); len(got) != 3 || got[0] != 1 || got[2] != 3 {
		t.Errorf("AddTTFT %v", got)
	}
}
