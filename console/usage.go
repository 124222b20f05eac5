package console

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/hearthd/hearth/client"
)

// Usage over time on a server's page: bars drawn by the server as inline
// SVG (no script, no third-party chart library: a page of rectangles does
// not need one), with the same numbers in a table for whoever cannot see
// the bars.

// chartHeight is the height of a chart's viewBox; slotWidth the width of
// one bucket's slot, in which the bar leaves a gap each side.
const (
	chartHeight = 100
	slotWidth   = 10
)

// usageWindow is one choice of the usage switch.
type usageWindow struct {
	Gran  client.UsageGranularity
	Label string // "Last 24 hours"
	Unit  string // "hour"
	n     int    // buckets
}

var usageWindows = []usageWindow{
	{client.Hourly, "Last 24 hours", "hour", 24},
	{client.Daily, "Last 30 days", "day", 30},
}

// windowOf is the window a page asks for (?usage=hour|day), hourly by
// default and for anything else.
func windowOf(q url.Values) usageWindow {
	for _, w := range usageWindows {
		if q.Get("usage") == string(w.Gran) {
			return w
		}
	}
	return usageWindows[0]
}

// usageChart is the usage section of a server's page.
type usageChart struct {
	Window  usageWindow
	Windows []usageWindow
	Bars    []usageBar
	// Width is the viewBox's width.
	Width, Height int
	// Totals over the window, and the tallest bars.
	Requests, PromptTokens, CompletionTokens, Errors int64
	PeakRequests, PeakTokens                         int64
	// Err says why usage over time could not be read; the page then
	// shows only the keys' cumulative counters.
	Err string
	err error
}

// usageBar is one bucket: its numbers, and its bars' geometry in the
// viewBox (Y from the top).
type usageBar struct {
	Label                                            string
	Requests, PromptTokens, CompletionTokens, Errors int64
	X, W                                             float64
	ReqY, ReqH, PromptY, PromptH, ComplY, ComplH     float64
}

// Empty says whether nothing was used in the window.
func (u usageChart) Empty() bool { return u.Requests == 0 && u.Errors == 0 }

// usageOf reads a server's usage over the window and lays out its bars.
func usageOf(cx context.Context, api *client.Client, id string, w usageWindow, now time.Time) usageChart {
	u := usageChart{Window: w, Windows: usageWindows, Height: chartHeight}
	end := now.UTC()
	var start time.Time
	if w.Gran == client.Hourly {
		start = end.Truncate(time.Hour).Add(-time.Duration(w.n-1) * time.Hour)
	} else {
		y, m, d := end.Date()
		start = time.Date(y, m, d-(w.n-1), 0, 0, 0, 0, time.UTC)
	}
	got, err := api.GetServerUsage(cx, id, client.UsageParams{Start: start, End: end, Granularity: w.Gran})
	if err != nil {
		// The API's message says why (an hourly window past the hours
		// kept, say); anything else is only logged.
		u.Err, u.err = "the management API did not answer", err
		if ae, ok := errors.AsType[client.APIError](err); ok {
			u.Err = ae.Message
		}
		return u
	}
	for _, b := range got.Data {
		bar := usageBar{Label: bucketLabel(b.Start, w.Gran)}
		for _, r := range b.Results {
			bar.Requests += r.Requests
			bar.PromptTokens += r.PromptTokens
			bar.CompletionTokens += r.CompletionTokens
			bar.Errors += r.Errors
		}
		u.Requests += bar.Requests
		u.PromptTokens += bar.PromptTokens
		u.CompletionTokens += bar.CompletionTokens
		u.Errors += bar.Errors
		u.PeakRequests = max(u.PeakRequests, bar.Requests)
		u.PeakTokens = max(u.PeakTokens, bar.PromptTokens+bar.CompletionTokens)
		u.Bars = append(u.Bars, bar)
	}
	u.Width = max(len(u.Bars), 1) * slotWidth
	for i := range u.Bars {
		b := &u.Bars[i]
		b.X, b.W = float64(i*slotWidth)+1, slotWidth-2
		b.ReqH = height(b.Requests, u.PeakRequests)
		b.ReqY = chartHeight - b.ReqH
		b.PromptH = height(b.PromptTokens, u.PeakTokens)
		b.PromptY = chartHeight - b.PromptH
		// Completion tokens stack on the prompt's: the whole bar is the
		// bucket's tokens.
		whole := height(b.PromptTokens+b.CompletionTokens, u.PeakTokens)
		b.ComplH = max(whole-b.PromptH, 0)
		b.ComplY = chartHeight - whole
	}
	return u
}

// height is v's bar against the peak; anything used shows at least a
// sliver.
func height(v, peak int64) float64 {
	if v <= 0 || peak <= 0 {
		return 0
	}
	return max(float64(v)*chartHeight/float64(peak), 1)
}

func bucketLabel(t time.Time, g client.UsageGranularity) string {
	if g == client.Hourly {
		return t.UTC().Format("Jan 2 15:00")
	}
	return t.UTC().Format("Jan 2")
}

// actionsShown is how many of a server's latest actions its page lists.
const actionsShown = 20

// commandNames are the actions as the page names them.
var commandNames = map[client.ActionCommand]string{
	client.CommandCreate:             "Create",
	client.CommandUpdateModel:        "Change model",
	client.CommandRename:             "Rename",
	client.CommandDelete:             "Delete",
	client.CommandAPIKeyCreate:       "Create API key",
	client.CommandAPIKeyDelete:       "Revoke API key",
	client.CommandFirewallRuleAdd:    "Add firewall rule",
	client.CommandFirewallRuleDelete: "Delete firewall rule",
	client.CommandSSHKeysUpdate:      "Change SSH keys",
}

func commandName(c client.ActionCommand) string {
	if n, ok := commandNames[c]; ok {
		return n
	}
	return string(c)
}

func actionError(e *client.ActionError) string {
	if e == nil {
		return ""
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}
