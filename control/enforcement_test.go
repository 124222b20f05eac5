package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/control"
	"github.com/hearthd/hearth/nodeapi"
)

type enforcementView struct {
	Status      string `json:"status"`
	Enforcement struct {
		DesiredRevision uint64 `json:"desired_revision"`
		Firewall        struct {
			Status          string  `json:"status"`
			AppliedRevision *uint64 `json:"applied_revision"`
			Error           *string `json:"error"`
		} `json:"firewall"`
		SSHKeys struct {
			Status          string  `json:"status"`
			AppliedRevision *uint64 `json:"applied_revision"`
			Error           *string `json:"error"`
		} `json:"ssh_keys"`
		APIKeys struct {
			Status          string  `json:"status"`
			AppliedRevision *uint64 `json:"applied_revision"`
			Error           *string `json:"error"`
		} `json:"api_keys"`
		Runtime    runtimeView `json:"runtime"`
		ReportedAt *string     `json:"reported_at"`
	} `json:"enforcement"`
}

func (e *env) enforcementOf(t *testing.T, id string) enforcementView {
	t.Helper()
	var v enforcementView
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &v)
	return v
}

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func rev(p *uint64) int64 {
	if p == nil {
		return -1
	}
	return int64(*p)
}

// TestServerShowsEnforcement checks that what a node reports about applying
// the firewall and SSH keys is visible on the server, errors included, and
// that the server becomes running only once both are applied.
func TestServerShowsEnforcement(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	pub, _ := newKey(t, "ed25519")
	kid := idOf(t, e.req("POST", "/v1/ssh-keys", map[string]any{"name": "me", "public_key": pub}).must(t, 201))
	var created enforcementView
	a := e.req("POST", "/v1/servers", serverBody("enf", func(m map[string]any) { m["ssh_key_ids"] = []string{kid} })).must(t, 201)
	a.decode(t, &created)
	id := idOf(t, a)
	// The server's revisions are its own: its creation is 1.
	if c := created.Enforcement; c.Firewall.Status != "pending" || c.SSHKeys.Status != "pending" || c.DesiredRevision != 1 ||
		c.Firewall.AppliedRevision != nil || c.ReportedAt != nil || c.Runtime.Healthy {
		t.Fatalf("created: %s", a.body)
	}

	ctx := context.Background()
	d, _, err := n.client.Desired(ctx, 0, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// The node's revision as the server shows it: counted from the
	// server's creation.
	shown := func(nodeRev uint64) int64 { return int64(nodeRev - d.Revision + created.Enforcement.DesiredRevision) }
	report := func(o nodeapi.Observed) {
		t.Helper()
		if err := n.client.ReportObserved(ctx, o); err != nil {
			t.Fatal(err)
		}
	}

	// Firewall applied, keys failed: visible, and not running.
	ok := applied(d, "")
	bad := ok
	bad.SSHKeysRevision, bad.SSHKeysError = 0, "write authorized_keys: disk full"
	report(bad)
	v := e.enforcementOf(t, id)
	if v.Status != "provisioning" || v.Enforcement.Firewall.Status != "applied" || rev(v.Enforcement.Firewall.AppliedRevision) != shown(d.Revision) ||
		v.Enforcement.Firewall.Error != nil || v.Enforcement.SSHKeys.Status != "failed" ||
		str(v.Enforcement.SSHKeys.Error) != "write authorized_keys: disk full" || v.Enforcement.SSHKeys.AppliedRevision != nil || v.Enforcement.ReportedAt == nil {
		t.Fatalf("keys failed: %+v", v)
	}
	if _, err := time.Parse(time.RFC3339, *v.Enforcement.ReportedAt); err != nil {
		t.Fatalf("reported_at %q", *v.Enforcement.ReportedAt)
	}
	// Keys applied, firewall failed: still not running.
	bad = ok
	bad.FirewallRevision, bad.FirewallError = 0, "nft: permission denied"
	report(bad)
	v = e.enforcementOf(t, id)
	if v.Status != "provisioning" || v.Enforcement.Firewall.Status != "failed" || str(v.Enforcement.Firewall.Error) != "nft: permission denied" ||
		v.Enforcement.SSHKeys.Status != "applied" {
		t.Fatalf("firewall failed: %+v", v)
	}
	// Both applied but the runtime is down: not running, and it says why.
	bad = ok
	bad.RuntimeHealthy, bad.RuntimeError, bad.RuntimeRevision, bad.RuntimeModel = false, "connection refused", 0, ""
	report(bad)
	v = e.enforcementOf(t, id)
	if v.Status != "provisioning" || v.Enforcement.Runtime.Healthy || str(v.Enforcement.Runtime.Error) != "connection refused" {
		t.Fatalf("runtime down: %+v", v)
	}
	// Everything applied: running.
	report(ok)
	v = e.enforcementOf(t, id)
	if v.Status != "running" || v.Enforcement.Firewall.Status != "applied" || v.Enforcement.SSHKeys.Status != "applied" ||
		!v.Enforcement.Runtime.Healthy || v.Enforcement.Runtime.Error != nil {
		t.Fatalf("converged: %+v", v)
	}

	// A new rule: a new desired revision, pending until reported; a failed
	// apply of it shows the error next to the revision still in force.
	e.req("POST", "/v1/servers/"+id+"/firewall-rules", map[string]any{"direction": "inbound", "protocol": "tcp",
		"port_range": "22", "action": "allow"}).must(t, 201)
	v = e.enforcementOf(t, id)
	if v.Enforcement.DesiredRevision != 2 || v.Enforcement.Firewall.Status != "pending" || v.Enforcement.SSHKeys.Status != "pending" {
		t.Fatalf("after a new rule: %+v", v)
	}
	d2, _, err := n.client.Desired(ctx, d.Revision, time.Second)
	if err != nil || d2.Revision != d.Revision+1 || shown(d2.Revision) != int64(v.Enforcement.DesiredRevision) {
		t.Fatalf("desired %+v %v", d2, err)
	}
	bad = applied(d2, "")
	bad.FirewallRevision, bad.FirewallError = d.Revision, "nft: table busy"
	report(bad)
	v = e.enforcementOf(t, id)
	if v.Status != "running" || v.Enforcement.Firewall.Status != "failed" || rev(v.Enforcement.Firewall.AppliedRevision) != shown(d.Revision) ||
		str(v.Enforcement.Firewall.Error) != "nft: table busy" || v.Enforcement.SSHKeys.Status != "applied" {
		t.Fatalf("rule failed: %+v", v)
	}
	// Lists carry it too.
	var list struct{ Data []enforcementView }
	e.req("GET", "/v1/servers", nil).must(t, 200).decode(t, &list)
	if len(list.Data) != 1 || list.Data[0].Enforcement.Firewall.Status != "failed" {
		t.Fatalf("list %+v", list.Data)
	}

	// The next tenant of the node does not inherit this server's reports.
	e.req("DELETE", "/v1/servers/"+id, nil).must(t, 204)
	wd, _, err := n.client.Desired(ctx, d2.Revision, time.Second)
	if err != nil || !wd.Wipe {
		t.Fatalf("wipe %+v %v", wd, err)
	}
	report(applied(wd, ""))
	bad = applied(wd, "")
	bad.SSHKeysError = "left over from the previous tenant"
	report(bad)
	next := idOf(t, e.req("POST", "/v1/servers", serverBody("enf-next")).must(t, 201))
	v = e.enforcementOf(t, next)
	if v.Enforcement.Firewall.Status != "pending" || v.Enforcement.SSHKeys.Status != "pending" || v.Enforcement.SSHKeys.Error != nil ||
		v.Enforcement.Firewall.AppliedRevision != nil || v.Enforcement.ReportedAt != nil {
		t.Fatalf("new tenant: %+v", v)
	}
}

// TestSettledReportsWriteNothing: the periodic report of a node whose state
// did not change is not written, yet the server shows its time at once,
// and the sweep persists it so a restart keeps it.
func TestSettledReportsWriteNothing(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("settled")).must(t, 201))
	d := n.desired(t, 0)
	n.report(t, applied(d, "192.0.2.1"))
	e.wantStatus(t, id, "running", "after the report")
	first := str(e.enforcementOf(t, id).Enforcement.ReportedAt)

	writes := 0
	counting := control.CountWrites(e.srv, func() { writes++ })
	defer counting()
	clk.add(10 * time.Second)
	n.report(t, applied(d, "192.0.2.1"))
	if writes != 0 {
		t.Fatalf("an unchanged report made %d writes", writes)
	}
	second := str(e.enforcementOf(t, id).Enforcement.ReportedAt)
	if second == first {
		t.Fatalf("reported_at stayed %s after a later report", first)
	}
	e.sweep()
	if writes == 0 {
		t.Fatal("the sweep did not persist the report time")
	}
	e.restart()
	if got := str(e.enforcementOf(t, id).Enforcement.ReportedAt); got != second {
		t.Fatalf("after a restart reported_at %s, want %s", got, second)
	}
}

// TestUsageReportsMoveReportedAt: a busy node's every report carries new
// usage and nothing else new; its server still shows each report's time.
func TestUsageReportsMoveReportedAt(t *testing.T) {
	e, clk := newClockEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("busy")).must(t, 201))
	key := idOf(t, e.req("POST", "/v1/servers/"+id+"/api-keys", map[string]any{"name": "app"}).must(t, 201))
	d := converge(t, n, "192.0.2.1")
	e.wantStatus(t, id, "running", "after the report")
	first := str(e.enforcementOf(t, id).Enforcement.ReportedAt)
	clk.add(10 * time.Second)
	o := applied(d, "192.0.2.1")
	o.Usage = []nodeapi.KeyUsage{{ID: key, Requests: 1}}
	n.report(t, o)
	second := str(e.enforcementOf(t, id).Enforcement.ReportedAt)
	if want := clk.now().UTC().Format(time.RFC3339); second != want {
		t.Fatalf("reported_at %s after a report with new usage at %s (before it: %s)", second, want, first)
	}
	e.sweep()
	e.restart()
	if got := str(e.enforcementOf(t, id).Enforcement.ReportedAt); got != second {
		t.Fatalf("after a restart reported_at %s, want %s", got, second)
	}
}

// TestServerShowsModelInfo: what the node's runtime says of the served
// model (context length, capabilities) is on the server; a report with too
// many capabilities or a negative context is refused and changes nothing.
func TestServerShowsModelInfo(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("info")).must(t, 201))
	d := n.desired(t, 0)
	var v struct {
		Enforcement struct {
			Runtime struct {
				ContextLength *int     `json:"context_length"`
				Capabilities  []string `json:"capabilities"`
			} `json:"runtime"`
		} `json:"enforcement"`
	}
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &v)
	if v.Enforcement.Runtime.ContextLength != nil || v.Enforcement.Runtime.Capabilities != nil {
		t.Fatalf("before any report: %+v", v)
	}
	o := applied(d, "192.0.2.3")
	o.RuntimeContextLength, o.RuntimeCapabilities = 2048, []string{"completion", "tools"}
	n.report(t, o)
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &v)
	if r := v.Enforcement.Runtime; r.ContextLength == nil || *r.ContextLength != 2048 || len(r.Capabilities) != 2 || r.Capabilities[1] != "tools" {
		t.Fatalf("after the report: %+v", r)
	}
	for name, bad := range map[string]func(*nodeapi.Observed){
		"runtime_capabilities":   func(o *nodeapi.Observed) { o.RuntimeCapabilities = make([]string, 33) },
		"runtime_context_length": func(o *nodeapi.Observed) { o.RuntimeContextLength = -1 },
	} {
		o2 := o
		bad(&o2)
		err := n.client.ReportObserved(context.Background(), o2)
		var ne *nodeapi.Error
		if !errors.As(err, &ne) || ne.Status != 400 || !strings.Contains(ne.Message, name) {
			t.Errorf("%s: %v, want a 400 naming it", name, err)
		}
	}
	e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &v)
	if r := v.Enforcement.Runtime; r.ContextLength == nil || *r.ContextLength != 2048 || len(r.Capabilities) != 2 {
		t.Fatalf("after refused reports: %+v", r)
	}
}

// TestServerShowsRuntimeHealth: the runtime's health (healthy, degraded,
// restarting) and the node's last restart of it, time and reason, are on
// the server as the node reports them; a node that does not report a
// state is healthy or degraded as runtime_healthy says; a restart from
// before the server was created is not its; a report with an unknown
// state or a restart without its time is refused and changes nothing.
func TestServerShowsRuntimeHealth(t *testing.T) {
	e := newEnv(t, nil)
	n := e.enroll(hwM4)
	id := idOf(t, e.req("POST", "/v1/servers", serverBody("health")).must(t, 201))
	d := n.desired(t, 0)
	type rt struct {
		Health      string `json:"health"`
		LastRestart *struct {
			At     string `json:"at"`
			Reason string `json:"reason"`
		} `json:"last_restart"`
	}
	get := func() rt {
		var v struct {
			Enforcement struct {
				Runtime rt `json:"runtime"`
			} `json:"enforcement"`
		}
		e.req("GET", "/v1/servers/"+id, nil).must(t, 200).decode(t, &v)
		return v.Enforcement.Runtime
	}
	if r := get(); r.Health != "degraded" || r.LastRestart != nil {
		t.Fatalf("before any report: %+v", r)
	}
	o := applied(d, "192.0.2.4")
	n.report(t, o) // an older node: no state
	if r := get(); r.Health != "healthy" {
		t.Fatalf("runtime_healthy without a state: %+v", r)
	}
	at := time.Now().UTC().Truncate(time.Second).Add(time.Hour)
	o.RuntimeHealthy, o.RuntimeState = false, nodeapi.RuntimeRestarting
	o.RuntimeLastRestart = &nodeapi.RuntimeRestart{At: at, Reason: "wedged: nothing came back for 10s"}
	n.report(t, o)
	if r := get(); r.Health != "restarting" || r.LastRestart == nil || r.LastRestart.At != at.Format(time.RFC3339) ||
		r.LastRestart.Reason != "wedged: nothing came back for 10s" {
		t.Fatalf("restarting: %+v", r)
	}
	o.RuntimeHealthy, o.RuntimeState = true, nodeapi.RuntimeHealthy
	n.report(t, o)
	if r := get(); r.Health != "healthy" || r.LastRestart == nil {
		t.Fatalf("after the restart: %+v", r)
	}
	for name, bad := range map[string]func(*nodeapi.Observed){
		"runtime_state":        func(o *nodeapi.Observed) { o.RuntimeState = "fine" },
		"runtime_last_restart": func(o *nodeapi.Observed) { o.RuntimeLastRestart = &nodeapi.RuntimeRestart{Reason: "x"} },
	} {
		o2 := o
		bad(&o2)
		err := n.client.ReportObserved(context.Background(), o2)
		var ne *nodeapi.Error
		if !errors.As(err, &ne) || ne.Status != 400 || !strings.Contains(ne.Message, name) {
			t.Errorf("%s: %v, want a 400 naming it", name, err)
		}
	}
	// A restart older than the server belongs to the node's past.
	o.RuntimeLastRestart = &nodeapi.RuntimeRestart{At: time.Unix(1e9, 0), Reason: "old"}
	n.report(t, o)
	if r := get(); r.Health != "healthy" || r.LastRestart != nil {
		t.Fatalf("a restart from before the server: %+v", r)
	}
}
