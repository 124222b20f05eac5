package deployapi

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hearthd/hearth/apikeys"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/fake"
)

// TestKeyOutcomes: a completion's time to first token and reasoning go to
// its key's usage over time, and every request answered with an error or
// whose stream ends in one counts one failure, once.
func TestKeyOutcomes(t *testing.T) {
	ta := startAPI(t, fake.Config{FirstTokenDelay: 30 * time.Millisecond, Reasoning: []string{"hm", "m"}}, nil)
	read := func(body string) int {
		t.Helper()
		resp := ta.post(t, body, nil)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// A plain completion and a streamed one that thinks.
	if c := read(`{"model":"hearth-tiny","messages":[{"role":"user","content":"hi"}]}`); c != 200 {
		t.Fatalf("status %d", c)
	}
	if c := read(`{"model":"hearth-tiny","stream":true,"reasoning_effort":"low","messages":[{"role":"user","content":"hi"}]}`); c != 200 {
		t.Fatalf("status %d", c)
	}
	// Refused: a bad request and an unknown model.
	if c := read(`{"model":"hearth-tiny","messages":[]}`); c != 400 {
		t.Fatalf("status %d", c)
	}
	if c := read(`{"model":"other","messages":[{"role":"user","content":"hi"}]}`); c != 404 {
		t.Fatalf("status %d", c)
	}
	var got []apikeys.Outcome
	testutil.WaitFor(t, 5*time.Second, "four outcomes", func() bool {
		got = ta.keys.Outcomes(ta.keyID)
		return len(got) >= 4
	})
	var ttft, failed int
	var reasoning int64
	for _, o := range got {
		if o.TTFT >= 30*time.Millisecond {
			ttft++
		}
		if o.Failed {
			failed++
		}
		reasoning += o.ReasoningTokens
	}
	if len(got) != 4 || ttft != 2 || failed != 2 || reasoning != 2 {
		t.Fatalf("outcomes %+v: want 2 with a TTFT ≥ 30 ms, 2 failed, 2 reasoning tokens", got)
	}
}

// TestKeyOutcomeOfAFailedStream: a stream that breaks after its head was
// sent counts as a failure of its key (its status was 200).
func TestKeyOutcomeOfAFailedStream(t *testing.T) {
	ta := startAPI(t, fake.Config{TokenCount: 5, StreamErr: errors.New("runtime died"), FailAfter: 2}, nil)
	resp := ta.post(t, `{"model":"hearth-tiny","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var got []apikeys.Outcome
	testutil.WaitFor(t, 5*time.Second, "the outcome", func() bool {
		got = ta.keys.Outcomes(ta.keyID)
		return len(got) > 0
	})
	if len(got) != 1 || !got[0].Failed || got[0].TTFT <= 0 {
		t.Fatalf("outcomes %+v, want one failure with a TTFT", got)
	}
}
