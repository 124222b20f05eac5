package e2e

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/testutil"
)

// modelsStatus is the status of GET /models with key: the cheapest
// authenticated request.
func modelsStatus(t *testing.T, url, key string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/models", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// until polls GET /models with key every millisecond until it answers
// want, and returns how long that took; the test fails after limit.
func until(t *testing.T, url, key string, want int, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for modelsStatus(t, url, key) != want {
		if time.Since(start) > limit {
			t.Fatalf("key not %d within %v", want, limit)
		}
		time.Sleep(time.Millisecond)
	}
	return time.Since(start)
}

func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// A key created through the management API works on the deployment, and a
// deleted or expired one is refused, within a second of the API's answer
// (the long-poll wakes on commit; the node swaps its key index). The test
// measures 50 creates and 50 deletes and logs p50/p99 (BENCHMARKS.md); it
// asserts only a generous bound.
func TestAPIKeyPropagation(t *testing.T) {
	const n, bound = 50, 5 * time.Second
	e := startEnrolledNode(t)
	srv := e.ctl.mustCreate("/v1/servers", map[string]any{"name": "keys", "chip": "cpu", "ram": 4, "storage": 20,
		"stack": "deployment", "model": "node-model", "billing": "monthly"})
	testutil.WaitFor(t, 30*time.Second, "server running", func() bool {
		var s struct{ Status string }
		e.ctl.api("GET", "/v1/servers/"+srv, nil, &s)
		return s.Status == "running"
	})
	url := e.node.url

	keys := make([]issuedKey, n)
	created := make([]time.Duration, n)
	for i := range n {
		if code := e.ctl.api("POST", "/v1/servers/"+srv+"/api-keys", map[string]any{"name": "k"}, &keys[i]); code != http.StatusCreated {
			t.Fatalf("create key %d: %d", i, code)
		}
		created[i] = until(t, url, keys[i].Key, http.StatusOK, bound)
	}
	// The node lists them as managed, beside the local keys.
	if list := e.node.keysCLI("list"); strings.Count(list, " managed ") != n {
		t.Fatalf("hearthd keys list shows %d managed keys, want %d:\n%s", strings.Count(list, " managed "), n, list)
	}
	deleted := make([]time.Duration, n)
	for i, k := range keys {
		if code := e.ctl.api("DELETE", "/v1/servers/"+srv+"/api-keys/"+k.ID, nil, nil); code != http.StatusNoContent {
			t.Fatalf("delete key %d: %d", i, code)
		}
		deleted[i] = until(t, url, k.Key, http.StatusUnauthorized, bound)
	}
	t.Logf("key works after create: p50 %v p99 %v max %v", percentile(created, .5), percentile(created, .99), slices.Max(created))
	t.Logf("key refused after delete: p50 %v p99 %v max %v", percentile(deleted, .5), percentile(deleted, .99), slices.Max(deleted))

	// An expiring key is refused by the node at its expires_at, without a
	// new revision.
	exp := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	var k issuedKey
	if code := e.ctl.api("POST", "/v1/servers/"+srv+"/api-keys", map[string]any{"name": "brief",
		"expires_at": exp.UTC().Format(time.RFC3339)}, &k); code != http.StatusCreated {
		t.Fatalf("create expiring key: %d", code)
	}
	until(t, url, k.Key, http.StatusOK, bound)
	time.Sleep(time.Until(exp))
	late := until(t, url, k.Key, http.StatusUnauthorized, bound)
	t.Logf("key refused %v after its expires_at", late)
}
