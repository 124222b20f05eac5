package control

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hearthd/hearth/nodeapi"
	"github.com/hearthd/hearth/store"
)

// Usage over time. A node reports its API keys' minute buckets
// (nodeapi.UsageBucket), each numbered; a report's new buckets are added,
// in the change that applies the report, to hour and day records of the
// node's server, of each of its keys and of its project, and the node's
// last number is kept with them (ctl/useseq/<node>), so that a bucket
// reported again (the answer lost, a retry to another replica) is never
// counted twice. Hour records are kept UsageHourRetention, day records
// UsageDayRetention; the sweep deletes older ones. The records live under
// the project's usage prefix, ordered by period:
//
//	ctl/use/<project>/<h|d>/<period>               the project's total
//	ctl/use/<project>/<h|d>/<period>/<server id>   the server's total
//	ctl/use/<project>/<hk|dk>/<period>/<server id> the server's keys, each's
//
// where period is the bucket's start in Unix seconds, zero-padded. A
// project's or a server's totals over a window are one read per period; by
// server, one scan of the window's totals; by key, one scan of its keys'
// records, which the other queries never read. The records of a deleted
// server stay: they are the project's history.
const (
	pfxUsage    = "ctl/use/"
	pfxUsageSeq = "ctl/useseq/" // <node id> → the last usage bucket number applied

	// Granularities of the usage API.
	granHour = "hour"
	granDay  = "day"

	// maxUsageWindow and maxUsageBuckets bound a usage query.
	maxUsageWindow  = 400 * 24 * time.Hour
	maxUsageBuckets = 10_000
	// maxUsageRows bounds the results of a grouped query (periods ×
	// groups), which bounds its answer's size.
	maxUsageRows = 100_000
	// maxUsageKeys bounds the keys one server's record counts apart; a
	// node reporting more (a server keeps at most MaxAPIKeysPerServer
	// keys at a time) adds to the server's total only.
	maxUsageKeys = 4 * MaxAPIKeysPerServer
	// usageClockSkew is how far in the future a node's minute may be.
	usageClockSkew = 5 * time.Minute
)

// usageKeys is one project's usage key space, ctl/use/<project>/.
type usageKeys string

func usageKeysOf(project string) usageKeys { return usageKeys(pfxUsage + project + "/") }

// periods is the prefix of a granularity's totals ("h/" or "d/").
func (k usageKeys) periods(g string) string { return string(k) + g[:1] + "/" }

// keyPeriods is the prefix of a granularity's key records ("hk/", "dk/").
func (k usageKeys) keyPeriods(g string) string { return string(k) + g[:1] + "k/" }

func (k usageKeys) total(g string, period int64) string {
	return k.periods(g) + periodKey(period)
}

func (k usageKeys) server(g string, period int64, srv string) string {
	return k.total(g, period) + "/" + srv
}

func (k usageKeys) keys(g string, period int64, srv string) string {
	return k.keyPeriods(g) + periodKey(period) + "/" + srv
}

func periodKey(p int64) string { return fmt.Sprintf("%012d", p) }

// usageCounts are the counters of a key, a server or a project in one
// period. The JSON names are short: a day record of a busy server holds
// one per key.
type usageCounts struct {
	Requests   uint64   `json:"r,omitempty"`
	Prompt     uint64   `json:"p,omitempty"`
	Completion uint64   `json:"c,omitempty"`
	Reasoning  uint64   `json:"x,omitempty"`
	Errors     uint64   `json:"e,omitempty"`
	TTFT       []uint64 `json:"t,omitempty"` // nodeapi.UsageBucket's histogram
}

func (c *usageCounts) add(o usageCounts) {
	c.Requests += o.Requests
	c.Prompt += o.Prompt
	c.Completion += o.Completion
	c.Reasoning += o.Reasoning
	c.Errors += o.Errors
	if len(o.TTFT) > 0 {
		c.TTFT = nodeapi.AddTTFT(c.TTFT, o.TTFT)
	}
}

func bucketCounts(b nodeapi.UsageBucket) usageCounts {
	return usageCounts{Requests: b.Requests, Prompt: b.PromptTokens, Completion: b.CompletionTokens,
		Reasoning: b.ReasoningTokens, Errors: b.Errors, TTFT: b.TTFT}
}

// usageRec is a usage record: a project's or a server's total in one
// period, or a server's keys (Keys only).
type usageRec struct {
	usageCounts
	Keys map[string]*usageCounts `json:"k,omitempty"`
}

// Bounds on one bucket's counts, far above what a node does in a minute,
// so that no sum of them nears overflow.
const (
	maxBucketRequests = 1 << 32
	maxBucketTokens   = 1 << 40
)

// checkUsageBuckets keeps the buckets of a report a node can have made
// and returns how many it passed over: a number not above the one before
// it, a key that is not a managed key's ID, counts out of bounds. A minute
// too far in the future (a node's clock ahead) counts at now's. A report
// is never refused for its buckets' content, which would keep the node
// from reporting anything else: only for more than a report may carry.
func checkUsageBuckets(buckets []nodeapi.UsageBucket, now time.Time) ([]nodeapi.UsageBucket, int, *apiError) {
	if len(buckets) > nodeapi.MaxUsageBuckets {
		return nil, 0, invalid("usage_buckets", "usage_buckets lists %d; at most %d", len(buckets), nodeapi.MaxUsageBuckets)
	}
	kept := make([]nodeapi.UsageBucket, 0, len(buckets)) // the report is read twice (a dry run first)
	var last uint64
	for _, b := range buckets {
		var ttft uint64
		for _, c := range b.TTFT {
			ttft += c
		}
		if b.Seq <= last || !validID(b.KeyID, prefixAPIKey) || len(b.TTFT) > nodeapi.TTFTBins || ttft > maxBucketRequests ||
			b.Requests > maxBucketRequests || b.Errors > maxBucketRequests || b.PromptTokens > maxBucketTokens ||
			b.CompletionTokens > maxBucketTokens || b.ReasoningTokens > b.CompletionTokens {
			continue
		}
		last = b.Seq
		b.Minute = b.Minute.UTC().Truncate(time.Minute)
		if b.Minute.After(now.Add(usageClockSkew)) {
			b.Minute = now.UTC().Truncate(time.Minute)
		}
		kept = append(kept, b)
	}
	return kept, len(buckets) - len(kept), nil
}

// applyUsage adds the report's usage buckets that are new (numbered after
// the last the node had applied) to the records of the node's server srv
// and its project, and keeps the node's last number. Buckets older than
// the day records' retention are passed over (counted as applied).
func (s *Server) applyUsage(m *mutation, nodeID string, srv serverRec, buckets []nodeapi.UsageBucket, now time.Time) error {
	if len(buckets) == 0 {
		return nil
	}
	var last uint64
	if err := m.r.Get(pfxUsageSeq+nodeID, &last); err != nil && !isNotFound(err) {
		return fmt.Errorf("load usage number of %s: %w", nodeID, err)
	}
	top := buckets[len(buckets)-1].Seq
	if top <= last {
		return nil // a report sent again: all applied already
	}
	if err := m.put(pfxUsageSeq+nodeID, top); err != nil {
		return err
	}
	if m.dry {
		return nil // the report changes something: decided under the lock
	}
	uk := usageKeysOf(srv.Project)
	hourFrom := now.Add(-s.cfg.UsageHourRetention)
	dayFrom := now.Add(-s.cfg.UsageDayRetention)
	for _, b := range buckets {
		if b.Seq <= last {
			continue
		}
		c := bucketCounts(b)
		for _, g := range []string{granHour, granDay} {
			start := periodStart(b.Minute, g)
			if (g == granHour && !start.Add(time.Hour).After(hourFrom)) || (g == granDay && !start.Add(24*time.Hour).After(dayFrom)) {
				continue
			}
			p := start.Unix()
			tot, err := m.usageRec(uk.total(g, p))
			if err != nil {
				return err
			}
			tot.add(c)
			st, err := m.usageRec(uk.server(g, p, srv.ID))
			if err != nil {
				return err
			}
			st.add(c)
			rec, err := m.usageRec(uk.keys(g, p, srv.ID))
			if err != nil {
				return err
			}
			k := rec.Keys[b.KeyID]
			if k == nil && len(rec.Keys) < maxUsageKeys {
				if rec.Keys == nil {
					rec.Keys = map[string]*usageCounts{}
				}
				k = &usageCounts{}
				rec.Keys[b.KeyID] = k
			}
			if k != nil {
				k.add(c)
			}
		}
	}
	return nil
}

// usageRec returns the usage record at key as this change sees it (its
// staged additions included), to add to; the change writes it at commit.
func (m *mutation) usageRec(key string) (*usageRec, error) {
	if r, ok := m.usage[key]; ok {
		return r, nil
	}
	r := &usageRec{}
	if err := m.r.Get(key, r); err != nil && !isNotFound(err) {
		return nil, fmt.Errorf("load usage %s: %w", key, err)
	}
	if m.usage == nil {
		m.usage = map[string]*usageRec{}
	}
	m.usage[key] = r
	m.puts++ // staged, for buildFold's test
	return r, nil
}

// periodStart is the start of the hour or the day (UTC) t falls in.
func periodStart(t time.Time, g string) time.Time {
	t = t.UTC()
	if g == granHour {
		return t.Truncate(time.Hour)
	}
	return time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
}

// periodEnd is the start of the period after the one starting at p.
func periodEnd(p time.Time, g string) time.Time {
	if g == granHour {
		return p.Add(time.Hour)
	}
	return p.AddDate(0, 0, 1)
}

// usageQuery is a usage request, validated: the window [start, end) on
// period boundaries, its periods' starts, and the grouping.
type usageQuery struct {
	start, end time.Time
	gran       string
	groupBy    string // "", "server" or "api_key"
	periods    []int64
}

// parseUsageQuery reads start (required), end (default now), granularity
// (default day) and group_by (one of groups, optional).
func (s *Server) parseUsageQuery(r *http.Request, now time.Time, groups ...string) (usageQuery, *apiError) {
	q := r.URL.Query()
	for k, v := range q {
		switch k {
		case "start", "end", "granularity", "group_by":
			if len(v) != 1 {
				return usageQuery{}, invalid(k, "%s may be given once", k)
			}
		default:
			return usageQuery{}, invalid(k, "unknown query parameter %q", k)
		}
	}
	uq := usageQuery{gran: granDay}
	if q.Has("granularity") {
		uq.gran = q.Get("granularity")
		if uq.gran != granHour && uq.gran != granDay {
			return uq, invalid("granularity", "granularity must be one of: hour, day")
		}
	}
	if q.Has("group_by") {
		uq.groupBy = q.Get("group_by")
		if !slices.Contains(groups, uq.groupBy) {
			return uq, invalid("group_by", "group_by must be one of: %s", strings.Join(groups, ", "))
		}
	}
	if !q.Has("start") {
		return uq, invalid("start", "start is required: an RFC 3339 time such as 2030-01-02T00:00:00Z")
	}
	start, err := time.Parse(time.RFC3339, q.Get("start"))
	if err != nil {
		return uq, invalid("start", "start must be an RFC 3339 time such as 2030-01-02T00:00:00Z")
	}
	end := now
	if q.Has("end") {
		if end, err = time.Parse(time.RFC3339, q.Get("end")); err != nil {
			return uq, invalid("end", "end must be an RFC 3339 time such as 2030-01-02T00:00:00Z")
		}
	}
	if !start.Before(end) {
		return uq, invalid("start", "start must be before end")
	}
	if end.Sub(start) > maxUsageWindow {
		return uq, invalid("start", "the window from start to end is %.0f days; at most %.0f", end.Sub(start).Hours()/24, maxUsageWindow.Hours()/24)
	}
	uq.start = periodStart(start, uq.gran)
	uq.end = periodStart(end, uq.gran)
	if uq.end.Before(end) {
		uq.end = periodEnd(uq.end, uq.gran)
	}
	if uq.gran == granHour && uq.start.Before(now.Add(-s.cfg.UsageHourRetention).Truncate(time.Hour)) {
		return uq, invalid("start", "hourly usage is kept for %s: start must be after %s (use granularity day for older usage)",
			s.cfg.UsageHourRetention, formatTime(now.Add(-s.cfg.UsageHourRetention).Truncate(time.Hour)))
	}
	for p := uq.start; p.Before(uq.end); p = periodEnd(p, uq.gran) {
		if len(uq.periods) == maxUsageBuckets {
			return uq, invalid("granularity", "the window holds more than %d %ss; use a coarser granularity or a shorter window", maxUsageBuckets, uq.gran)
		}
		uq.periods = append(uq.periods, p.Unix())
	}
	return uq, nil
}

// usageJSON is a usage answer.
type usageJSON struct {
	Start       string            `json:"start"`
	End         string            `json:"end"`
	Granularity string            `json:"granularity"`
	GroupBy     *string           `json:"group_by"`
	Data        []usageBucketJSON `json:"data"`
}

type usageBucketJSON struct {
	Start   string            `json:"start"`
	End     string            `json:"end"`
	Results []usageResultJSON `json:"results"`
}

type usageResultJSON struct {
	ServerID         string   `json:"server_id,omitempty"`
	APIKeyID         string   `json:"api_key_id,omitempty"`
	Requests         uint64   `json:"requests"`
	PromptTokens     uint64   `json:"prompt_tokens"`
	CompletionTokens uint64   `json:"completion_tokens"`
	ReasoningTokens  uint64   `json:"reasoning_tokens"`
	Errors           uint64   `json:"errors"`
	TTFTP50          *float64 `json:"ttft_p50_ms"`
	TTFTP95          *float64 `json:"ttft_p95_ms"`
}

func usageResult(c usageCounts) usageResultJSON {
	out := usageResultJSON{Requests: c.Requests, PromptTokens: c.Prompt, CompletionTokens: c.Completion,
		ReasoningTokens: c.Reasoning, Errors: c.Errors}
	if v, ok := nodeapi.TTFTQuantile(c.TTFT, 0.5); ok {
		out.TTFTP50 = &v
	}
	if v, ok := nodeapi.TTFTQuantile(c.TTFT, 0.95); ok {
		out.TTFTP95 = &v
	}
	return out
}

// usageGroup is one group of a grouped answer: a server, or a key of a
// server.
type usageGroup struct{ server, key string }

// usageAnswer builds the answer: every period of the window, each with
// one result per group (ungrouped: one), zero where nothing was used.
// counts holds what was found, by period and group.
func usageAnswer(uq usageQuery, counts map[int64]map[usageGroup]*usageCounts) (usageJSON, *apiError) {
	groups := map[usageGroup]bool{}
	for _, byGroup := range counts {
		for g := range byGroup {
			groups[g] = true
		}
	}
	order := make([]usageGroup, 0, len(groups))
	for g := range groups {
		order = append(order, g)
	}
	if uq.groupBy == "" {
		order = []usageGroup{{}}
	}
	slices.SortFunc(order, func(a, b usageGroup) int {
		if c := strings.Compare(a.server, b.server); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	if len(order)*len(uq.periods) > maxUsageRows {
		return usageJSON{}, invalid("group_by", "the answer would hold %d results (%d periods × %d groups); at most %d: use a shorter window or a coarser granularity",
			len(order)*len(uq.periods), len(uq.periods), len(order), maxUsageRows)
	}
	out := usageJSON{Start: formatTime(uq.start), End: formatTime(uq.end), Granularity: uq.gran,
		Data: make([]usageBucketJSON, 0, len(uq.periods))}
	if uq.groupBy != "" {
		gb := uq.groupBy
		out.GroupBy = &gb
	}
	for _, p := range uq.periods {
		start := time.Unix(p, 0).UTC()
		b := usageBucketJSON{Start: formatTime(start), End: formatTime(periodEnd(start, uq.gran)),
			Results: make([]usageResultJSON, 0, len(order))}
		for _, g := range order {
			var c usageCounts
			if found := counts[p][g]; found != nil {
				c = *found
			}
			res := usageResult(c)
			res.ServerID, res.APIKeyID = g.server, g.key
			b.Results = append(b.Results, res)
		}
		out.Data = append(out.Data, b)
	}
	return out, nil
}

// getUsage answers GET /v1/usage: the project's usage over a window,
// ungrouped or grouped by server or API key.
func (s *Server) getUsage(r *http.Request, rc *reqCtx) (result, error) {
	uq, e := s.parseUsageQuery(r, s.now(), "server", "api_key")
	if e != nil {
		return result{}, e
	}
	uk := usageKeysOf(rc.project)
	counts := map[int64]map[usageGroup]*usageCounts{}
	if uq.groupBy == "" {
		keys := make([]string, len(uq.periods))
		for i, p := range uq.periods {
			keys[i] = uk.total(uq.gran, p)
		}
		err := store.GetMany(s.st, keys, func(key string, val []byte) error {
			var c usageCounts
			if err := json.Unmarshal(val, &c); err != nil {
				return fmt.Errorf("decode %s: %w", key, err)
			}
			p, _ := strconv.ParseInt(key[len(key)-12:], 10, 64)
			counts[p] = map[usageGroup]*usageCounts{{}: &c}
			return nil
		})
		if err != nil {
			return result{}, err
		}
	} else if err := s.scanUsage(uk, uq, counts); err != nil {
		return result{}, err
	}
	return usageResult200(uq, counts)
}

// usageResult200 is the answer of a usage query.
func usageResult200(uq usageQuery, counts map[int64]map[usageGroup]*usageCounts) (result, error) {
	out, e := usageAnswer(uq, counts)
	if e != nil {
		return result{}, e
	}
	return result{status: http.StatusOK, body: out}, nil
}

// scanUsage reads the window's server totals (by server) or key records
// (by key), one scan, into counts.
func (s *Server) scanUsage(uk usageKeys, uq usageQuery, counts map[int64]map[usageGroup]*usageCounts) error {
	prefix := uk.periods(uq.gran)
	if uq.groupBy == "api_key" {
		prefix = uk.keyPeriods(uq.gran)
	}
	endKey := prefix + periodKey(uq.end.Unix())
	return s.st.Scan(prefix, prefix+periodKey(uq.start.Unix()), false, func(key string, val []byte) (bool, error) {
		if key >= endKey {
			return false, nil
		}
		rest := key[len(prefix):]
		if len(rest) <= 13 { // a project total
			return true, nil
		}
		p, err := strconv.ParseInt(rest[:12], 10, 64)
		if err != nil {
			return false, fmt.Errorf("usage record %s: %w", key, err)
		}
		return true, addServerUsage(counts, p, rest[13:], val, uq.groupBy)
	})
}

// addServerUsage adds a server's total, or its keys' record when grouped
// by key, to counts.
func addServerUsage(counts map[int64]map[usageGroup]*usageCounts, p int64, srv string, val []byte, groupBy string) error {
	byGroup := counts[p]
	if byGroup == nil {
		byGroup = map[usageGroup]*usageCounts{}
		counts[p] = byGroup
	}
	if groupBy != "api_key" {
		var c usageCounts
		if err := json.Unmarshal(val, &c); err != nil {
			return fmt.Errorf("decode usage of %s: %w", srv, err)
		}
		g := usageGroup{}
		if groupBy == "server" {
			g.server = srv
		}
		if cur := byGroup[g]; cur != nil {
			cur.add(c)
		} else {
			byGroup[g] = &c
		}
		return nil
	}
	var rec usageRec
	if err := json.Unmarshal(val, &rec); err != nil {
		return fmt.Errorf("decode usage of %s: %w", srv, err)
	}
	for id, c := range rec.Keys {
		byGroup[usageGroup{server: srv, key: id}] = c
	}
	return nil
}

// getServerUsage answers GET /v1/servers/{id}/usage: one server's usage,
// ungrouped or by API key.
func (s *Server) getServerUsage(r *http.Request, rc *reqCtx) (result, error) {
	srv, err := s.loadServer(rc, r.PathValue("id"))
	if err != nil {
		return result{}, err
	}
	uq, e := s.parseUsageQuery(r, s.now(), "api_key")
	if e != nil {
		return result{}, e
	}
	uk := usageKeysOf(rc.project)
	keys := make([]string, len(uq.periods))
	prefix := uk.periods(uq.gran)
	for i, p := range uq.periods {
		keys[i] = uk.server(uq.gran, p, srv.ID)
		if uq.groupBy == "api_key" {
			keys[i], prefix = uk.keys(uq.gran, p, srv.ID), uk.keyPeriods(uq.gran)
		}
	}
	counts := map[int64]map[usageGroup]*usageCounts{}
	err = store.GetMany(s.st, keys, func(key string, val []byte) error {
		p, err := strconv.ParseInt(key[len(prefix):len(prefix)+12], 10, 64)
		if err != nil {
			return fmt.Errorf("usage record %s: %w", key, err)
		}
		return addServerUsage(counts, p, srv.ID, val, uq.groupBy)
	})
	if err != nil {
		return result{}, err
	}
	return usageResult200(uq, counts)
}

// usageRetentionEvery is how often the sweep looks for usage records past
// their retention.
const usageRetentionEvery = time.Hour

// maxUsagePurge bounds the records one change of the retention sweep
// deletes.
const maxUsagePurge = 1024

// usageExpired finds, through rd (without the change lock), up to
// maxUsagePurge usage records past their retention at now, project by
// project.
func (s *Server) usageExpired(rd store.KV, now time.Time) ([]string, error) {
	var keys []string
	err := store.ScanJSON(rd, pfxProject, func(_ string, p projectRec) (bool, error) {
		uk := usageKeysOf(p.ID)
		for _, g := range []struct {
			prefix, gran string
			keep         time.Duration
		}{{uk.periods(granHour), granHour, s.cfg.UsageHourRetention}, {uk.keyPeriods(granHour), granHour, s.cfg.UsageHourRetention},
			{uk.periods(granDay), granDay, s.cfg.UsageDayRetention}, {uk.keyPeriods(granDay), granDay, s.cfg.UsageDayRetention}} {
			prefix := g.prefix
			// A period is kept while any of it is within the retention.
			cutoff := prefix + periodKey(periodStart(now.Add(-g.keep), g.gran).Unix())
			err := rd.Scan(prefix, "", false, func(key string, _ []byte) (bool, error) {
				if key >= cutoff || len(keys) == maxUsagePurge {
					return false, nil
				}
				keys = append(keys, key)
				return true, nil
			})
			if err != nil {
				return false, err
			}
		}
		return len(keys) < maxUsagePurge, nil
	})
	return keys, err
}

// purgeUsage deletes expired usage records (found by usageExpired).
func purgeUsage(m *mutation, keys []string) bool {
	for _, k := range keys {
		m.b.Delete(k)
	}
	return len(keys) > 0
}

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
