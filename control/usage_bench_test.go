package control_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/hearthd/hearth/nodeapi"
)

// BenchmarkUsageQuery reads 30 days by day of a project of 1 000 keys (10
// servers of 100), ungrouped, by server and by key: what one query costs
// the control plane, apart from the fleet bench's load (BENCHMARKS.md).
func BenchmarkUsageQuery(b *testing.B) {
	e := newEnv(b, nil)
	today := time.Now().UTC().Truncate(24 * time.Hour)
	for s := range 10 {
		n := e.enroll(hwM4)
		sid := idOf(b, e.req("POST", "/v1/servers", serverBody(fmt.Sprintf("q-%d", s))).must(b, 201))
		var keys []string
		for k := range 100 {
			keys = append(keys, idOf(b, e.req("POST", "/v1/servers/"+sid+"/api-keys", map[string]any{"name": fmt.Sprint(k)}).must(b, 201)))
		}
		d := n.desired(b, 0)
		var bs []nodeapi.UsageBucket
		for day := 30; day >= 0; day-- {
			for _, k := range keys {
				bs = append(bs, bucket(uint64(len(bs)+1), k, today.AddDate(0, 0, -day), 10))
			}
		}
		for len(bs) > 0 {
			o := applied(d, "192.0.2.1")
			o.UsageBuckets = bs[:min(len(bs), nodeapi.MaxUsageBuckets)]
			n.report(b, o)
			bs = bs[len(o.UsageBuckets):]
		}
	}
	q := url.Values{"start": {today.AddDate(0, 0, -30).Format(time.RFC3339)}, "granularity": {"day"}}
	for _, g := range []string{"", "server", "api_key"} {
		name := "ungrouped"
		if g != "" {
			q.Set("group_by", g)
			name = g
		}
		path := "/v1/usage?" + q.Encode()
		e.req("GET", path, nil).must(b, 200) // checked against openapi.json once
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				req, _ := http.NewRequest("GET", e.ts.URL+path, nil)
				req.Header.Set("Authorization", "Bearer "+e.token)
				resp, err := e.ts.Client().Do(req)
				if err != nil {
					b.Fatal(err)
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					b.Fatalf("status %d", resp.StatusCode)
				}
				b.ReportMetric(float64(n), "bytes/op")
			}
		})
	}
}
