package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/hearthd/hearth/client"
)

// What happened and how much: usage over time, actions, the audit log.

func (a *app) usageCommand() *cobra.Command {
	var (
		server, granularity, groupBy, since, until string
	)
	cmd := &cobra.Command{
		Use:   "usage [--server SERVER] [--granularity day|hour] [--since 7d] [--group-by server|api_key]",
		Short: "Show the API keys' use over time: requests, tokens, errors, time to first token",
		Long: `Shows the project's usage over a window (or one server's, with --server): a row per
server or API key with --group-by, else one for all, each with its totals over the window and,
on a terminal, a sparkline of its requests per hour or day. TTFT P95 is the highest hourly or
daily 95th percentile of the time to first token in the window. -o json prints the API's answer,
bucket by bucket.`,
		Example: `  hearth usage                                    # the last 7 days, by day
  hearth usage --server web --granularity hour --since 24h --group-by api_key
  hearth usage --since 2026-11-01T00:00:00Z --until 2026-12-01T00:00:00Z -o json`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			p := client.UsageParams{Granularity: client.UsageGranularity(granularity), GroupBy: client.UsageGroupBy(groupBy)}
			if since == "" {
				since = "7d"
				if p.Granularity == client.Hourly {
					since = "24h"
				}
			}
			var err error
			if p.Start, p.End, err = window(since, until, a.now()); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.client()
			if err != nil {
				return err
			}
			var u client.Usage
			if server != "" {
				id, err := serverID(ctx, c, server)
				if err != nil {
					return err
				}
				u, err = c.GetServerUsage(ctx, id, p)
				if err != nil {
					return err
				}
			} else if u, err = c.GetUsage(ctx, p); err != nil {
				return err
			}
			if a.json() {
				return a.printJSON(u)
			}
			return renderUsage(a.out, u, a.outTTY)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&server, "server", "", "one server's usage (ID or name); default the whole project")
	f.StringVar(&granularity, "granularity", string(client.Daily), "day or hour (hours are kept 14 days)")
	f.StringVar(&groupBy, "group-by", "", "server or api_key (with --server: api_key)")
	f.StringVar(&since, "since", "", "the window's start: a duration ago (7d, 36h) or an RFC 3339 time (default 7d; 24h by the hour)")
	f.StringVar(&until, "until", "", "the window's end, likewise (default now)")
	must(cmd.RegisterFlagCompletionFunc("server", a.completeServerFlag))
	must(cmd.RegisterFlagCompletionFunc("granularity", enumCompletion(client.UsageGranularities())))
	must(cmd.RegisterFlagCompletionFunc("group-by", enumCompletion(client.UsageGroupings())))
	return cmd
}

// window reads --since and --until ("" is a zero time: no bound).
func window(since, until string, now time.Time) (start, end time.Time, err error) {
	for _, f := range []struct {
		flag, v string
		t       *time.Time
	}{{"--since", since, &start}, {"--until", until, &end}} {
		if f.v == "" {
			continue
		}
		if *f.t, err = sinceTime(f.v, now); err != nil {
			return start, end, usagef(f.flag + ": " + err.Error())
		}
	}
	return start, end, nil
}

// sinceTime reads a time: RFC 3339, or a duration before now in Go's
// units or whole days ("7d").
func sinceTime(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.AddDate(0, 0, -n), nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q is neither a duration such as 7d or 36h nor an RFC 3339 time", s)
	}
	return now.Add(-d), nil
}

// usageRow is one series of a usage answer summed over its window.
type usageRow struct {
	server, key                                         string
	requests, prompt, completion, reasoning, errorCount int64
	p95                                                 *float64
	series                                              []int64 // requests per bucket
}

// renderUsage shows a usage answer as one row per group (one in all when
// ungrouped), with a sparkline of its requests on a terminal.
func renderUsage(w io.Writer, u client.Usage, spark bool) error {
	var rows []*usageRow
	byGroup := map[[2]string]*usageRow{}
	for i, b := range u.Data {
		for _, r := range b.Results {
			g := [2]string{r.ServerID, r.APIKeyID}
			row := byGroup[g]
			if row == nil {
				row = &usageRow{server: r.ServerID, key: r.APIKeyID, series: make([]int64, len(u.Data))}
				byGroup[g] = row
				rows = append(rows, row)
			}
			row.requests += r.Requests
			row.prompt += r.PromptTokens
			row.completion += r.CompletionTokens
			row.reasoning += r.ReasoningTokens
			row.errorCount += r.Errors
			row.series[i] = r.Requests
			if r.TTFTP95 != nil && (row.p95 == nil || *r.TTFTP95 > *row.p95) {
				v := *r.TTFTP95
				row.p95 = &v
			}
		}
	}
	header := []string{"SERVER", "API KEY", "REQUESTS", "PROMPT", "COMPLETION", "REASONING", "ERRORS", "TTFT P95"}
	if u.GroupBy == nil {
		header = header[2:]
	} else if *u.GroupBy == client.ByServer {
		header = slices.Delete(header, 1, 2)
	}
	if spark {
		header = append(header, "REQUESTS PER "+strings.ToUpper(string(u.Granularity)))
	}
	unit := "days"
	if u.Granularity == client.Hourly {
		unit = "hours"
	}
	if _, err := fmt.Fprintf(w, "%s to %s, %d %s\n", u.Start.UTC().Format(time.RFC3339), u.End.UTC().Format(time.RFC3339),
		len(u.Data), unit); err != nil {
		return err
	}
	t := newTable(w, header...)
	if len(rows) == 0 { // grouped, and nothing used
		return t.flush()
	}
	for _, r := range rows {
		p95 := "-"
		if r.p95 != nil {
			p95 = strconv.FormatFloat(*r.p95, 'f', -1, 64) + " ms"
		}
		cells := []string{r.server, r.key}
		if u.GroupBy == nil {
			cells = nil
		} else if *u.GroupBy == client.ByServer {
			cells = cells[:1]
		}
		cells = append(cells, itoa(r.requests), itoa(r.prompt), itoa(r.completion), itoa(r.reasoning), itoa(r.errorCount), p95)
		if spark {
			cells = append(cells, sparkline(r.series))
		}
		t.row(cells...)
	}
	return t.flush()
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// sparkline draws values as a line of block characters, from the lowest
// (empty: a space-like ▁) to the highest value of the line.
func sparkline(values []int64) string {
	const blocks = "▁▂▃▄▅▆▇█"
	levels := []rune(blocks)
	top := int64(0)
	for _, v := range values {
		top = max(top, v)
	}
	var b strings.Builder
	for _, v := range values {
		i := 0
		if top > 0 && v > 0 {
			i = 1 + int((v*int64(len(levels)-2)+top-1)/top) // any use shows above the floor
			i = min(i, len(levels)-1)
		}
		b.WriteRune(levels[i])
	}
	return b.String()
}

func (a *app) actionCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "action", Aliases: []string{"actions"}, Short: "Follow the changes to your servers: each is an action"}
	cmd.AddCommand(a.actionList(), a.actionGet())
	return cmd
}

func (a *app) actionList() *cobra.Command {
	var (
		l              listFlags
		server, status string
	)
	cmd := &cobra.Command{
		Use:   "list [--server SERVER] [--status running|success|error]",
		Short: "List actions, newest first: the project's, or one server's",
		Args:  cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c, err := a.client()
			if err != nil {
				return err
			}
			page := func(p client.ListParams) (client.List[client.ServerAction], error) {
				return c.ListActions(ctx, client.ListActionsParams{ListParams: p, Status: client.ActionStatus(status)})
			}
			all := func(p client.ListParams) iterSeq[client.ServerAction] {
				return c.AllActions(ctx, client.ListActionsParams{ListParams: p, Status: client.ActionStatus(status)})
			}
			if server != "" {
				if status != "" {
					return usagef("--status lists the project's actions: give it without --server")
				}
				id, err := serverID(ctx, c, server)
				if err != nil {
					return err
				}
				page = func(p client.ListParams) (client.List[client.ServerAction], error) {
					return c.ListServerActions(ctx, id, p)
				}
				all = func(p client.ListParams) iterSeq[client.ServerAction] { return c.AllServerActions(ctx, id, p) }
			}
			items, more, err := collect(l, page, all)
			if err != nil {
				return err
			}
			return showList(a, "actions", items, more, renderActions)
		}),
	}
	cmd.Flags().StringVar(&server, "server", "", "only this server's actions (ID or name)")
	cmd.Flags().StringVar(&status, "status", "", "only actions in this status: running, success or error")
	must(cmd.RegisterFlagCompletionFunc("server", a.completeServerFlag))
	must(cmd.RegisterFlagCompletionFunc("status", enumCompletion(client.ActionStatuses())))
	l.add(cmd)
	return cmd
}

func (a *app) actionGet() *cobra.Command {
	return &cobra.Command{
		Use:   "get ACTION",
		Short: "Show an action (act_…)",
		Args:  cobra.ExactArgs(1),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			act, err := c.GetAction(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return show(a, act, renderAction)
		}),
	}
}

func renderActions(w io.Writer, actions []client.ServerAction, now time.Time) error {
	t := newTable(w, "ID", "COMMAND", "STATUS", "PROGRESS", "RESOURCES", "STARTED", "TOOK", "ERROR")
	for _, act := range actions {
		t.row(act.ID, string(act.Command), string(act.Status), strconv.Itoa(act.Progress)+"%", resources(act.Resources),
			age(act.StartedAt, now)+" ago", took(act), actionError(act.Error))
	}
	return t.flush()
}

func renderAction(w io.Writer, act client.ServerAction, now time.Time) error {
	t := &table{tw: newFieldWriter(w)}
	field := func(k, v string) { t.row(k+":", v) }
	field("ID", act.ID)
	field("Command", string(act.Command))
	field("Status", string(act.Status))
	field("Progress", strconv.Itoa(act.Progress)+"%")
	field("Resources", resources(act.Resources))
	field("Started", when(act.StartedAt, now))
	if act.FinishedAt != nil {
		field("Finished", when(*act.FinishedAt, now)+", took "+took(act))
	}
	if act.Error != nil {
		field("Error", actionError(act.Error))
	}
	return t.flush()
}

func resources(rs []client.ActionResource) string {
	var parts []string
	for _, r := range rs {
		parts = append(parts, r.ID)
	}
	return strings.Join(parts, ",")
}

func took(act client.ServerAction) string {
	if act.FinishedAt == nil {
		return ""
	}
	return act.FinishedAt.Sub(act.StartedAt).Round(time.Millisecond).String()
}

func actionError(e *client.ActionError) string {
	if e == nil {
		return ""
	}
	return e.Code + ": " + e.Message
}

func (a *app) auditLogCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "audit-log", Short: "Read the project's audit log: every change asked for, by whom, from where"}
	cmd.AddCommand(a.auditLogList())
	return cmd
}

func (a *app) auditLogList() *cobra.Command {
	var (
		l                               listFlags
		since, until, token, resourceID string
	)
	cmd := &cobra.Command{
		Use:   "list [--since 24h] [--until T] [--token tok_…] [--resource ID]",
		Short: "List audit log entries, newest first (read-only tokens may)",
		Example: `  hearth audit-log list --since 7d --resource srv_…
  hearth audit-log list --token tok_… --all -o json`,
		Args: cobra.NoArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			p := client.ListAuditLogParams{TokenID: token, ResourceID: resourceID}
			var err error
			if p.Start, p.End, err = window(since, until, a.now()); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.client()
			if err != nil {
				return err
			}
			items, more, err := collect(l,
				func(lp client.ListParams) (client.List[client.AuditLogEntry], error) {
					p.ListParams = lp
					return c.ListAuditLog(ctx, p)
				},
				func(lp client.ListParams) iterSeq[client.AuditLogEntry] {
					p.ListParams = lp
					return c.AllAuditLog(ctx, p)
				})
			if err != nil {
				return err
			}
			return showList(a, "entries", items, more, renderAuditLog)
		}),
	}
	f := cmd.Flags()
	f.StringVar(&since, "since", "", "entries from this time on: a duration ago (24h, 7d) or an RFC 3339 time")
	f.StringVar(&until, "until", "", "entries before this time, likewise")
	f.StringVar(&token, "token", "", "only this API token's requests (tok_…)")
	f.StringVar(&resourceID, "resource", "", "only requests that named or made this ID (srv_…, dk_…, fw_…, sk_…, act_…)")
	l.add(cmd)
	return cmd
}

func renderAuditLog(w io.Writer, entries []client.AuditLogEntry, now time.Time) error {
	t := newTable(w, "TIME", "TOKEN", "SOURCE", "REQUEST", "STATUS", "RESOURCES")
	for _, e := range entries {
		t.row(e.Time.UTC().Format(time.RFC3339)+" ("+age(e.Time, now)+" ago)", e.TokenName+" ("+e.TokenID+")", e.SourceIP,
			e.Method+" "+e.Path, strconv.Itoa(e.Status), strings.Join(e.ResourceIDs, ","))
	}
	return t.flush()
}
