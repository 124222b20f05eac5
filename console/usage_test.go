package console_test

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
	"github.com/hearthd/hearth/internal/testutil"
)

// A server's page charts its usage over time from what its node reported
// (hourly by default, daily on the switch), with the same numbers in a
// table, and lists its changes: a create pulling its model with its
// progress, then done, and the key's creation.
func TestUsageAndActions(t *testing.T) {
	ctl := controltest.Start(t, &bins)
	node := ctl.StartNode(controltest.NodeOptions{Hold: true})
	id := createServer(t, ctl, ctl.Token, "metered")
	c := api(t, ctl, ctl.Token)
	bg := context.Background()
	b := newBrowser(t, ctl.URL)
	b.signIn(ctl.Token)

	// Pulling: the create runs, halfway; nothing used yet.
	node.Pull(50, 100)
	p := b.get("/console/servers/" + id)
	create := actionRow(t, p.body, "create")
	if p.status != http.StatusOK || !strings.Contains(create, `data-status="running"`) || !strings.Contains(create, "50%") ||
		!strings.Contains(create, "not yet") {
		t.Fatalf("the create while pulling: %d %q", p.status, create)
	}
	if !strings.Contains(p.body, `id="usage-empty"`) || strings.Contains(p.body, "<svg") {
		t.Fatalf("usage before any request:\n%s", section(p.body, "usage-over-time"))
	}

	node.Release()
	testutil.WaitFor(t, 10*time.Second, "server running", func() bool {
		s, err := c.GetServer(bg, id)
		return err == nil && s.Status == client.StatusRunning
	})
	key, err := c.CreateAPIKey(bg, id, client.CreateAPIKeyRequest{Name: "app"})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the key's action done", func() bool {
		a, err := c.GetAction(bg, key.Action.ID)
		return err == nil && a.Status == client.ActionStatusSuccess
	})
	node.Use(key.ID, 7, 5, 40*time.Millisecond)

	p = b.get("/console/servers/" + id)
	if create := actionRow(t, p.body, "create"); !strings.Contains(create, `data-status="success"`) || !strings.Contains(create, "100%") ||
		strings.Contains(create, "not yet") {
		t.Fatalf("the create once done: %q", create)
	}
	if k := actionRow(t, p.body, "api_key_create"); !strings.Contains(k, "Create API key") || !strings.Contains(k, `data-status="success"`) {
		t.Fatalf("the key's creation: %q", k)
	}
	if i, j := strings.Index(p.body, `data-command="api_key_create"`), strings.Index(p.body, `data-command="create"`); i > j {
		t.Fatal("the actions are not newest first")
	}

	usage := section(p.body, "usage-over-time")
	if !strings.Contains(usage, `aria-current="true">Last 24 hours`) || !strings.Contains(usage, "7 requests") {
		t.Fatalf("hourly usage:\n%s", usage)
	}
	// The one busy hour is the tallest bar, the others are not drawn.
	bars := regexp.MustCompile(`<rect class="bar-requests"[^>]*height="([^"]+)"><title>[^<]*: (\d+) requests</title>`).FindAllStringSubmatch(usage, -1)
	if len(bars) != 1 || bars[0][1] != "100" || bars[0][2] != "7" {
		t.Fatalf("request bars %q in:\n%s", bars, usage)
	}
	if !strings.Contains(usage, `class="bar-prompt"`) || !strings.Contains(usage, `class="bar-completion"`) ||
		!strings.Contains(usage, `role="img"`) {
		t.Fatalf("token bars:\n%s", usage)
	}
	rows := regexp.MustCompile(`<tr><th scope="row">[^<]+</th><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td><td>(\d+)</td></tr>`).FindAllStringSubmatch(usage, -1)
	busy := 0
	for _, r := range rows {
		if r[1] != "0" {
			busy++
			if r[1] != "7" || r[2] != "5" || r[3] != "5" || r[4] != "0" {
				t.Fatalf("the busy hour's row: %q", r)
			}
		}
	}
	if len(rows) != 24 || busy != 1 {
		t.Fatalf("%d rows, %d busy, in:\n%s", len(rows), busy, usage)
	}
	// The keys' own counters (which the fake node does not report) stay
	// beside the chart.
	if !strings.Contains(usage, `<dl class="facts" id="usage">`) {
		t.Fatalf("cumulative counters:\n%s", section(p.body, "usage-over-time"))
	}

	p = b.get("/console/servers/" + id + "?usage=day")
	usage = section(p.body, "usage-over-time")
	if p.status != http.StatusOK || !strings.Contains(usage, `aria-current="true">Last 30 days`) || !strings.Contains(usage, "Day (UTC)") ||
		!strings.Contains(usage, "Last 30 days: 7 requests") || strings.Count(usage, `<th scope="row">`) != 30 {
		t.Fatalf("daily usage %d:\n%s", p.status, usage)
	}
	// Anything else is the hourly window, not an error.
	if p = b.get("/console/servers/" + id + "?usage=minute"); p.status != http.StatusOK ||
		!strings.Contains(p.body, `aria-current="true">Last 24 hours`) {
		t.Fatalf("?usage=minute: %d", p.status)
	}
}

// section is the HTML of the section with that id.
func section(body, id string) string {
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	j := strings.Index(body[i:], "</section>")
	if j < 0 {
		return body[i:]
	}
	return body[i : i+j]
}

// actionRow is the row of the server's latest action of that command.
func actionRow(t *testing.T, body, command string) string {
	t.Helper()
	i := strings.Index(body, `data-command="`+command+`"`)
	if i < 0 {
		t.Fatalf("no %s action listed:\n%s", command, section(body, "server-actions"))
	}
	return body[i : i+strings.Index(body[i:], "</tr>")]
}

// Where the usage API refuses the window (hours kept for less than the
// hourly chart's day), the page says the API's reason and keeps the keys'
// counters; the daily window still charts.
func TestUsageRefused(t *testing.T) {
	ctl := controltest.Start(t, &bins, "--usage-hour-retention", "2h")
	ctl.StartNode(controltest.NodeOptions{})
	id := createServer(t, ctl, ctl.Token, "short")
	b := newBrowser(t, ctl.URL)
	b.signIn(ctl.Token)
	p := b.get("/console/servers/" + id)
	usage := section(p.body, "usage-over-time")
	if p.status != http.StatusOK || !strings.Contains(usage, `id="usage-error"`) || !strings.Contains(usage, "hourly usage is kept for") ||
		!strings.Contains(usage, `<dl class="facts" id="usage">`) || strings.Contains(usage, "<svg") {
		t.Fatalf("a refused window %d:\n%s", p.status, usage)
	}
	p = b.get("/console/servers/" + id + "?usage=day")
	if usage = section(p.body, "usage-over-time"); p.status != http.StatusOK || strings.Contains(usage, `id="usage-error"`) ||
		!strings.Contains(usage, `id="usage-empty"`) {
		t.Fatalf("the daily window %d:\n%s", p.status, usage)
	}
}
