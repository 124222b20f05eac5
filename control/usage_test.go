package control_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
)

type usageView struct {
	Start       string  `json:"start"`
	End         string  `json:"end"`
	Granularity string  `json:"granularity"`
	GroupBy     *string `json:"group_by"`
	Data        []struct {
		Start   string `json:"start"`
		End     string `json:"end"`
		Results []usageResultView
	} `json:"data"`
}

type usageResultView struct {
	ServerID         string   `json:"server_id"`
	APIKeyID         string   `json:"api_key_id"`
	Requests         uint64   `json:"requests"`
	PromptTokens     uint64   `json:"prompt_tokens"`
	CompletionTokens uint64   `json:"completion_tokens"`
	ReasoningTokens  uint64   `json:"reasoning_tokens"`
	Errors           uint64   `json:"errors"`
	TTFTP50          *float64 `json:"ttft_p50_ms"`
	TTFTP95          *float64 `json:"ttft_p95_ms"`
}

func (e *env) usage(t *testing.T, path string, q url.Values) usageView {
	t.Helper()
	var u usageView
	e.req("GET", path+"?"+q.Encode(), nil).must(t, 200).decode(t, &u)
	return u
}

// bucket is a usage bucket of key at minute m with n requests of 10 prompt
// and 20 completion tokens (5 of them reasoning), one error, and n times
// to first token in the 100–150 ms bin.
func bucket(seq uint64, key string, m time.Time, n uint64) nodeapi.UsageBucket {
	ttft := make([]uint64, nodeapi.TTFTBin(120*time.Millisecond)+1)
	ttft[len(ttft)-1] = n
	return nodeapi.UsageBucket{Seq: seq, KeyID: key, Minute: m, Requests: n, PromptTokens: 10 * n,
		CompletionTokens: 20 * n, ReasoningTokens: 5 * n, Errors: 1, TTFT: ttft}
}

// TestUsageOverTime: a node's minute buckets add up to hour and day
// buckets of the server, the key and the project; a report sent again
// counts once; empty periods are zeros; another project's server is a 404.
func TestUsageOverTime(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("metered")).must(t, 201))
	k1 := idOf(t, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "a"}).must(t, 201))
	k2 := idOf(t, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "b"}).must(t, 201))
	d := converge(t, n, "192.0.2.90")

	now := time.Now().UTC()
	hour := now.Truncate(time.Hour)
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	prevHour := hour.Add(-time.Hour)
	o := applied(d, "192.0.2.90")
	o.UsageBuckets = []nodeapi.UsageBucket{
		bucket(1, k1, prevHour.Add(5*time.Minute), 2),
		bucket(2, k1, hour, 3),
		bucket(3, k2, hour, 4),
	}
	n.report(t, o)
	n.report(t, o) // the answer lost: sent again, counted once
	// A report whose first buckets were applied already counts the rest.
	o.UsageBuckets = append(o.UsageBuckets, bucket(4, k2, hour.Add(time.Minute), 1))
	n.report(t, o)

	q := url.Values{"start": {hour.Add(-2 * time.Hour).Format(time.RFC3339)}, "end": {hour.Add(time.Hour).Format(time.RFC3339)},
		"granularity": {"hour"}}
	u := e.usage(t, "/v1/usage", q)
	if len(u.Data) != 3 || u.Granularity != "hour" || u.GroupBy != nil {
		t.Fatalf("usage %+v", u)
	}
	wantReq := []uint64{0, 2, 8}
	for i, b := range u.Data {
		if len(b.Results) != 1 || b.Results[0].Requests != wantReq[i] {
			t.Fatalf("hour %d: %+v, want %d requests", i, b.Results, wantReq[i])
		}
	}
	last := u.Data[2].Results[0]
	if last.PromptTokens != 80 || last.CompletionTokens != 160 || last.ReasoningTokens != 40 || last.Errors != 3 ||
		last.TTFTP50 == nil || *last.TTFTP50 < 100 || *last.TTFTP50 > 150 || last.TTFTP95 == nil {
		t.Fatalf("hour totals %+v", last)
	}
	if u.Data[0].Results[0].TTFTP50 != nil {
		t.Fatalf("an empty hour has a TTFT: %+v", u.Data[0].Results[0])
	}

	// By key, and by day.
	q.Set("group_by", "api_key")
	u = e.usage(t, "/v1/usage", q)
	got := map[string]uint64{}
	for _, r := range u.Data[2].Results {
		if r.ServerID != sid {
			t.Fatalf("result of another server: %+v", r)
		}
		got[r.APIKeyID] = r.Requests
	}
	if got[k1] != 3 || got[k2] != 5 || len(u.Data[0].Results) != 2 {
		t.Fatalf("by key %+v", u.Data)
	}
	dq := url.Values{"start": {day.Format(time.RFC3339)}, "end": {now.Format(time.RFC3339)}}
	if !prevHour.Before(day) {
		su := e.usage(t, "/v1/servers/"+sid+"/usage", dq)
		if len(su.Data) != 1 || su.Data[0].Results[0].Requests != 10 || su.Data[0].Start != day.Format(time.RFC3339) {
			t.Fatalf("server by day %+v", su)
		}
	}
	dq.Set("group_by", "server")
	su := e.usage(t, "/v1/usage", dq)
	if len(su.Data[0].Results) != 1 || su.Data[0].Results[0].ServerID != sid {
		t.Fatalf("by server %+v", su)
	}

	// Another project sees none of it, and not the server.
	_, other := e.project("other", false)
	e.reqAs(other, "GET", "/v1/servers/"+sid+"/usage?start="+url.QueryEscape(day.Format(time.RFC3339)), nil).wantErr(t, 404, "not_found", "id")
	var ou usageView
	e.reqAs(other, "GET", "/v1/usage?"+q.Encode(), nil).must(t, 200).decode(t, &ou)
	for _, b := range ou.Data {
		if len(b.Results) != 0 {
			t.Fatalf("another project sees usage: %+v", ou)
		}
	}

	// The records outlive a restart; a report after it still counts once.
	e.restart()
	n = e.rejoin(n)
	n.report(t, o)
	q.Del("group_by")
	u = e.usage(t, "/v1/usage", q)
	if u.Data[2].Results[0].Requests != 8 {
		t.Fatalf("after a restart: %+v", u.Data[2])
	}
}

// TestUsageBadInput: every bad parameter is a 400 naming it.
func TestUsageBadInput(t *testing.T) {
	e := newEnv(t, nil)
	now := time.Now().UTC()
	ts := func(d time.Duration) string { return now.Add(d).Format(time.RFC3339) }
	for _, c := range []struct {
		query, param string
	}{
		{"", "start"},
		{"start=yesterday", "start"},
		{"start=" + ts(-time.Hour) + "&end=soon", "end"},
		{"start=" + ts(0) + "&end=" + ts(-time.Hour), "start"},
		{"start=" + ts(-time.Hour) + "&granularity=minute", "granularity"},
		{"start=" + ts(-401*24*time.Hour), "start"},
		{"start=" + ts(-30*24*time.Hour) + "&granularity=hour", "start"},
		{"start=" + ts(-time.Hour) + "&group_by=model", "group_by"},
		{"start=" + ts(-time.Hour) + "&limit=5", "limit"},
		{"start=" + ts(-time.Hour) + "&start=" + ts(-time.Hour), "start"},
	} {
		e.req("GET", "/v1/usage?"+c.query, nil).wantErr(t, 400, "invalid_request", c.param)
	}
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("bad")).must(t, 201))
	_ = n
	e.req("GET", "/v1/servers/"+sid+"/usage?start="+url.QueryEscape(ts(-time.Hour))+"&group_by=server", nil).
		wantErr(t, 400, "invalid_request", "group_by")
	e.req("GET", "/v1/servers/srv_AAAAAAAAAAAAAAAAAAAAAAAA/usage?start="+url.QueryEscape(ts(-time.Hour)), nil).
		wantErr(t, 404, "not_found", "id")
}

// TestUsageBucketsChecked: buckets no node can have made are passed over
// and the rest of the report is applied (refusing it would keep the node
// from reporting anything); a minute ahead of the clock counts now; more
// buckets than a report may carry is a 400 that changes nothing.
func TestUsageBucketsChecked(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("checked")).must(t, 201))
	k := idOf(t, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "a"}).must(t, 201))
	d := converge(t, n, "192.0.2.91")
	m := time.Now().UTC().Truncate(time.Minute)
	o := applied(d, "192.0.2.91")
	o.UsageBuckets = make([]nodeapi.UsageBucket, nodeapi.MaxUsageBuckets+1)
	for i := range o.UsageBuckets {
		o.UsageBuckets[i] = bucket(uint64(i+1), k, m, 1)
	}
	if err := n.client.ReportObserved(t.Context(), o); err == nil {
		t.Fatal("a report of too many buckets was accepted")
	}
	o.UsageBuckets = []nodeapi.UsageBucket{
		bucket(1, k, m, 1),
		bucket(1, k, m, 100), // a number not above the one before
		bucket(2, "key_local", m, 100),
		{Seq: 3, KeyID: k, Minute: m, CompletionTokens: 1, ReasoningTokens: 2},
		{Seq: 4, KeyID: k, Minute: m, Requests: 100, TTFT: make([]uint64, nodeapi.TTFTBins+1)},
		bucket(5, k, m.Add(time.Second), 2), // counts in its minute
		bucket(6, k, m.Add(3*time.Hour), 4), // a clock ahead: counts now
	}
	n.report(t, o)
	u := e.usage(t, "/v1/usage", url.Values{"start": {m.Add(-time.Hour).Format(time.RFC3339)}, "granularity": {"hour"}})
	var total uint64
	for _, b := range u.Data {
		total += b.Results[0].Requests
	}
	if total != 7 {
		t.Fatalf("%d requests counted, want 7 (1 + 2 + 4)", total)
	}
}

// TestUsageRetention: the sweep deletes hour records past their
// retention and day records past theirs.
func TestUsageRetention(t *testing.T) {
	e, clk := newClockEnv(t, func(c *control.Config) {
		c.UsageHourRetention = 2 * time.Hour
		c.UsageDayRetention = 3 * 24 * time.Hour
	})
	n := e.enroll(hwM4)
	sid := idOf(t, e.req("POST", "/v1/servers", serverBody("kept")).must(t, 201))
	k := idOf(t, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": "a"}).must(t, 201))
	d := converge(t, n, "192.0.2.92")
	m := clk.now().Truncate(time.Minute)
	o := applied(d, "192.0.2.92")
	o.UsageBuckets = []nodeapi.UsageBucket{bucket(1, k, m, 7)}
	n.report(t, o)
	count := func() (hours, days int) {
		for _, key := range control.UsageKeys(t, e.st) {
			switch {
			case containsPart(key, "/h/"), containsPart(key, "/hk/"):
				hours++
			case containsPart(key, "/d/"), containsPart(key, "/dk/"):
				days++
			}
		}
		return hours, days
	}
	if h, d := count(); h != 3 || d != 3 {
		t.Fatalf("records: %d hour, %d day; want 3 and 3 (the project's, the server's, its keys')", h, d)
	}
	clk.add(4 * time.Hour)
	e.sweep()
	if h, d := count(); h != 0 || d != 3 {
		t.Fatalf("after 4 h: %d hour, %d day records", h, d)
	}
	clk.add(4 * 24 * time.Hour)
	e.sweep()
	if h, d := count(); h != 0 || d != 0 {
		t.Fatalf("after 4 days: %d hour, %d day records", h, d)
	}
	// A bucket older than the days kept is passed over, not refused.
	o.UsageBuckets = []nodeapi.UsageBucket{bucket(2, k, m, 1)}
	n.report(t, o)
	if h, d := count(); h != 0 || d != 0 {
		t.Fatalf("an expired bucket was stored: %d hour, %d day records", h, d)
	}
}

func containsPart(s, part string) bool { return strings.Contains(s, part) }

// rejoin is node n speaking to the env's server after a restart (a new
// address).
func (e *env) rejoin(n node) node {
	n.client = nodeapi.NewClient(e.ts.URL, e.ts.Client())
	n.client.SetCredential(n.credential)
	return n
}
