package fleet

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hearthd/hearth/bench"
)

// FleetReport is one `hearth-bench fleet` run: a result per control plane
// variant.
type FleetReport struct {
	Started time.Time     `json:"started"`
	Machine bench.Machine `json:"machine"`
	Command string        `json:"command"`
	Results []FleetResult `json:"results"`
	Notes   []string      `json:"notes,omitempty"`
}

func ms(us float64) string {
	switch {
	case us >= 100000:
		return fmt.Sprintf("%.0f ms", us/1000)
	case us >= 1000:
		return fmt.Sprintf("%.1f ms", us/1000)
	default:
		return fmt.Sprintf("%.2f ms", us/1000)
	}
}

// Markdown renders the report: the summary table, then the details.
func (r *FleetReport) Markdown() string {
	var b strings.Builder
	bench.WriteRunHeader(&b, r.Started, r.Machine, r.Command)
	b.WriteString("| control plane | nodes | creates/s | create p50 / p99 | propagation p50 / p99 | reports/s: burst (p99) / churn / idle | idle CPU per node per minute | RSS peak / end | enrolments/s | errors | load avg start → end |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.Results {
		if res.Error != "" {
			msg, _, _ := strings.Cut(res.Error, "\n")
			if len(msg) > 160 {
				msg = msg[:160] + "…"
			}
			fmt.Fprintf(&b, "| %s | | %s | | | | | | | | |\n", res.Variant, strings.ReplaceAll(msg, "|", "/"))
			continue
		}
		c := res.Create["create"]
		p := res.Propagation.All
		rep := res.Reports
		nodes := fmt.Sprintf("%d", res.Nodes)
		if res.Nodes != res.NodesRequested {
			nodes += fmt.Sprintf(" of %d asked", res.NodesRequested)
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s / %s | %s / %s | %.0f (%s) / %.0f / %.0f | %.2f ms | %s / %s bench.MiB | %.0f | %d | %s → %s |\n",
			res.Variant, nodes, c.PerSecond, ms(c.Latency.P50), ms(c.Latency.P99), ms(p.P50), ms(p.P99),
			rep.BurstPerSecond, ms(rep.Burst.Latency.P99), rep.ChurnPerSecond, rep.IdlePerSecond,
			res.Idle.CPUmsPerNodeMinute, bench.MiB(res.RSSPeak), bench.MiB(res.RSSEnd), res.Enroll.PerSecond,
			res.errorCount(), res.LoadAvgStart, res.LoadAvgEnd)
	}
	b.WriteString("\n")
	r.details(&b)
	r.usage(&b)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}

// errorCount is every failed request of the run.
func (res *FleetResult) errorCount() int {
	n := res.Enroll.Errors + res.Reports.Burst.Errors + int(res.Fleet.PollErrors+res.Fleet.ReportErrors)
	for _, m := range []map[string]OpStats{res.Create, res.Churn} {
		for _, s := range m {
			n += s.Errors + s.CapacityUnavailable
		}
	}
	if res.Usage != nil {
		n += res.Usage.QueryErrors
	}
	return n + res.Propagation.Unseen
}

func (r *FleetReport) details(b *strings.Builder) {
	b.WriteString("| control plane | phase | request | ok | per s | p50 | p99 | max | errors |\n|---|---|---|---|---|---|---|---|---|\n")
	row := func(v, phase, op string, s OpStats) {
		fmt.Fprintf(b, "| %s | %s | %s | %d | %.0f | %s | %s | %s | %d |\n", v, phase, op, s.OK, s.PerSecond,
			ms(s.Latency.P50), ms(s.Latency.P99), ms(s.Latency.Max), s.Errors+s.CapacityUnavailable)
	}
	for _, res := range r.Results {
		if res.Error != "" {
			continue
		}
		row(res.Variant, "enrolment burst", "enroll", res.Enroll)
		for _, ph := range []struct {
			name string
			ops  map[string]OpStats
		}{{"create", res.Create}, {"churn", res.Churn}} {
			for _, op := range opNames {
				if s, ok := ph.ops[op]; ok {
					row(res.Variant, ph.name, op, s)
				}
			}
		}
		row(res.Variant, "report burst", "observed", res.Reports.Burst)
	}
	b.WriteString("\n| control plane | propagation of | n | p50 | p99 | max | node had it before the answer | never seen |\n|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.Results {
		if res.Error != "" {
			continue
		}
		for _, k := range changeNames {
			d := res.Propagation.ByKind[k]
			fmt.Fprintf(b, "| %s | %s | %d | %s | %s | %s | | |\n", res.Variant, k, d.N, ms(d.P50), ms(d.P99), ms(d.Max))
		}
		p := res.Propagation
		fmt.Fprintf(b, "| %s | all | %d | %s | %s | %s | %d | %d |\n", res.Variant, p.All.N, ms(p.All.P50), ms(p.All.P99), ms(p.All.Max),
			p.BeforeAnswer, p.Unseen)
	}
	b.WriteString("\n| control plane | phase | seconds | control plane CPU-s | PostgreSQL CPU-s | bench CPU-s | rest of the machine CPU-s | control plane RSS peak bench.MiB |\n|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.Results {
		phases := make([]string, 0, len(res.Phases))
		for name := range res.Phases {
			phases = append(phases, name)
		}
		slices.SortFunc(phases, func(a, b string) int { return phaseOrder(a) - phaseOrder(b) })
		for _, name := range phases {
			p := res.Phases[name]
			fmt.Fprintf(b, "| %s | %s | %.1f | %.2f | %.2f | %.2f | %.2f | %s |\n", res.Variant, name, p.Seconds, p.ControlCPUS, p.PgCPUS, p.BenchCPUS, p.OtherCPUS, bench.MiB(p.RSSPeak))
		}
	}
	b.WriteString("\n")
	for _, res := range r.Results {
		if res.Error != "" {
			continue
		}
		fmt.Fprintf(b, "- %s: %d nodes enrolled (%d asked, %d fit the open-file limit of %d), %d clients; settled in %.1f s; "+
			"idle %.0f s: %.0f polls/s, %.0f reports/s, control plane %.2f CPU-s; fleet: %d polls with a state, %d empty, %d reports, %d wipes, %d poll errors, %d report errors",
			res.Variant, res.Nodes, res.NodesRequested, res.NodesFit, res.OpenFileLimit, res.Clients, res.SettleS,
			res.Idle.Seconds, res.Idle.PollsPerSecond, res.Idle.ReportsPerSecond, res.Idle.ControlCPUS,
			res.Fleet.Polls, res.Fleet.EmptyPolls, res.Fleet.Reports, res.Fleet.Wipes, res.Fleet.PollErrors, res.Fleet.ReportErrors)
		if len(res.Fleet.ErrorSamples) > 0 {
			fmt.Fprintf(b, " (first: %s)", res.Fleet.ErrorSamples[0])
		}
		b.WriteString(".\n")
	}
}

func phaseOrder(name string) int {
	order := []string{"enroll", "create", "churn", "idle", "report_burst"}
	for round := range usageRounds {
		for _, ph := range usagePhases {
			order = append(order, fmt.Sprintf("%s %d", ph.name, round+1))
		}
	}
	return slices.Index(order, name)
}

// Write stores the report as fleet-<time>.json|md and fleet-latest.* in
// dir.
func (r *FleetReport) Write(dir string) (string, error) {
	return bench.WriteResults(dir, "fleet-", r.Started, r, r.Markdown())
}

// usage renders the usage phases of the variants that ran them.
func (r *FleetReport) usage(b *strings.Builder) {
	head := false
	for _, res := range r.Results {
		u := res.Usage
		if u == nil {
			continue
		}
		if !head {
			b.WriteString("\n| control plane | nodes with a key / keys | phase (both rounds) | reports/s | buckets/s | CPU-s per s (control plane + PostgreSQL) | CPU ms per report | per report over the baseline |\n|---|---|---|---|---|---|---|---|\n")
			head = true
		}
		for _, name := range []string{"usage_baseline", "usage", "usage_every_report"} {
			p := u.Phases[name]
			over := ""
			switch name {
			case "usage":
				over = fmt.Sprintf("%+.1f %%", 100*u.Added)
			case "usage_every_report":
				over = fmt.Sprintf("%+.1f %%", 100*u.AddedEveryReport)
			}
			fmt.Fprintf(b, "| %s | %d / %d | %s | %.0f | %.0f | %.3f | %.3f | %s |\n", res.Variant, u.Nodes, u.Keys, name,
				p.ReportsPerSecond, p.BucketsPerSecond, p.CPUPerSecond, p.CPUmsPerReport, over)
		}
	}
	if !head {
		return
	}
	b.WriteString("\n| control plane | usage query (by day) | keys / days | n | p50 | p99 | max | errors | past days exact |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, res := range r.Results {
		u := res.Usage
		if u == nil {
			continue
		}
		for _, g := range []string{"ungrouped", "server", "api_key"} {
			d := u.Query[g]
			fmt.Fprintf(b, "| %s | %s | %d / %d | %d | %s | %s | %s | %d | %v |\n", res.Variant, g, u.QueryKeys, u.QueryDays, d.N,
				ms(d.P50), ms(d.P99), ms(d.Max), u.QueryErrors, u.QueryChecked)
		}
	}
}
