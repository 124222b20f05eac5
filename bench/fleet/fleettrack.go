package fleet

import (
	"sync"
	"time"

	"github.com/hearthd/hearth/bench"
)

// changeKind is a kind of management API change whose propagation to the
// node the fleet benchmark measures.
type changeKind int

const (
	changeCreate     changeKind = iota // POST /v1/servers: the node gets the server
	changeRuleAdd                      // POST …/firewall-rules: the node gets the rule
	changeRuleDelete                   // DELETE …/firewall-rules/{id}: the rule leaves the node
	changeDelete                       // DELETE /v1/servers/{id}: the node is told to wipe
	numChangeKinds
)

var changeNames = [numChangeKinds]string{"create", "rule_add", "rule_delete", "delete"}

func (k changeKind) String() string { return changeNames[k] }

// change is one answered change of a server, waiting for its node.
type change struct {
	kind     changeKind
	rule     string // the rule ID for rule changes
	answered time.Time
}

// sighting is what a node saw change in its desired state: the server
// appearing, a rule appearing or disappearing, the wipe.
type sighting struct {
	kind changeKind
	rule string
}

type sightingKey struct {
	server string
	sighting
}

// propagation pairs answered changes with their sighting on the node and
// records answer → sighting, per kind.
//
// The API answers carry no revision for rule changes and deletes, so a change
// is recognised by its content in the node's desired state. A long-poll
// answers with the newest state, so a node may never see an intermediate
// one (a rule added and deleted before the node polled again). Changes of one
// server come from one management client, one at a time, so their answer
// order is their revision order: when the node sees change k of a server, it
// has the revision of every earlier change of that server too, and those
// are resolved at the same moment. The last change of every server is
// visible (a create, a rule added, or the wipe, which the node must see to
// confirm it).
type propagation struct {
	mu sync.Mutex
	// pending holds each server's answered changes not yet seen, in
	// answer order.
	pending map[string][]change
	// early holds sightings that came before the change's API answer (the
	// control plane wakes the node on commit, before it writes the answer).
	early   map[sightingKey]time.Time
	samples [numChangeKinds][]time.Duration
	// beforeAnswer counts changes the node had before the client had the
	// answer (recorded as 0).
	beforeAnswer [numChangeKinds]int
}

func newPropagation() *propagation {
	return &propagation{pending: map[string][]change{}, early: map[sightingKey]time.Time{}}
}

// answered records that the API answered change c of server at c.answered.
func (p *propagation) answered(server string, c change) {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := append(p.pending[server], c)
	key := sightingKey{server, sighting{c.kind, c.rule}}
	if seen, ok := p.early[key]; ok {
		delete(p.early, key)
		p.beforeAnswer[c.kind]++
		p.resolve(server, list, len(list)-1, seen)
		return
	}
	p.pending[server] = list
}

// saw records what a node saw of server in one desired state at time at.
func (p *propagation) saw(server string, seen []sighting, at time.Time) {
	if len(seen) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.pending[server]
	last := -1
	for _, s := range seen {
		found := false
		for i, c := range list {
			if c.kind == s.kind && c.rule == s.rule {
				last, found = max(last, i), true
				break
			}
		}
		if !found {
			p.early[sightingKey{server, s}] = at
		}
	}
	if last >= 0 {
		p.resolve(server, list, last, at)
	}
}

// resolve records list[:upto+1] as seen at at and keeps the rest pending.
func (p *propagation) resolve(server string, list []change, upto int, at time.Time) {
	for _, c := range list[:upto+1] {
		p.samples[c.kind] = append(p.samples[c.kind], max(at.Sub(c.answered), 0))
	}
	if rest := list[upto+1:]; len(rest) > 0 {
		p.pending[server] = rest
	} else {
		delete(p.pending, server)
	}
}

// counts reports the changes still waiting for their node and the
// sightings that match no answered change.
func (p *propagation) counts() (pending, unmatched int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.pending {
		pending += len(l)
	}
	return pending, len(p.early)
}

// PropagationResult is the time from a change's API answer until the node
// assigned to the server has a desired state that includes it.
type PropagationResult struct {
	All    bench.Dist            `json:"all"`
	ByKind map[string]bench.Dist `json:"by_kind"`
	// BeforeAnswer counts changes the node had before the API answer
	// reached the client (recorded as 0).
	BeforeAnswer int `json:"before_answer"`
	// Unseen counts answered changes no node had seen when the run gave up
	// waiting; Unmatched counts changes nodes saw that no 2xx answer
	// announced (a request that failed on the client side but committed).
	Unseen    int `json:"unseen"`
	Unmatched int `json:"unmatched"`
}

// result summarises everything recorded so far.
func (p *propagation) result() PropagationResult {
	p.mu.Lock()
	var all []time.Duration
	r := PropagationResult{ByKind: map[string]bench.Dist{}, Unmatched: len(p.early)}
	for k := range numChangeKinds {
		all = append(all, p.samples[k]...)
		r.ByKind[k.String()] = bench.Summarize(append([]time.Duration(nil), p.samples[k]...))
		r.BeforeAnswer += p.beforeAnswer[k]
	}
	for _, l := range p.pending {
		r.Unseen += len(l)
	}
	p.mu.Unlock()
	r.All = bench.Summarize(all)
	return r
}
