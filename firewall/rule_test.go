package firewall

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

func in(proto, ports, src string) Rule {
	return Rule{Direction: "inbound", Protocol: proto, PortRange: ports, Source: src, Action: "allow"}
}

func TestCanonicalizeAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   Rule
		want Rule
	}{
		{"single port", in("tcp", "22", ""), in("tcp", "22", "")},
		{"range", in("tcp", "8000-9000", ""), in("tcp", "8000-9000", "")},
		{"degenerate range", in("udp", "22-22", ""), in("udp", "22", "")},
		{"leading zeros", in("tcp", "0022-00080", ""), in("tcp", "22-80", "")},
		{"full range is all ports", in("tcp", "1-65535", ""), in("tcp", "", "")},
		{"absent port is all ports", in("udp", "", ""), in("udp", "", "")},
		{"max port", in("tcp", "65535", ""), in("tcp", "65535", "")},
		{"icmp", in("icmp", "", "10.0.0.0/8"), in("icmp", "", "10.0.0.0/8")},
		{"bare v4", in("tcp", "22", "1.2.3.4"), in("tcp", "22", "1.2.3.4/32")},
		{"v4 host bits", in("tcp", "22", "10.1.2.3/8"), in("tcp", "22", "10.0.0.0/8")},
		{"v4 /0", in("tcp", "22", "1.2.3.4/0"), in("tcp", "22", "0.0.0.0/0")},
		{"bare v6", in("tcp", "22", "2001:DB8:0:0:0:0:0:1"), in("tcp", "22", "2001:db8::1/128")},
		{"v6 host bits", in("tcp", "22", "2001:db8::ffff/32"), in("tcp", "22", "2001:db8::/32")},
		{"v6 rfc5952", in("tcp", "22", "2001:0db8:0000:0000:0001:0000:0000:0000/128"), in("tcp", "22", "2001:db8:0:0:1::/128")},
		{
			"outbound destination",
			Rule{ID: "fw_01J-x", Direction: "outbound", Protocol: "udp", PortRange: "53", Destination: "9.9.9.9", Action: "deny", Description: "no DNS ✓ über"},
			Rule{ID: "fw_01J-x", Direction: "outbound", Protocol: "udp", PortRange: "53", Destination: "9.9.9.9/32", Action: "deny", Description: "no DNS ✓ über"},
		},
		{"description 255 runes", withDesc(in("tcp", "22", ""), strings.Repeat("ü", 255)), withDesc(in("tcp", "22", ""), strings.Repeat("ü", 255))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize(tt.in)
			if err != nil {
				t.Fatalf("Canonicalize(%+v): %v", tt.in, err)
			}
			if got != tt.want {
				t.Fatalf("Canonicalize(%+v) = %+v, want %+v", tt.in, got, tt.want)
			}
			again, err := Canonicalize(got)
			if err != nil || again != got {
				t.Fatalf("not idempotent: %+v -> %+v, %v", got, again, err)
			}
		})
	}
}

func withDesc(r Rule, d string) Rule { r.Description = d; return r }

func TestCanonicalizeRejects(t *testing.T) {
	out := func(proto, ports, dst string) Rule {
		return Rule{Direction: "outbound", Protocol: proto, PortRange: ports, Destination: dst, Action: "deny"}
	}
	tests := []struct {
		name  string
		in    Rule
		field string
	}{
		{"no direction", Rule{Protocol: "tcp", Action: "allow"}, "direction"},
		{"bad direction", Rule{Direction: "in", Protocol: "tcp", Action: "allow"}, "direction"},
		{"uppercase direction", Rule{Direction: "INBOUND", Protocol: "tcp", Action: "allow"}, "direction"},
		{"no protocol", Rule{Direction: "inbound", Action: "allow"}, "protocol"},
		{"bad protocol", Rule{Direction: "inbound", Protocol: "sctp", Action: "allow"}, "protocol"},
		{"protocol injection", Rule{Direction: "inbound", Protocol: "tcp accept; flush ruleset", Action: "allow"}, "protocol"},
		{"no action", Rule{Direction: "inbound", Protocol: "tcp"}, "action"},
		{"bad action", Rule{Direction: "inbound", Protocol: "tcp", Action: "accept"}, "action"},
		{"port 0", in("tcp", "0", ""), "port_range"},
		{"port 65536", in("tcp", "65536", ""), "port_range"},
		{"huge port", in("tcp", "99999999999999999999", ""), "port_range"},
		{"reversed range", in("tcp", "9000-8000", ""), "port_range"},
		{"range to 0", in("tcp", "0-22", ""), "port_range"},
		{"open start", in("tcp", "-22", ""), "port_range"},
		{"open end", in("tcp", "22-", ""), "port_range"},
		{"double dash", in("tcp", "1--2", ""), "port_range"},
		{"three parts", in("tcp", "1-2-3", ""), "port_range"},
		{"plus sign", in("tcp", "+22", ""), "port_range"},
		{"minus sign", in("udp", "-1", ""), "port_range"},
		{"space", in("tcp", " 22", ""), "port_range"},
		{"inner space", in("tcp", "22 - 80", ""), "port_range"},
		{"newline", in("tcp", "22\n", ""), "port_range"},
		{"comma list", in("tcp", "22,80", ""), "port_range"},
		{"injection", in("tcp", "22; flush ruleset", ""), "port_range"},
		{"set injection", in("tcp", "22 } accept; flush ruleset; {", ""), "port_range"},
		{"arabic-indic digits", in("tcp", "٢٢", ""), "port_range"},
		{"fullwidth digits", in("tcp", "２２", ""), "port_range"},
		{"hex", in("tcp", "0x16", ""), "port_range"},
		{"named service", in("tcp", "ssh", ""), "port_range"},
		{"very long port", in("tcp", strings.Repeat("1", 100000), ""), "port_range"},
		{"icmp with port", in("icmp", "8", ""), "port_range"},
		{"bad cidr", in("tcp", "22", "1.2.3.4/33"), "source"},
		{"bad v6 cidr", in("tcp", "22", "::/129"), "source"},
		{"set close injection", in("tcp", "22", "10.0.0.0/8 }"), "source"},
		{"source injection", in("tcp", "22", "10.0.0.0/8; flush ruleset"), "source"},
		{"source newline", in("tcp", "22", "10.0.0.1\n"), "source"},
		{"source spaces", in("tcp", "22", " 10.0.0.1"), "source"},
		{"hostname", in("tcp", "22", "example.com"), "source"},
		{"v4 leading zeros", in("tcp", "22", "010.0.0.1"), "source"},
		{"short v4", in("tcp", "22", "10.1"), "source"},
		{"v4-mapped v6", in("tcp", "22", "::ffff:1.2.3.4"), "source"},
		{"v4-mapped v6 cidr", in("tcp", "22", "::ffff:1.2.3.0/120"), "source"},
		{"zone", in("tcp", "22", "fe80::1%eth0"), "source"},
		{"zone cidr", in("tcp", "22", "fe80::1%eth0/64"), "source"},
		{"empty prefix len", in("tcp", "22", "10.0.0.0/"), "source"},
		{"very long source", in("tcp", "22", strings.Repeat("1", 100000)), "source"},
		{"inbound with destination", Rule{Direction: "inbound", Protocol: "tcp", Action: "allow", Destination: "1.2.3.4"}, "destination"},
		{"outbound with source", Rule{Direction: "outbound", Protocol: "tcp", Action: "allow", Source: "1.2.3.4"}, "source"},
		{"bad destination", out("tcp", "22", "1.2.3.4/33"), "destination"},
		{"destination injection", out("udp", "53", "1.1.1.1 } ; flush ruleset"), "destination"},
		{"description newline", withDesc(in("tcp", "22", ""), "a\nb"), "description"},
		{"description CR", withDesc(in("tcp", "22", ""), "a\rb"), "description"},
		{"description tab", withDesc(in("tcp", "22", ""), "a\tb"), "description"},
		{"description NUL", withDesc(in("tcp", "22", ""), "a\x00b"), "description"},
		{"description DEL", withDesc(in("tcp", "22", ""), "a\x7fb"), "description"},
		{"description C1", withDesc(in("tcp", "22", ""), "a\u0085b"), "description"},
		{"description line separator", withDesc(in("tcp", "22", ""), "a\u2028b"), "description"},
		{"description invalid utf8", withDesc(in("tcp", "22", ""), "a\xffb"), "description"},
		{"description 256 runes", withDesc(in("tcp", "22", ""), strings.Repeat("ü", 256)), "description"},
		{"description very long", withDesc(in("tcp", "22", ""), strings.Repeat("a", 100000)), "description"},
		{"id with space", Rule{ID: "fw 1", Direction: "inbound", Protocol: "tcp", Action: "allow"}, "id"},
		{"id injection", Rule{ID: "fw_1\"; flush ruleset", Direction: "inbound", Protocol: "tcp", Action: "allow"}, "id"},
		{"id too long", Rule{ID: strings.Repeat("a", 65), Direction: "inbound", Protocol: "tcp", Action: "allow"}, "id"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize(tt.in)
			if err == nil {
				t.Fatalf("Canonicalize accepted %+v as %+v", tt.in, got)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("error %v (%T) is not a *FieldError", err, err)
			}
			if fe.Field != tt.field {
				t.Fatalf("error names field %q, want %q (%v)", fe.Field, tt.field, err)
			}
			if !strings.HasPrefix(err.Error(), tt.field+": ") || fe.Message == "" {
				t.Fatalf("error text %q does not lead with the field and a message", err.Error())
			}
			if got != (Rule{}) {
				t.Fatalf("rejected rule returned non-zero value %+v", got)
			}
		})
	}
}

func TestCanonicalizeAllNamesIndex(t *testing.T) {
	_, err := CanonicalizeAll([]Rule{in("tcp", "22", ""), in("tcp", "0", "")})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "port_range" {
		t.Fatalf("err = %v, want wrapped port_range FieldError", err)
	}
	if !strings.Contains(err.Error(), "rule 1") {
		t.Fatalf("err %q does not name the rule index", err)
	}
}

// safeValue reports whether s contains only characters that can appear in a
// canonical enum, port range or prefix.
func safeValue(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '.' || c == ':' || c == '/' || c == '-' ||
			c >= 'a' && c <= 'z') {
			return false
		}
	}
	return true
}

func FuzzCanonicalize(f *testing.F) {
	seeds := []Rule{
		in("tcp", "22", "10.0.0.0/8"),
		in("udp", "8000-9000", "2001:db8::1"),
		in("icmp", "", ""),
		{Direction: "outbound", Protocol: "tcp", PortRange: "22-22", Destination: "::ffff:1.2.3.4", Action: "deny", Description: "x\n"},
		in("tcp", "22; flush ruleset", "10.0.0.0/8 }"),
		in("tcp", "٢٢", "1.2.3.4/33"),
		{ID: "fw_1", Direction: "inbound", Protocol: "tcp", PortRange: "0022-65535", Source: "1.2.3.4/0", Action: "allow", Description: "ok"},
	}
	for _, s := range seeds {
		f.Add(s.ID, s.Direction, s.Protocol, s.PortRange, s.Source, s.Destination, s.Action, s.Description)
	}
	f.Fuzz(func(t *testing.T, id, dir, proto, ports, src, dst, action, desc string) {
		r := Rule{id, dir, proto, ports, src, dst, action, desc}
		c, err := Canonicalize(r)
		if err != nil {
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("error %v is not a *FieldError naming a field", err)
			}
			return
		}
		c2, err := Canonicalize(c)
		if err != nil {
			t.Fatalf("canonical %+v rejected: %v", c, err)
		}
		if c2 != c {
			t.Fatalf("not idempotent: %+v -> %+v", c, c2)
		}
		for _, v := range []string{c.Direction, c.Protocol, c.PortRange, c.Source, c.Destination, c.Action} {
			if !safeValue(v) {
				t.Fatalf("unsafe value %q in %+v", v, c)
			}
		}
		for i := 0; i < len(c.ID); i++ {
			if b := c.ID[i]; !(b == '_' || b == '-' || b >= '0' && b <= '9' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z') {
				t.Fatalf("unsafe id %q", c.ID)
			}
		}
		if !utf8.ValidString(c.Description) || utf8.RuneCountInString(c.Description) > MaxDescriptionLen ||
			strings.IndexFunc(c.Description, unicode.IsControl) >= 0 {
			t.Fatalf("unsafe description %q", c.Description)
		}
		// Whatever was accepted renders to nft text built only from safe characters.
		for _, nr := range render([]Rule{c}, nil) {
			if strings.ContainsAny(nr.rule, ";\n\r\"'#") {
				t.Fatalf("unsafe nft rule %q", nr.rule)
			}
		}
	})
}
