package firewall

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"go4.org/netipx"
	"sigs.k8s.io/knftables"
)

// Chain names in the hearth table.
const (
	chainInput  = "input"
	chainOutput = "output"
)

// Rule comments identify each generated rule for drift detection. They are
// fixed strings: user text never goes into a comment.
const (
	commentLoopback     = "hearth: loopback"
	commentEstablished  = "hearth: established/related"
	commentND           = "hearth: ipv6 neighbour discovery"
	commentControlPlane = "hearth: control plane"
	commentDeny         = "hearth: deny"
	commentAllow        = "hearth: allow"
	commentDefaultDrop  = "hearth: default drop"
	commentDefaultAcc   = "hearth: default accept"
)

// nftRule is one generated nftables rule.
type nftRule struct {
	chain, rule, comment string
}

// CanonicalizeAll canonicalizes every rule. The error names the rule's index
// and wraps its *FieldError (use errors.As).
func CanonicalizeAll(rules []Rule) ([]Rule, error) {
	out := make([]Rule, len(rules))
	for i, r := range rules {
		c, err := Canonicalize(r)
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", i, err)
		}
		out[i] = c
	}
	return out, nil
}

// buildTransaction fills tx with the complete replacement of the table's
// contents. rules must be canonical.
func buildTransaction(tx *knftables.Transaction, rules []Rule, controlPlane []netip.AddrPort) []nftRule {
	// add+delete+add: deleting a table that does not exist is an error, and
	// the three commands run as one atomic kernel transaction.
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{Comment: knftables.PtrTo("rules managed by hearthd")})
	for _, c := range []struct {
		name string
		hook knftables.BaseChainHook
	}{{chainInput, knftables.InputHook}, {chainOutput, knftables.OutputHook}} {
		tx.Add(&knftables.Chain{
			Name:     c.name,
			Type:     knftables.PtrTo(knftables.FilterType),
			Hook:     knftables.PtrTo(c.hook),
			Priority: knftables.PtrTo(knftables.FilterPriority),
			Policy:   knftables.PtrTo(knftables.AcceptPolicy),
		})
	}
	out := render(rules, controlPlane)
	for _, r := range out {
		tx.Add(&knftables.Rule{Chain: r.chain, Rule: r.rule, Comment: knftables.PtrTo(r.comment)})
	}
	return out
}

// render produces the rules of both chains, in order. rules must be canonical.
func render(rules []Rule, controlPlane []netip.AddrPort) []nftRule {
	var out []nftRule
	out = append(out, renderChain(DirectionInbound, rules, nil)...)
	out = append(out, renderChain(DirectionOutbound, rules, controlPlane)...)
	return out
}

func renderChain(direction string, rules []Rule, controlPlane []netip.AddrPort) []nftRule {
	chain, iface, addrKey := chainInput, "iif", "saddr"
	if direction == DirectionOutbound {
		chain, iface, addrKey = chainOutput, "oif", "daddr"
	}
	var out []nftRule
	add := func(rule, comment string) { out = append(out, nftRule{chain, rule, comment}) }

	add("meta "+iface+" lo accept", commentLoopback)
	add("ct state established,related accept", commentEstablished)
	add("icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit, nd-router-advert } accept", commentND)
	for _, ap := range controlPlane {
		a := ap.Addr().Unmap().WithZone("")
		fam := "ip"
		if a.Is6() {
			fam = "ip6"
		}
		add(fmt.Sprintf("%s daddr %s tcp dport %d accept", fam, a.String(), ap.Port()), commentControlPlane)
	}

	hasAllow := false
	for _, action := range []string{ActionDeny, ActionAllow} {
		verdict, comment := "drop", commentDeny
		if action == ActionAllow {
			verdict, comment = "accept", commentAllow
		}
		for _, proto := range []string{ProtocolTCP, ProtocolUDP, ProtocolICMP} {
			var sel []Rule
			for _, r := range rules {
				if r.Direction == direction && r.Action == action && r.Protocol == proto {
					sel = append(sel, r)
				}
			}
			if len(sel) == 0 {
				continue
			}
			if action == ActionAllow {
				hasAllow = true
			}
			for _, m := range matches(sel, proto, addrKey) {
				add(m+" "+verdict, comment)
			}
		}
	}
	if hasAllow {
		add("drop", commentDefaultDrop)
	} else {
		add("accept", commentDefaultAcc)
	}
	return out
}

// portRange is an inclusive range of ports.
type portRange struct{ lo, hi uint16 }

// matches turns rules of one direction, action and protocol into as few nft
// match expressions as possible without changing their meaning: addresses
// with identical port sets share one rule with an address set, and port
// ranges of the same address are merged into one port set.
func matches(rules []Rule, proto, addrKey string) []string {
	// Port set per prefix; nil means any port (always nil for icmp).
	ports := map[netip.Prefix][]portRange{}
	anyPort := map[netip.Prefix]bool{}
	for _, r := range rules {
		addr := r.Source
		if addrKey == "daddr" {
			addr = r.Destination
		}
		var prefixes []netip.Prefix
		if addr == "" {
			prefixes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
		} else {
			// Canonical rules always parse.
			p, _ := ParsePrefix("", addr)
			prefixes = []netip.Prefix{p}
		}
		for _, p := range prefixes {
			if proto == ProtocolICMP || r.PortRange == "" {
				anyPort[p] = true
				continue
			}
			lo, hi, _ := ParsePortRange(r.PortRange)
			ports[p] = append(ports[p], portRange{lo, hi})
		}
	}

	// Group prefixes by their (merged) port set.
	type group struct{ v4, v6 netipx.IPSetBuilder }
	groups := map[string]*group{}
	addTo := func(key string, p netip.Prefix) {
		g := groups[key]
		if g == nil {
			g = &group{}
			groups[key] = g
		}
		if p.Addr().Is4() {
			g.v4.AddPrefix(p)
		} else {
			g.v6.AddPrefix(p)
		}
	}
	var anyB netipx.IPSetBuilder
	for p := range anyPort {
		addTo("", p)
		anyB.AddPrefix(p)
	}
	anySet, _ := anyB.IPSet()
	for p, pr := range ports {
		if anySet.ContainsPrefix(p) {
			continue // an any-port match of a covering prefix subsumes it
		}
		addTo(formatPortSet(mergePorts(pr)), p)
	}

	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	var out []string
	for _, k := range keys {
		g := groups[k]
		v4, _ := g.v4.IPSet()
		v6, _ := g.v6.IPSet()
		p4, p6 := v4.Prefixes(), v6.Prefixes()
		full4 := len(p4) == 1 && p4[0].Bits() == 0
		full6 := len(p6) == 1 && p6[0].Bits() == 0
		if full4 && full6 {
			out = append(out, l4match(proto, k, ""))
			continue
		}
		if len(p4) > 0 {
			fam := "meta nfproto ipv4"
			if !full4 {
				fam = "ip " + addrKey + " " + prefixSet(p4)
			}
			out = append(out, fam+" "+l4match(proto, k, "ip"))
		}
		if len(p6) > 0 {
			fam := "meta nfproto ipv6"
			if !full6 {
				fam = "ip6 " + addrKey + " " + prefixSet(p6)
			}
			out = append(out, fam+" "+l4match(proto, k, "ip6"))
		}
	}
	return out
}

// l4match renders the protocol/port part; family is "ip", "ip6" or "" (both).
func l4match(proto, portSet, family string) string {
	if proto == ProtocolICMP {
		switch family {
		case "ip":
			return "meta l4proto icmp"
		case "ip6":
			return "meta l4proto ipv6-icmp"
		default:
			return "meta l4proto { icmp, ipv6-icmp }"
		}
	}
	if portSet == "" {
		return "meta l4proto " + proto
	}
	return proto + " dport " + portSet
}

func mergePorts(pr []portRange) []portRange {
	slices.SortFunc(pr, func(a, b portRange) int { return int(a.lo) - int(b.lo) })
	var out []portRange
	for _, r := range pr {
		if n := len(out); n > 0 && int(r.lo) <= int(out[n-1].hi)+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func formatPortSet(pr []portRange) string {
	if len(pr) == 1 && pr[0].lo == 1 && pr[0].hi == 65535 {
		return "" // all ports
	}
	parts := make([]string, len(pr))
	for i, r := range pr {
		parts[i] = strconv.Itoa(int(r.lo))
		if r.hi != r.lo {
			parts[i] += "-" + strconv.Itoa(int(r.hi))
		}
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

func prefixSet(ps []netip.Prefix) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = p.String()
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}
