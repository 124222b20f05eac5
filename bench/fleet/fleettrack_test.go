package fleet

import (
	"testing"
	"time"

	"github.com/hearthd/hearth/firewall"
	"github.com/hearthd/hearth/nodeapi"
)

var t0 = time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func samplesOf(p *propagation, k changeKind) []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.samples[k]...)
}

func TestPropagationPairsAnswerAndSighting(t *testing.T) {
	p := newPropagation()
	p.answered("srv_a", change{kind: changeCreate, answered: at(10)})
	p.saw("srv_a", []sighting{{kind: changeCreate}}, at(15))
	if got := samplesOf(p, changeCreate); len(got) != 1 || got[0] != 5*time.Millisecond {
		t.Fatalf("create samples %v, want [5ms]", got)
	}
	if pending, unmatched := p.counts(); pending != 0 || unmatched != 0 {
		t.Fatalf("pending %d unmatched %d", pending, unmatched)
	}
}

func TestPropagationSightingBeforeAnswerCountsZero(t *testing.T) {
	p := newPropagation()
	p.saw("srv_a", []sighting{{kind: changeCreate}}, at(8))
	if _, unmatched := p.counts(); unmatched != 1 {
		t.Fatalf("unmatched %d before the answer, want 1", unmatched)
	}
	p.answered("srv_a", change{kind: changeCreate, answered: at(10)})
	r := p.result()
	if r.BeforeAnswer != 1 || r.ByKind["create"].N != 1 || r.ByKind["create"].Max != 0 || r.Unmatched != 0 || r.Unseen != 0 {
		t.Fatalf("result %+v", r)
	}
}

// A node that polls after several changes sees only the newest state; the
// changes it never saw on their own are resolved by the later one.
func TestPropagationResolvesEarlierChangesOfTheServer(t *testing.T) {
	p := newPropagation()
	p.answered("srv_a", change{kind: changeCreate, answered: at(10)})
	p.answered("srv_a", change{kind: changeRuleAdd, rule: "fw_1", answered: at(20)})
	p.answered("srv_a", change{kind: changeRuleDelete, rule: "fw_1", answered: at(30)})
	p.answered("srv_a", change{kind: changeRuleAdd, rule: "fw_2", answered: at(40)})
	p.answered("srv_b", change{kind: changeCreate, answered: at(40)})
	p.saw("srv_a", []sighting{{kind: changeCreate}, {kind: changeRuleAdd, rule: "fw_2"}}, at(50))
	for k, want := range map[changeKind][]time.Duration{
		changeCreate:     {40 * time.Millisecond},
		changeRuleAdd:    {30 * time.Millisecond, 10 * time.Millisecond},
		changeRuleDelete: {20 * time.Millisecond},
	} {
		got := samplesOf(p, k)
		if len(got) != len(want) {
			t.Fatalf("%s samples %v, want %v", k, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s samples %v, want %v", k, got, want)
			}
		}
	}
	// srv_b's create is not resolved by srv_a's sighting.
	if pending, unmatched := p.counts(); pending != 1 || unmatched != 0 {
		t.Fatalf("pending %d unmatched %d, want 1 and 0", pending, unmatched)
	}
	if r := p.result(); r.Unseen != 1 || r.All.N != 4 {
		t.Fatalf("result %+v", r)
	}
}

// A sighting of a change not yet answered waits; one that no answer ever
// announces stays unmatched.
func TestPropagationEarlySightingInABatch(t *testing.T) {
	p := newPropagation()
	p.answered("srv_a", change{kind: changeRuleAdd, rule: "fw_1", answered: at(10)})
	p.saw("srv_a", []sighting{{kind: changeRuleAdd, rule: "fw_1"}, {kind: changeRuleAdd, rule: "fw_2"}}, at(12))
	p.saw("srv_a", []sighting{{kind: changeRuleAdd, rule: "fw_9"}}, at(13))
	p.answered("srv_a", change{kind: changeRuleAdd, rule: "fw_2", answered: at(14)})
	r := p.result()
	if d := r.ByKind["rule_add"]; d.N != 2 || d.Max != 2000 {
		t.Fatalf("rule_add %+v, want 2 samples up to 2 ms", d)
	}
	if r.BeforeAnswer != 1 || r.Unmatched != 1 || r.Unseen != 0 {
		t.Fatalf("result %+v", r)
	}
}

// simNode.see turns a node's successive desired states into sightings:
// every change of the management API below becomes exactly one sample.
func TestSimNodeSeesEveryChange(t *testing.T) {
	p := newPropagation()
	n := &simNode{prop: p}
	srv := &nodeapi.Server{ID: "srv_a"}
	rules := func(ids ...string) []firewall.Rule {
		var out []firewall.Rule
		for _, id := range ids {
			out = append(out, firewall.Rule{ID: id})
		}
		return out
	}
	steps := []struct {
		answer  *change
		desired nodeapi.Desired
	}{
		{nil, nodeapi.Desired{Revision: 1}}, // enrolled, in the pool
		{&change{kind: changeCreate}, nodeapi.Desired{Revision: 2, Server: srv}},
		{&change{kind: changeRuleAdd, rule: "fw_1"}, nodeapi.Desired{Revision: 3, Server: srv, FirewallRules: rules("fw_1")}},
		{&change{kind: changeRuleAdd, rule: "fw_2"}, nodeapi.Desired{Revision: 4, Server: srv, FirewallRules: rules("fw_1", "fw_2")}},
		{&change{kind: changeRuleDelete, rule: "fw_1"}, nodeapi.Desired{Revision: 5, Server: srv, FirewallRules: rules("fw_2")}},
		// The wipe carries no rules: that is no rule deletion.
		{&change{kind: changeDelete}, nodeapi.Desired{Revision: 6, Server: srv, Wipe: true}},
		{nil, nodeapi.Desired{Revision: 6, Server: srv, Wipe: true}}, // the same state again
		{nil, nodeapi.Desired{Revision: 7}},                          // wiped, back in the pool
		{&change{kind: changeCreate}, nodeapi.Desired{Revision: 8, Server: &nodeapi.Server{ID: "srv_b"}}},
	}
	for i, s := range steps {
		if s.answer != nil {
			c := *s.answer
			c.answered = at(10 * i)
			server := "srv_a"
			if i == len(steps)-1 {
				server = "srv_b"
			}
			p.answered(server, c)
		}
		n.see(s.desired, at(10*i+3))
	}
	r := p.result()
	for _, k := range changeNames {
		want := 1
		if k == "create" || k == "rule_add" {
			want = 2
		}
		if d := r.ByKind[k]; d.N != want || d.Max != 3000 {
			t.Errorf("%s: %+v, want %d samples of 3 ms", k, d, want)
		}
	}
	if r.Unseen != 0 || r.Unmatched != 0 || r.BeforeAnswer != 0 {
		t.Fatalf("result %+v", r)
	}
}

func TestFleetNodesFitsOpenFileLimit(t *testing.T) {
	for _, c := range []struct {
		asked  int
		noFile uint64
		want   int
	}{
		{10000, 20000, 10000},
		{20000, 20000, 20000 - fdReserve - 32 - 320},
		{10000, 0, 10000}, // unknown limit
		{10000, 100, 1},
	} {
		if got := FleetNodes(c.asked, c.noFile, 32, 320); got != c.want {
			t.Errorf("FleetNodes(%d, %d) = %d, want %d", c.asked, c.noFile, got, c.want)
		}
	}
}
