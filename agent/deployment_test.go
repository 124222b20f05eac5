package agent_test

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/hearthd/hearth/control"
)

// serverView is the part of a server record these tests read.
type serverView struct {
	Status      string
	Model       *string
	Enforcement struct {
		DesiredRevision uint64 `json:"desired_revision"`
		APIKeys         struct {
			Status          string
			AppliedRevision *uint64 `json:"applied_revision"`
		} `json:"api_keys"`
		Runtime struct {
			Status   string
			Model    *string
			Error    *string
			Progress *struct {
				Status           string
				Completed, Total int64
			}
			AppliedRevision *uint64 `json:"applied_revision"`
		}
		ReportedAt *string `json:"reported_at"`
	}
}

func str(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}

func (c *ctlPlane) server(id string) serverView {
	c.t.Helper()
	var v serverView
	if code := c.api("GET", "/v1/servers/"+id, nil, &v); code != 200 {
		c.t.Fatalf("GET server: %d", code)
	}
	return v
}

// The node serves the model the customer ordered: running only once it
// does (a pull's progress visible meanwhile), a model change runs through
// updating, API keys arrive as hashes and their usage goes back, a model
// that cannot be served fails with the reason, and the delete wipes the
// tenant's keys and usage.
func TestNodeAgentServesTheOrderedModelAndKeys(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctl := startCtlWith(t, func(c *control.Config) { c.ProvisionTimeout = 5 * time.Second })
		run := startAgent(t, nodeConfig(t, ctl), nil)
		synctest.Wait() // the default model served
		run.models.set(func(f *fakeModels) { f.hold = make(chan struct{}) })

		srv := ctl.createServer(map[string]any{"stack": "deployment", "model": "b"})
		<-run.models.pulling
		within(t, time.Second, "the pull's progress shown", func() bool {
			p := ctl.server(srv).Enforcement.Runtime.Progress
			return p != nil && p.Status == "pulling 6a0746a1ec1a" && p.Completed == 50 && p.Total == 100
		})
		if v := ctl.server(srv); v.Status != "provisioning" || str(v.Enforcement.Runtime.Model) != defaultModel {
			t.Fatalf("while pulling: %+v", v)
		}
		run.models.set(func(f *fakeModels) { close(f.hold); f.hold = nil })
		within(t, time.Second, "running once b is served", func() bool { return ctl.serverStatus(srv) == "running" })
		v := ctl.server(srv)
		if rt := v.Enforcement.Runtime; rt.Status != "applied" || str(rt.Model) != "b" || rt.Progress != nil || rt.Error != nil {
			t.Fatalf("runtime once running: %+v", rt)
		}

		// An API key: its hash reaches the node at once (no time passes),
		// and its use comes back on the key.
		var key struct{ ID, Key string }
		if code := ctl.api("POST", "/v1/servers/"+srv+"/api-keys", map[string]any{"name": "app"}, &key); code != 201 {
			t.Fatalf("create API key: %d", code)
		}
		synctest.Wait()
		run.apiKeys.mu.Lock()
		got := slices.Clone(run.apiKeys.keys)
		run.apiKeys.mu.Unlock()
		sum := sha256.Sum256([]byte(key.Key))
		if len(got) != 1 || got[0].ID != key.ID || got[0].Hash != hex.EncodeToString(sum[:]) {
			t.Fatalf("managed keys on the node %+v", got)
		}
		// The new revision changed only keys: the runtime is in force at
		// it at once.
		within(t, time.Second, "API keys and runtime applied", func() bool {
			e := ctl.server(srv).Enforcement
			return e.APIKeys.Status == "applied" && e.Runtime.AppliedRevision != nil && *e.Runtime.AppliedRevision == e.DesiredRevision
		})
		run.apiKeys.use(key.ID)
		run.apiKeys.use(key.ID)
		within(t, time.Second, "usage reported", func() bool {
			var k struct{ Requests uint64 }
			ctl.api("GET", "/v1/servers/"+srv+"/api-keys/"+key.ID, nil, &k)
			return k.Requests == 2
		})

		// A model change: updating until the new model answers.
		run.models.set(func(f *fakeModels) { f.hold = make(chan struct{}) })
		if code := ctl.api("PATCH", "/v1/servers/"+srv, map[string]any{"model": "tiny"}, nil); code != 200 {
			t.Fatalf("PATCH: %d", code)
		}
		pass(time.Second)
		if s := ctl.serverStatus(srv); s != "updating" {
			t.Fatalf("status %q while switching", s)
		}
		run.models.set(func(f *fakeModels) { close(f.hold); f.hold = nil })
		within(t, time.Second, "running on tiny", func() bool { return ctl.serverStatus(srv) == "running" })
		if m := str(ctl.server(srv).Enforcement.Runtime.Model); m != "tiny" {
			t.Fatalf("serving %s", m)
		}

		// A model neither present nor pullable: failed after the provision
		// timeout, with the reason; the node keeps serving tiny.
		run.models.set(func(f *fakeModels) { f.missing["ghost"] = true })
		ctl.api("PATCH", "/v1/servers/"+srv, map[string]any{"model": "ghost"}, nil)
		within(t, 6*time.Second, "failed", func() bool { return ctl.serverStatus(srv) == "failed" })
		rt := ctl.server(srv).Enforcement.Runtime
		if rt.Status != "failed" || !strings.Contains(str(rt.Error), "pull model ghost") || str(rt.Model) != "tiny" {
			t.Fatalf("runtime of a failed model: %+v", rt)
		}
		if run.models.Served() != "tiny" {
			t.Fatalf("serving %s after a failed switch", run.models.Served())
		}

		// Deleting the server wipes the tenant's keys and usage; the node
		// goes back to its default model.
		if code := ctl.api("DELETE", "/v1/servers/"+srv, nil, nil); code != 204 {
			t.Fatalf("delete: %d", code)
		}
		within(t, time.Second, "server gone", func() bool { return ctl.serverStatus(srv) == "gone" })
		if run.apiKeys.Wipes() != 1 || len(run.apiKeys.IDs()) != 0 || len(run.apiKeys.Usage()) != 0 {
			t.Fatalf("after the wipe: %d wipes, keys %v", run.apiKeys.Wipes(), run.apiKeys.IDs())
		}
		within(t, time.Second, "the default model served again", func() bool { return run.models.Served() == defaultModel })
	})
}
