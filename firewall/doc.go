// Package firewall owns the node's host firewall: the rule model and its
// validation (Rule, Canonicalize), and enforcement with nftables (NFT), plus a
// Fake for other packages' tests and a Noop for hosts where the firewall is
// not managed.
//
// # Ownership
//
// hearthd owns exactly one nftables table, "inet hearth". It never reads,
// changes or flushes any other table, and never flushes the ruleset. Every
// Apply replaces the table's whole contents in one nft transaction
// ("add table; delete table; add table; …"), so the kernel switches from the
// old rules to the new ones atomically. If validation or the transaction
// fails, the previous rules stay in force and Apply returns the error.
//
// # Semantics
//
// The table has two base chains, "input" (hook input) and "output" (hook
// output), both type filter at priority filter (0). Inbound rules go into
// input and match on the packet's source address; outbound rules go into
// output and match on its destination address. In each chain, in order:
//
//  1. Always accepted, whatever the rules say: loopback traffic; packets of
//     established or related connections (so replies, and ICMP errors such as
//     "packet too big", flow, and tightening the rules never cuts an existing
//     connection); IPv6 neighbour and router discovery, without which IPv6
//     stops working; and (output only) new TCP connections to the control
//     plane endpoints from Config.ControlPlane, so no rule set can cut the node
//     off from the control plane.
//  2. deny rules: matching packets are dropped.
//  3. allow rules: matching packets are accepted.
//  4. If the direction has at least one allow rule, everything else in that
//     direction is dropped; otherwise it is accepted. An empty rule set
//     therefore accepts everything.
//
// An absent source/destination means any address of either family; an absent
// port range on a tcp/udp rule means every port; protocol icmp covers ICMP
// for IPv4 and ICMPv6 for IPv6. Denied packets are dropped silently.
//
// Every chain ends in an explicit verdict, so the chain policy is never
// consulted. Note that netfilter runs every table's base chain on a hook: an
// accept in another table does not override a drop in ours, and a drop in
// another table still drops what we accept.
//
// User-supplied text never reaches nft: rules are rendered only from parsed
// values (enums, integers, netip prefixes), and descriptions and IDs are not
// rendered at all.
//
// # Drift repair
//
// NFT.Run checks every Config.DriftInterval (default 10 s) that the table
// still holds exactly what was last applied — same chains, same rules (by
// handle and comment), no extra objects — and re-applies the last good rule
// set if the table was deleted, flushed or edited. NFT.Stats reports applies,
// failures, repairs and the last success time for the metrics package.
package firewall
