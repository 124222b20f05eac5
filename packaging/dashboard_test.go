package packaging_test

// Tests of grafana-dashboard.json: it is a well-formed importable dashboard,
// every metric it queries is one hearthd or hearth-control exports, and every
// query runs in a real Prometheus (Debian package prometheus) against those
// metrics and returns data.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/hearthd/hearth/metrics"
	"github.com/hearthd/hearth/metrics/promtest"
)

const (
	dashboardFile = "grafana-dashboard.json"
	nodeMetrics   = "../metrics/testdata/node.metrics"
	// The datasource every panel and query must use: the templated
	// variable, so one imported dashboard can switch between Prometheuses.
	datasourceUID = "${datasource}"
)

type dsRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type target struct {
	RefID        string `json:"refId"`
	Expr         string `json:"expr"`
	LegendFormat string `json:"legendFormat"`
	Format       string `json:"format"`
	Datasource   *dsRef `json:"datasource"`
}

type gridPos struct{ H, W, X, Y int }

type panel struct {
	ID         int      `json:"id"`
	Type       string   `json:"type"`
	Title      string   `json:"title"`
	Datasource *dsRef   `json:"datasource"`
	GridPos    gridPos  `json:"gridPos"`
	Targets    []target `json:"targets"`
	// Panels holds the panels of a collapsed row.
	Panels []panel `json:"panels"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Definition string          `json:"definition"`
	Datasource *dsRef          `json:"datasource"`
	Current    struct {
		Value any `json:"value"`
	} `json:"current"`
	Multi      bool   `json:"multi"`
	IncludeAll bool   `json:"includeAll"`
	AllValue   string `json:"allValue"`
}

type dashboard struct {
	Inputs []struct {
		Name     string `json:"name"`
		Type     string `json:"type"`
		PluginID string `json:"pluginId"`
	} `json:"__inputs"`
	UID           string  `json:"uid"`
	Title         string  `json:"title"`
	SchemaVersion int     `json:"schemaVersion"`
	Panels        []panel `json:"panels"`
	Templating    struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	raw, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	if dec.More() {
		t.Fatalf("%s: trailing data after the dashboard object", dashboardFile)
	}
	return d
}

// allPanels returns every panel, rows included, with the panels of
// collapsed rows flattened in.
func allPanels(d dashboard) []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// queryPanels returns the panels that draw data (every panel but rows).
func queryPanels(d dashboard) []panel {
	var out []panel
	for _, p := range allPanels(d) {
		if p.Type != "row" {
			out = append(out, p)
		}
	}
	return out
}

func (d dashboard) variable(name string) (variable, bool) {
	for _, v := range d.Templating.List {
		if v.Name == name {
			return v, true
		}
	}
	return variable{}, false
}

// variableQuery returns a query variable's query, which Grafana stores
// either as a string or as an object with a "query" field.
func variableQuery(t *testing.T, v variable) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(v.Query, &s); err == nil {
		return s
	}
	var o struct {
		Query string `json:"query"`
	}
	if err := json.Unmarshal(v.Query, &o); err != nil {
		t.Fatalf("variable %s: query is neither a string nor an object: %s", v.Name, v.Query)
	}
	return o.Query
}

func TestDashboardIsImportable(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q, title %q: both must be set", d.UID, d.Title)
	}
	if d.SchemaVersion < 36 || d.SchemaVersion > 41 {
		t.Errorf("schemaVersion %d, want 36..41 (Grafana 9.x to 11.x)", d.SchemaVersion)
	}
	var input bool
	for _, in := range d.Inputs {
		input = input || (in.Name == "DS_PROMETHEUS" && in.Type == "datasource" && in.PluginID == "prometheus")
	}
	if !input {
		t.Errorf("__inputs lacks the prometheus datasource input DS_PROMETHEUS: %+v", d.Inputs)
	}

	ds, ok := d.variable("datasource")
	switch {
	case !ok:
		t.Error("no datasource variable")
	case ds.Type != "datasource" || string(ds.Query) != `"prometheus"`:
		t.Errorf("datasource variable: type %q query %s, want datasource / prometheus", ds.Type, ds.Query)
	case ds.Current.Value != "${DS_PROMETHEUS}":
		t.Errorf("datasource variable defaults to %v, want the imported ${DS_PROMETHEUS}", ds.Current.Value)
	}
	inst, ok := d.variable("instance")
	switch {
	case !ok:
		t.Error("no instance variable")
	case inst.Type != "query" || inst.Datasource == nil || inst.Datasource.UID != datasourceUID:
		t.Errorf("instance variable: type %q datasource %+v, want a query on %s", inst.Type, inst.Datasource, datasourceUID)
	case !inst.Multi || !inst.IncludeAll || inst.AllValue != ".*":
		t.Errorf("instance variable: multi %v includeAll %v allValue %q, want a multi-value variable with All = .*",
			inst.Multi, inst.IncludeAll, inst.AllValue)
	}

	ids := map[int]string{}
	titles := map[string]bool{}
	var boxes []panel
	for _, p := range allPanels(d) {
		if p.Title == "" {
			t.Errorf("panel %d (%s) has no title", p.ID, p.Type)
		}
		if prev, dup := ids[p.ID]; dup || p.ID <= 0 {
			t.Errorf("panel %q: id %d not positive or already used by %q", p.Title, p.ID, prev)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W < 1 || g.H < 1 || g.X < 0 || g.Y < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		boxes = append(boxes, p)
		if p.Type == "row" {
			continue
		}
		if titles[p.Title] {
			t.Errorf("two panels titled %q", p.Title)
		}
		titles[p.Title] = true
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no targets", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != datasourceUID {
			t.Errorf("panel %q: datasource %+v, want uid %s", p.Title, p.Datasource, datasourceUID)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q target %q: empty expr", p.Title, tg.RefID)
			}
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q empty or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if tg.Datasource == nil || tg.Datasource.UID != datasourceUID {
				t.Errorf("panel %q target %q: datasource %+v, want uid %s", p.Title, tg.RefID, tg.Datasource, datasourceUID)
			}
		}
	}
	for i, a := range boxes {
		for _, b := range boxes[i+1:] {
			ga, gb := a.GridPos, b.GridPos
			if ga.X < gb.X+gb.W && gb.X < ga.X+ga.W && ga.Y < gb.Y+gb.H && gb.Y < ga.Y+ga.H {
				t.Errorf("panels %q %+v and %q %+v overlap", a.Title, ga, b.Title, gb)
			}
		}
	}
}

// exported returns the metric families hearthd and hearth-control export:
// the node's golden exposition and a freshly built control-plane registry
// with every metric present (the request counter and the scrape-time gauges
// appear only once used or registered).
func exported(t *testing.T) (node, control []byte, fams map[string]dto.MetricType) {
	t.Helper()
	node, err := os.ReadFile(nodeMetrics)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(controlMetrics().Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatalf("scrape control metrics: %v", err)
	}
	defer resp.Body.Close()
	control, err = io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("scrape control metrics: %d %v", resp.StatusCode, err)
	}
	fams = map[string]dto.MetricType{}
	for name, expo := range map[string][]byte{nodeMetrics: node, "control metrics": control} {
		var p expfmt.TextParser
		mf, err := p.TextToMetricFamilies(bytes.NewReader(expo))
		if err != nil {
			t.Fatalf("parse %s: %v", name, err)
		}
		for n, f := range mf {
			fams[n] = f.GetType()
		}
	}
	return node, control, fams
}

func controlMetrics() *metrics.Control {
	c := metrics.NewControl("test")
	c.Request("/v1/servers", http.MethodGet, http.StatusOK)
	c.Request("/v1/servers", http.MethodPost, http.StatusInternalServerError)
	c.RegisterNodesConnected(func() int { return 2 })
	c.RegisterServers(func() map[string]int { return map[string]int{"running": 2, "provisioning": 1} })
	c.ObserveRequest("/v1/servers", http.MethodGet, http.StatusOK, 30*time.Millisecond)
	c.RegisterNodes(func() map[string]int { return map[string]int{"idle": 1, "serving": 2, "wiping": 0, "unreachable": 0} })
	c.ObservePropagation(800 * time.Millisecond)
	return c
}

var (
	metricName   = regexp.MustCompile(`hearth_[a-z_]+`)
	exactMatcher = regexp.MustCompile(`\b([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"`)
)

// notOnDashboard lists exported metrics the dashboard leaves out on
// purpose, with why.
var notOnDashboard = map[string]string{
	"hearth_runtime_recovery_seconds":                    "rare events: the restarts panel shows each, the log line its time",
	"hearth_firewall_last_apply_timestamp_seconds":       "an apply without drift is rare; last success covers health",
	"hearth_firewall_last_drift_check_timestamp_seconds": "last success moves with every passing drift check",
	"hearth_control_last_sync_timestamp_seconds":         "shown as hearth_control_sync_lag_seconds",
	"hearth_panics_recovered_total":                      "a bug to alert on (docs/OPERATIONS.md); its 500s show in the error ratio",
}

func TestDashboardMetricsExist(t *testing.T) {
	d := loadDashboard(t)
	node, control, fams := exported(t)

	var queries []string
	for _, p := range queryPanels(d) {
		for _, tg := range p.Targets {
			queries = append(queries, tg.Expr)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type == "query" {
			queries = append(queries, variableQuery(t, v), v.Definition)
		}
	}

	used := map[string]bool{}
	for _, q := range queries {
		// An exact matcher on a value no series has would only show as an
		// empty panel (or a silent 0 behind "or vector(0)").
		for _, m := range exactMatcher.FindAllStringSubmatch(q, -1) {
			if !bytes.Contains(node, []byte(m[0])) && !bytes.Contains(control, []byte(m[0])) {
				t.Errorf("query %q: no exported series has %s", q, m[0])
			}
		}
		for _, name := range metricName.FindAllString(q, -1) {
			base := name
			for _, suffix := range []string{"_bucket", "_count", "_sum"} {
				if b, ok := strings.CutSuffix(name, suffix); ok && fams[b] == dto.MetricType_HISTOGRAM {
					base = b
				}
			}
			if _, ok := fams[base]; !ok {
				t.Errorf("query %q: metric %s is not exported by hearthd or hearth-control", q, name)
			}
			used[base] = true
		}
	}
	if len(used) == 0 {
		t.Fatal("no hearth_ metric found in any query")
	}

	var missing []string
	for name := range fams {
		if strings.HasPrefix(name, "hearth_") && !used[name] && notOnDashboard[name] == "" {
			missing = append(missing, name)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("exported metrics not on the dashboard (add a panel or list them in notOnDashboard): %v", missing)
	}
	for name := range notOnDashboard {
		if _, ok := fams[name]; !ok {
			t.Errorf("notOnDashboard lists %s, which is not exported", name)
		}
	}
}

// grafanaVars stands in for Grafana's template variables: the All value of
// $instance and a rate window spanning several one-second scrapes.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__range", "1m",
	"$instance", ".*",
)

var legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)

type queryResult struct {
	Status    string `json:"status"`
	ErrorType string `json:"errorType"`
	Error     string `json:"error"`
	Data      struct {
		ResultType string `json:"resultType"`
		Result     []struct {
			Metric map[string]string `json:"metric"`
		} `json:"result"`
	} `json:"data"`
}

func TestDashboardQueriesRunInPrometheus(t *testing.T) {
	d := loadDashboard(t)
	nodeExpo, _, _ := exported(t)

	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write(nodeExpo)
	}))
	defer node.Close()
	control := httptest.NewServer(controlMetrics().Handler())
	defer control.Close()

	p := promtest.Start(t, node.URL+"/metrics", control.URL+"/metrics")
	// rate() needs two samples in its window; wait for three from each target.
	p.WaitFor(t, `count(count_over_time(hearth_build_info[1m]) >= 3)`, func(v float64) bool { return v == 2 }, time.Minute)

	client := &http.Client{Timeout: 10 * time.Second}
	get := func(path string, params url.Values, out any) error {
		resp, err := client.Get(p.URL + path + "?" + params.Encode())
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return fmt.Errorf("decode %s answer (HTTP %d): %w", path, resp.StatusCode, err)
		}
		return nil
	}

	for _, pn := range queryPanels(d) {
		for _, tg := range pn.Targets {
			expr := grafanaVars.Replace(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("panel %q target %s: unknown template variable in %q", pn.Title, tg.RefID, tg.Expr)
				continue
			}
			var res queryResult
			if err := get("/api/v1/query", url.Values{"query": {expr}}, &res); err != nil {
				t.Fatalf("panel %q target %s: %v", pn.Title, tg.RefID, err)
			}
			if res.Status != "success" {
				t.Errorf("panel %q target %s: %q: %s: %s", pn.Title, tg.RefID, expr, res.ErrorType, res.Error)
				continue
			}
			if res.Data.ResultType != "vector" || len(res.Data.Result) == 0 {
				t.Errorf("panel %q target %s: %q returned %d series of type %s, want a non-empty vector",
					pn.Title, tg.RefID, expr, len(res.Data.Result), res.Data.ResultType)
				continue
			}
			for _, m := range legendLabel.FindAllStringSubmatch(tg.LegendFormat, -1) {
				for _, s := range res.Data.Result {
					if s.Metric[m[1]] == "" {
						t.Errorf("panel %q target %s: legend uses {{%s}}, missing from series %v", pn.Title, tg.RefID, m[1], s.Metric)
					}
				}
			}
		}
	}

	// The instance variable must list both targets.
	inst, ok := d.variable("instance")
	if !ok {
		t.Fatal("no instance variable")
	}
	q := variableQuery(t, inst)
	m := regexp.MustCompile(`^label_values\((hearth_[a-z_]+),\s*instance\)$`).FindStringSubmatch(q)
	if m == nil {
		t.Fatalf("instance variable query %q, want label_values(<hearth metric>, instance)", q)
	}
	var labels struct {
		Status string   `json:"status"`
		Data   []string `json:"data"`
	}
	if err := get("/api/v1/label/instance/values", url.Values{"match[]": {m[1]}}, &labels); err != nil {
		t.Fatal(err)
	}
	want := []string{strings.TrimPrefix(node.URL, "http://"), strings.TrimPrefix(control.URL, "http://")}
	sort.Strings(want)
	sort.Strings(labels.Data)
	if labels.Status != "success" || strings.Join(labels.Data, " ") != strings.Join(want, " ") {
		t.Errorf("instance variable %q lists %v (%s), want %v", q, labels.Data, labels.Status, want)
	}
}
