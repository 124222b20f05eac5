package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hearthd/hearth/bench"
)

// Management operations the fleet clients perform.
const (
	opCreate = iota
	opRuleAdd
	opRuleDelete
	opDelete
	numOps
	// opOnly is the slot an opRecorder of a single kind of request
	// (enrolments, reports) uses.
	opOnly = 0
)

var opNames = [numOps]string{"create", "rule_add", "rule_delete", "delete"}

// rulesPerServer is how many firewall rules a client keeps on a server
// unless FleetConfig.RulesPerServer says otherwise: a rule change beyond it
// replaces the oldest rule (delete, then add).
const rulesPerServer = 3

// OpStats is what one kind of management request did in one phase.
type OpStats struct {
	OK int `json:"ok"`
	// CapacityUnavailable counts 409 capacity_unavailable answers, which the
	// clients' accounting of free nodes should make impossible.
	CapacityUnavailable int      `json:"capacity_unavailable"`
	Errors              int      `json:"errors"`
	ErrorSamples        []string `json:"error_samples,omitempty"`
	PerSecond           float64  `json:"per_second"`
	// Latency is request start → 2xx answer read.
	Latency bench.Dist `json:"latency"`
}

// opRecorder collects one phase's requests.
type opRecorder struct {
	mu      sync.Mutex
	lat     [numOps][]time.Duration
	ends    [numOps][]time.Time // when each of lat was answered
	noCap   [numOps]int
	errs    [numOps]int
	samples [numOps][]string
}

func (r *opRecorder) ok(op int, d time.Duration) {
	r.mu.Lock()
	r.lat[op] = append(r.lat[op], d)
	r.ends[op] = append(r.ends[op], time.Now())
	r.mu.Unlock()
}

func (r *opRecorder) fail(op int, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ae *apiStatusError
	if errors.As(err, &ae) && ae.code == "capacity_unavailable" {
		r.noCap[op]++
		return
	}
	r.errs[op]++
	if len(r.samples[op]) < 5 {
		r.samples[op] = append(r.samples[op], err.Error())
	}
}

// latencyCSV lists every answered request of the phase that began at
// start: its operation, when it was answered and its latency, both in
// microseconds, in the order answered per operation; a comment line first
// gives the start's wall-clock time, to line the requests up with other
// logs.
func (r *opRecorder) latencyCSV(start time.Time) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b bytes.Buffer
	fmt.Fprintf(&b, "# phase start %s (unix µs %d)\nop,answered_us,latency_us\n", start.UTC().Format(time.RFC3339Nano), start.UnixMicro())
	for op := range numOps {
		for i, d := range r.lat[op] {
			fmt.Fprintf(&b, "%s,%d,%d\n", opNames[op], r.ends[op][i].Sub(start).Microseconds(), d.Microseconds())
		}
	}
	return b.Bytes()
}

// stats summarises the phase, which lasted elapsed.
func (r *opRecorder) stats(elapsed time.Duration) map[string]OpStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]OpStats{}
	for op := range numOps {
		s := OpStats{OK: len(r.lat[op]), CapacityUnavailable: r.noCap[op], Errors: r.errs[op], ErrorSamples: r.samples[op]}
		if s.OK+s.Errors+s.CapacityUnavailable == 0 {
			continue
		}
		if elapsed > 0 {
			s.PerSecond = float64(s.OK) / elapsed.Seconds()
		}
		s.Latency = bench.Summarize(append([]time.Duration(nil), r.lat[op]...))
		out[opNames[op]] = s
	}
	return out
}

// apiStatusError is a non-2xx answer of the management API.
type apiStatusError struct {
	status int
	code   string
	body   string
}

func (e *apiStatusError) Error() string {
	return fmt.Sprintf("status %d %s: %s", e.status, e.code, e.body)
}

// ownServer is a server a client created and still holds.
type ownServer struct {
	id       string
	rules    []string // oldest first
	nextPort int
}

// mgmtClient is one management API client (a tenant with its own token).
// It works on its own servers only and one request at a time, which is
// what lets the propagation tracker order its changes.
type mgmtClient struct {
	index   int
	token   string
	urls    []string // one per replica; requests go round-robin
	next    int
	http    *http.Client
	prop    *propagation
	live    *atomic.Int64
	limit   int64 // most servers the fleet may hold at once
	servers []*ownServer
	seq     int
	rng     *rand.Rand
	rules   int // rules kept per server (rulesPerServer)
}

// createOrDelete creates a server if the fleet has room, else deletes one
// of the client's servers (there is none to delete only if the fleet is
// full of other clients' servers; then it waits a moment).
func (c *mgmtClient) createOrDelete(ctx context.Context, rec *opRecorder) {
	if c.live.Add(1) > c.limit {
		c.live.Add(-1)
		if len(c.servers) > 0 {
			c.deleteServer(ctx, rec)
			return
		}
		sleepCtx(ctx, 10*time.Millisecond)
		return
	}
	c.create(ctx, rec)
}

func (c *mgmtClient) create(ctx context.Context, rec *opRecorder) {
	c.seq++
	body := serverBody(fmt.Sprintf("fleet-c%d-%d", c.index, c.seq))
	var out struct {
		ID string `json:"id"`
	}
	start := time.Now()
	at, err := c.do(ctx, http.MethodPost, "/v1/servers", body, http.StatusCreated, &out)
	if err != nil {
		c.live.Add(-1)
		rec.fail(opCreate, err)
		return
	}
	rec.ok(opCreate, at.Sub(start))
	c.prop.answered(out.ID, change{kind: changeCreate, answered: at})
	c.servers = append(c.servers, &ownServer{id: out.ID, nextPort: 1000})
}

// serverBody is the create request of every server of the fleet: a
// deployment of a model each node serves at once.
func serverBody(name string) map[string]any {
	return map[string]any{"name": name, "chip": fleetChip, "ram": 8, "storage": 100, "stack": "deployment",
		"model": "bench-model", "billing": "monthly"}
}

// changeRule adds a rule to one of the client's servers, or when it holds
// c.rules, replaces the oldest (delete, then add: both are done, so
// a server's last change is always one its node can see).
func (c *mgmtClient) changeRule(ctx context.Context, rec *opRecorder) {
	if len(c.servers) == 0 {
		c.createOrDelete(ctx, rec)
		return
	}
	s := c.servers[c.rng.IntN(len(c.servers))]
	if len(s.rules) >= c.rules {
		rid := s.rules[0]
		start := time.Now()
		at, err := c.do(ctx, http.MethodDelete, "/v1/servers/"+s.id+"/firewall-rules/"+rid, nil, http.StatusNoContent, nil)
		if err != nil {
			rec.fail(opRuleDelete, err)
		} else {
			rec.ok(opRuleDelete, at.Sub(start))
			c.prop.answered(s.id, change{kind: changeRuleDelete, rule: rid, answered: at})
			s.rules = s.rules[1:]
		}
	}
	body := map[string]any{"direction": "inbound", "protocol": "tcp", "port_range": strconv.Itoa(s.nextPort),
		"source": "10.0.0.0/8", "action": "allow", "description": "fleet bench"}
	s.nextPort++
	var out struct {
		ID string `json:"id"`
	}
	start := time.Now()
	at, err := c.do(ctx, http.MethodPost, "/v1/servers/"+s.id+"/firewall-rules", body, http.StatusCreated, &out)
	if err != nil {
		rec.fail(opRuleAdd, err)
		return
	}
	rec.ok(opRuleAdd, at.Sub(start))
	c.prop.answered(s.id, change{kind: changeRuleAdd, rule: out.ID, answered: at})
	s.rules = append(s.rules, out.ID)
}

// deleteServer deletes a random server of the client's. The fleet's live
// count drops when the node confirms the wipe, not here.
func (c *mgmtClient) deleteServer(ctx context.Context, rec *opRecorder) {
	if len(c.servers) == 0 {
		c.createOrDelete(ctx, rec)
		return
	}
	i := c.rng.IntN(len(c.servers))
	s := c.servers[i]
	c.servers[i] = c.servers[len(c.servers)-1]
	c.servers = c.servers[:len(c.servers)-1]
	start := time.Now()
	at, err := c.do(ctx, http.MethodDelete, "/v1/servers/"+s.id, nil, http.StatusNoContent, nil)
	if err != nil {
		rec.fail(opDelete, err)
		return
	}
	rec.ok(opDelete, at.Sub(start))
	c.prop.answered(s.id, change{kind: changeDelete, answered: at})
}

// do sends one request to the next replica and returns when its answer was
// read, or an error for any status but want.
func (c *mgmtClient) do(ctx context.Context, method, path string, in any, want int, out any) (time.Time, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return time.Time{}, fmt.Errorf("encode %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	base := c.urls[c.next%len(c.urls)]
	c.next++
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return time.Time{}, fmt.Errorf("build %s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %s: %w", method, path, err)
	}
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20)) // a usage answer by key is megabytes
	resp.Body.Close()
	at := time.Now()
	if err != nil {
		return at, fmt.Errorf("%s %s: read answer: %w", method, path, err)
	}
	if resp.StatusCode != want {
		var eb struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &eb)
		return at, &apiStatusError{status: resp.StatusCode, code: eb.Error.Code, body: string(bytes.TrimSpace(raw))}
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return at, fmt.Errorf("%s %s: decode answer: %w", method, path, err)
		}
	}
	return at, nil
}

// Operation mixes of the two load phases, as weights of create, rule
// change and delete.
var (
	mixCreate = [3]int{1, 0, 0}
	// mixChurn keeps the fleet's size about steady: as many deletes as
	// creates, and two rule changes for each.
	mixChurn = [3]int{1, 2, 1}
)

// loop runs the mix until deadline, or until stop says the phase is done.
func (c *mgmtClient) loop(ctx context.Context, rec *opRecorder, mix [3]int, deadline time.Time, stop func() bool) {
	total := mix[0] + mix[1] + mix[2]
	for ctx.Err() == nil && time.Now().Before(deadline) && !stop() {
		switch r := c.rng.IntN(total); {
		case r < mix[0]:
			c.createOrDelete(ctx, rec)
		case r < mix[0]+mix[1]:
			c.changeRule(ctx, rec)
		default:
			c.deleteServer(ctx, rec)
		}
	}
}
