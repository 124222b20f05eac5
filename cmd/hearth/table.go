package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/hearthd/hearth/client"
)

// The table renderers: one row per item under a header for lists, and
// "Field: value" lines for one item. They take the time to measure ages
// from, so that their output is fixed for a fixed input (TestTables).

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)}
	t.row(header...)
	return t
}

func (t *table) row(cells ...string) {
	for i, c := range cells {
		if c == "" {
			cells[i] = "-"
		}
	}
	fmt.Fprintln(t.tw, strings.Join(cells, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// age is how long ago t was, in its largest unit: 42s, 5m, 3h, 12d.
func age(t, now time.Time) string {
	d := now.Sub(t)
	switch {
	case d < time.Minute:
		return strconv.Itoa(max(0, int(d.Seconds()))) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}

// when is a time and how long ago it was.
func when(t, now time.Time) string {
	return t.UTC().Format(time.RFC3339) + " (" + age(t, now) + " ago)"
}

func orDash(s *string) string {
	if s == nil || *s == "" {
		return "-"
	}
	return *s
}

func renderServers(w io.Writer, servers []client.Server, now time.Time) error {
	t := newTable(w, "ID", "NAME", "STATUS", "STACK", "MODEL", "CHIP", "RAM", "STORAGE", "IP", "AGE")
	for _, s := range servers {
		t.row(s.ID, s.Name, string(s.Status), string(s.Stack), s.Model, s.Chip, strconv.Itoa(s.RAM)+" GB",
			strconv.Itoa(s.Storage)+" GB", orDash(s.IP), age(s.CreatedAt, now))
	}
	return t.flush()
}

// newFieldWriter aligns "Field: value" lines.
func newFieldWriter(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 1, ' ', 0) }

func renderServer(w io.Writer, s client.Server, now time.Time) error {
	t := &table{tw: newFieldWriter(w)}
	field := func(k, v string) { t.row(k+":", v) }
	field("ID", s.ID)
	field("Name", s.Name)
	field("Status", string(s.Status))
	field("Stack", string(s.Stack))
	if s.Stack == client.StackDeployment {
		field("Model", s.Model)
		field("Deployment URL", s.DeploymentURL)
	}
	field("Hardware", fmt.Sprintf("%s, %d GB RAM, %d GB storage", s.Chip, s.RAM, s.Storage))
	field("Billing", s.Billing)
	field("IP", orDash(s.IP))
	field("SSH keys", strings.Join(s.SSHKeyIDs, ", "))
	field("Created", when(s.CreatedAt, now))
	field("Updated", when(s.UpdatedAt, now))
	e := s.Enforcement
	reported := "no report yet"
	if e.ReportedAt != nil {
		reported = "reported " + age(*e.ReportedAt, now) + " ago"
	}
	field("Enforcement", fmt.Sprintf("revision %d, %s", e.DesiredRevision, reported))
	field("  firewall", concern(e.Firewall.Status, e.Firewall.AppliedRevision, e.Firewall.Error))
	field("  ssh keys", concern(e.SSHKeys.Status, e.SSHKeys.AppliedRevision, e.SSHKeys.Error))
	field("  api keys", concern(e.APIKeys.Status, e.APIKeys.AppliedRevision, e.APIKeys.Error))
	rt := concern(e.Runtime.Status, e.Runtime.AppliedRevision, e.Runtime.Error)
	if e.Runtime.Model != nil {
		rt += ", serving " + *e.Runtime.Model
	}
	switch {
	case e.ReportedAt == nil:
	case e.Runtime.Health != "":
		rt += ", " + e.Runtime.Health
	case !e.Runtime.Healthy: // a control plane that does not say more
		rt += ", unhealthy"
	}
	if p := e.Runtime.Progress; p != nil {
		rt += ", " + p.Status
		if p.Total > 0 {
			rt += fmt.Sprintf(" %d%% of %d MB", p.Completed*100/p.Total, p.Total>>20)
		}
	}
	field("  runtime", rt)
	if r := e.Runtime.LastRestart; r != nil {
		field("  last restart", when(r.At, now)+": "+r.Reason)
	}
	return t.flush()
}

func concern(status string, rev *int64, errMsg *string) string {
	s := status
	if rev != nil {
		s += fmt.Sprintf(" (revision %d)", *rev)
	}
	if errMsg != nil {
		s += ": " + *errMsg
	}
	return s
}

func renderSSHKeys(w io.Writer, keys []client.SSHKey, now time.Time) error {
	t := newTable(w, "ID", "NAME", "TYPE", "FINGERPRINT", "AGE")
	for _, k := range keys {
		t.row(k.ID, k.Name, k.Type, k.Fingerprint, age(k.CreatedAt, now))
	}
	return t.flush()
}

func renderRules(w io.Writer, rules []client.FirewallRule, now time.Time) error {
	t := newTable(w, "ID", "DIRECTION", "PROTOCOL", "PORTS", "ADDRESS", "ACTION", "DESCRIPTION", "AGE")
	for _, r := range rules {
		addr := r.Source
		if r.Direction == client.Outbound {
			addr = r.Destination
		}
		ports, where := orDash(r.PortRange), orDash(addr)
		if ports == "-" && r.Protocol != client.ICMP {
			ports = "all"
		}
		if where == "-" {
			where = "any"
		}
		t.row(r.ID, string(r.Direction), string(r.Protocol), ports, where, string(r.Action), r.Description, age(r.CreatedAt, now))
	}
	return t.flush()
}

func renderAPIKeys(w io.Writer, keys []client.APIKey, now time.Time) error {
	t := newTable(w, "ID", "NAME", "HINT", "EXPIRES", "LIMITS", "REQUESTS", "TOKENS", "LAST USED", "AGE")
	for _, k := range keys {
		expires := "never"
		if k.ExpiresAt != nil {
			expires = k.ExpiresAt.UTC().Format(time.RFC3339)
			if !k.ExpiresAt.After(now) {
				expires += " (expired)"
			}
		}
		used := "never"
		if k.LastUsedAt != nil {
			used = age(*k.LastUsedAt, now) + " ago"
		}
		t.row(k.ID, k.Name, k.Hint, expires, limits(k.RequestsPerMinute, k.TokensPerMinute),
			strconv.FormatInt(k.Requests, 10), strconv.FormatInt(k.PromptTokens+k.CompletionTokens, 10), used, age(k.CreatedAt, now))
	}
	return t.flush()
}

func limits(rpm, tpm int) string {
	if rpm == 0 && tpm == 0 {
		return "none"
	}
	var parts []string
	if rpm > 0 {
		parts = append(parts, strconv.Itoa(rpm)+" req/min")
	}
	if tpm > 0 {
		parts = append(parts, strconv.Itoa(tpm)+" tok/min")
	}
	return strings.Join(parts, ", ")
}

// renderCreatedAPIKey shows a new key with its secret, the only time the
// API shows it.
func renderCreatedAPIKey(w io.Writer, k client.CreatedAPIKey) error {
	_, err := fmt.Fprintf(w, "API key %s (%s) created for server %s.\n\n  %s\n\nStore it now: it is shown only this once. Use it as\n  Authorization: Bearer <key>\n",
		k.ID, k.Name, k.ServerID, *k.Key)
	return err
}
