package bench

import (
	"testing"
)

func TestRealResultAggregate(t *testing.T) {
	r := &RealResult{Rounds: []RealRound{
		{Direct: Side{Tokens: 100, ElapsedS: 1, TTFT: Dist{P50: 1000}, Errors: 1},
			Through: Side{Tokens: 90, ElapsedS: 1, TTFT: Dist{P50: 1200}, ProxyCPUS: 0.0009}},
		{Direct: Side{Tokens: 300, ElapsedS: 1, TTFT: Dist{P50: 3000}},
			Through: Side{Tokens: 110, ElapsedS: 1, TTFT: Dist{P50: 2800}, ProxyCPUS: 0.0011, Errors: 2}},
	}}
	r.aggregate()
	if r.DirectTokensPS != 200 || r.ThroughTokensPS != 100 || r.TokensPSRatio != 0.5 {
		t.Errorf("tokens/s %v, %v, ratio %v; want 200, 100, 0.5", r.DirectTokensPS, r.ThroughTokensPS, r.TokensPSRatio)
	}
	if r.DirectTTFTP50 != 2000 || r.ThroughTTFTP50 != 2000 || r.TTFTRatio != 1 {
		t.Errorf("TTFT %v, %v, ratio %v; want 2000, 2000, 1", r.DirectTTFTP50, r.ThroughTTFTP50, r.TTFTRatio)
	}
	if got := r.HearthdCPUusPerToken; got < 9.99 || got > 10.01 {
		t.Errorf("CPU per token %v µs, want 10", got)
	}
	if r.Errors != 3 {
		t.Errorf("errors %d, want 3", r.Errors)
	}
}
