package firewall

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/hearthd/hearth/internal/textcheck"
)

// Enumerated values of Rule fields.
const (
	DirectionInbound  = "inbound"
	DirectionOutbound = "outbound"

	ProtocolTCP  = "tcp"
	ProtocolUDP  = "udp"
	ProtocolICMP = "icmp"

	ActionAllow = "allow"
	ActionDeny  = "deny"
)

// Limits on Rule fields.
const (
	// MaxDescriptionLen is the maximum description length in characters (runes).
	MaxDescriptionLen = 255
	// MaxIDLen is the maximum length of a rule ID.
	MaxIDLen = 64
)

// Rule is one firewall rule as the management API speaks it.
//
// Field semantics:
//   - PortRange: "N" or "A-B" with 1 ≤ A ≤ B ≤ 65535. For tcp/udp an absent
//     port range means all ports (canonical form of "1-65535" is absent too).
//     It must be absent for icmp.
//   - Source (inbound only) / Destination (outbound only): an IPv4 or IPv6
//     address or CIDR. Absent means any address of either family. Host bits
//     are masked off, a bare address becomes /32 or /128, IPv6 is written per
//     RFC 5952. IPv4-mapped IPv6 (::ffff:a.b.c.d) is rejected: nftables
//     matches IPv4 packets only against IPv4 addresses, so such a rule would
//     silently never match.
//   - Protocol icmp means ICMP for IPv4 and ICMPv6 for IPv6.
//   - ID, when present, is 1–64 characters of [A-Za-z0-9_-]. It never reaches
//     nftables, but keeping it plain keeps logs and errors unambiguous.
//   - Description: at most 255 characters, valid UTF-8, no control or invisible formatting characters (internal/textcheck).
//     It never reaches nftables.
type Rule struct {
	ID          string `json:"id,omitempty"`
	Direction   string `json:"direction"`             // inbound | outbound
	Protocol    string `json:"protocol"`              // tcp | udp | icmp
	PortRange   string `json:"port_range,omitempty"`  // "22" or "8000-9000"; absent for icmp
	Source      string `json:"source,omitempty"`      // inbound only: IPv4/IPv6 CIDR or address
	Destination string `json:"destination,omitempty"` // outbound only
	Action      string `json:"action"`                // allow | deny
	Description string `json:"description,omitempty"` // ≤ 255 chars
}

// FieldError names the JSON field that is wrong.
type FieldError struct{ Field, Message string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Firewall applies a complete rule set, replacing whatever was applied before.
type Firewall interface {
	Apply(ctx context.Context, rules []Rule) error
}

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// Canonicalize validates r and returns it in canonical form, or a *FieldError.
// Canonicalize is idempotent. Everything a canonical rule contributes to
// nftables (enums, ports, prefixes) is re-rendered from parsed values, so no
// user text can reach the nft command line.
func Canonicalize(r Rule) (Rule, error) {
	if r.ID != "" {
		if err := checkID(r.ID); err != nil {
			return Rule{}, err
		}
	}
	switch r.Direction {
	case DirectionInbound, DirectionOutbound:
	case "":
		return Rule{}, fieldErr("direction", "is required (inbound or outbound)")
	default:
		return Rule{}, fieldErr("direction", "must be inbound or outbound")
	}
	switch r.Protocol {
	case ProtocolTCP, ProtocolUDP, ProtocolICMP:
	case "":
		return Rule{}, fieldErr("protocol", "is required (tcp, udp or icmp)")
	default:
		return Rule{}, fieldErr("protocol", "must be tcp, udp or icmp")
	}
	switch r.Action {
	case ActionAllow, ActionDeny:
	case "":
		return Rule{}, fieldErr("action", "is required (allow or deny)")
	default:
		return Rule{}, fieldErr("action", "must be allow or deny")
	}

	if r.Protocol == ProtocolICMP {
		if r.PortRange != "" {
			return Rule{}, fieldErr("port_range", "must be absent for icmp")
		}
	} else if r.PortRange != "" {
		lo, hi, err := ParsePortRange(r.PortRange)
		if err != nil {
			return Rule{}, err
		}
		r.PortRange = formatPortRange(lo, hi)
	}

	var err error
	if r.Direction == DirectionInbound {
		if r.Destination != "" {
			return Rule{}, fieldErr("destination", "is only allowed on outbound rules; use source for inbound")
		}
		if r.Source, err = canonicalAddr("source", r.Source); err != nil {
			return Rule{}, err
		}
	} else {
		if r.Source != "" {
			return Rule{}, fieldErr("source", "is only allowed on inbound rules; use destination for outbound")
		}
		if r.Destination, err = canonicalAddr("destination", r.Destination); err != nil {
			return Rule{}, err
		}
	}

	if err := checkDescription(r.Description); err != nil {
		return Rule{}, err
	}
	return r, nil
}

func checkID(id string) error {
	if len(id) > MaxIDLen {
		return fieldErr("id", "must be at most %d characters", MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return fieldErr("id", "may contain only letters, digits, '_' and '-'")
		}
	}
	return nil
}

// ParsePortRange parses "N" or "A-B" (1 ≤ A ≤ B ≤ 65535, ASCII digits only).
// Errors are *FieldError for port_range.
func ParsePortRange(s string) (lo, hi uint16, err error) {
	a, b, isRange := strings.Cut(s, "-")
	if lo, err = parsePort(a); err != nil {
		return 0, 0, err
	}
	if !isRange {
		return lo, lo, nil
	}
	if hi, err = parsePort(b); err != nil {
		return 0, 0, err
	}
	if lo > hi {
		return 0, 0, fieldErr("port_range", "start %d is greater than end %d", lo, hi)
	}
	return lo, hi, nil
}

func parsePort(s string) (uint16, error) {
	// Checked by hand rather than relying on strconv alone: strconv accepts
	// signs, and the digits must be ASCII only.
	if s == "" {
		return 0, fieldErr("port_range", `must be "N" or "A-B" with ports 1-65535`)
	}
	if len(s) > 5 {
		return 0, fieldErr("port_range", "port must be between 1 and 65535")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fieldErr("port_range", `must be "N" or "A-B" with ports 1-65535 (digits only)`)
		}
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, fieldErr("port_range", "port must be between 1 and 65535")
	}
	return uint16(n), nil
}

func formatPortRange(lo, hi uint16) string {
	switch {
	case lo == 1 && hi == 65535:
		return "" // all ports: the canonical form is absence
	case lo == hi:
		return strconv.Itoa(int(lo))
	default:
		return strconv.Itoa(int(lo)) + "-" + strconv.Itoa(int(hi))
	}
}

// ParsePrefix parses an address or CIDR as Canonicalize accepts it and
// returns the masked prefix. Errors are *FieldError naming field.
func ParsePrefix(field, s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, fieldErr(field, "is not a valid address or CIDR")
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fieldErr(field, "is not a valid address or CIDR")
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fieldErr(field, "must not carry an IPv6 zone")
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fieldErr(field, "IPv4-mapped IPv6 addresses are not supported; write the IPv4 address")
	}
	return p.Masked(), nil
}

func canonicalAddr(field, s string) (string, error) {
	if s == "" {
		return "", nil // any address
	}
	p, err := ParsePrefix(field, s)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

func checkDescription(d string) error {
	if !utf8.ValidString(d) {
		return fieldErr("description", "must be valid UTF-8")
	}
	n := utf8.RuneCountInString(d)
	// Line and paragraph separators count as newlines; bidi overrides and
	// other format characters could make a rule read as another.
	if r, hidden := textcheck.Hidden(d); hidden {
		return fieldErr("description", "must not contain control characters, line breaks or invisible formatting characters (found %U)", r)
	}
	if n > MaxDescriptionLen {
		return fieldErr("description", "must be at most %d characters", MaxDescriptionLen)
	}
	return nil
}
