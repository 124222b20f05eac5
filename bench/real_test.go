package bench

import (
	"strings"
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

// TestRealResultPairedRounds checks the per-round rows against nginx: the
// TTFT difference is taken within each round, and its median over rounds.
func TestRealResultPairedRounds(t *testing.T) {
	side := func(ttft float64, tokens int64, cpu float64) Side {
		return Side{Tokens: tokens, ElapsedS: 1, TTFT: Dist{P50: ttft}, ProxyCPUS: cpu}
	}
	ng := func(s Side) *Side { return &s }
	r := &RealResult{Rounds: []RealRound{
		{Direct: side(4000, 100, 0), Nginx: ng(side(4100, 100, 0.0014)), Through: side(4090, 100, 0.0018)},
		{Direct: side(3000, 100, 0), Nginx: ng(side(3200, 100, 0.0014)), Through: side(3377, 100, 0.0018)},
		{Direct: side(5000, 100, 0), Nginx: ng(side(5500, 100, 0.0015)), Through: side(5553, 100, 0.0019)},
	}}
	r.aggregate()
	if r.PairedTTFTP50 != 53 {
		t.Errorf("paired TTFT p50 %v, want 53 (the median of -10, 177, 53)", r.PairedTTFTP50)
	}
	md := r.Markdown()
	for _, want := range []string{
		"| each round: TTFT p50 hearthd − nginx | | | -10, +177, +53 µs | median 53 µs |",
		"| each round: proxy CPU per token | | 14.0 / 18.0, 14.0 / 18.0, 15.0 / 19.0 µs (nginx / hearthd) | | |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, md)
		}
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of 1..4 = %v, want 2.5", got)
	}
}
