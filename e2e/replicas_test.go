package e2e

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/hearthd/hearth/bench"
	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/internal/testutil"
)

// TestReplicasSurviveAKill: two control-plane processes on one PostgreSQL
// database behave as one. 1 000 SSH-key creates go through both, each with
// an Idempotency-Key and retried on the other replica until answered;
// replica A is killed with SIGKILL in the middle. Every answered create is
// there, none twice; and a real hearthd given both URLs moves to B and
// runs a server created through B.
func TestReplicasSurviveAKill(t *testing.T) {
	db := pgtest.Start(t)
	args := append([]string{"--database-url", db.NewDatabase(t)}, noRateLimit...)
	a := startControl(t, args...)
	b := startControl(t, args...)
	mock := startMockRuntime(t, "node-model", bench.MockConfig{Tokens: 4})
	startHearthd(t, hearthdOpts{stateDir: filepath.Join(t.TempDir(), "state"), args: []string{
		"--metrics-listen", "", "--model", "node-model", "--ollama-url", mock.URL,
		"--control-url", a.url + "," + b.url, "--enrollment-token", a.enrollmentToken(1),
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40"}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(b.nodes()) == 1 })

	const creates, workers = 1000, 8
	var answered, failovers atomic.Int64
	killed := make(chan struct{})
	ids := make([]string, creates)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < creates; i += workers {
				ids[i] = createUntilAnswered(t, []*controlPlane{a, b}, i%2, fmt.Sprintf("idem-%d", i), sshKeyBody(t, i), &failovers)
				if answered.Add(1) == creates/4 {
					a.kill()
					close(killed)
				}
			}
		}()
	}
	wg.Wait()
	<-killed
	if failovers.Load() == 0 {
		t.Fatal("no create had to move to the surviving replica: the kill was not exercised")
	}

	listed := map[string]int{}
	cursor := ""
	for {
		var page struct {
			Data       []struct{ ID string }
			NextCursor *string `json:"next_cursor"`
		}
		path := "/v1/ssh-keys?limit=100"
		if cursor != "" {
			path += "&cursor=" + cursor
		}
		if code := b.api("GET", path, nil, &page); code != http.StatusOK {
			t.Fatalf("list keys: %d", code)
		}
		for _, k := range page.Data {
			listed[k.ID]++
		}
		if page.NextCursor == nil {
			break
		}
		cursor = *page.NextCursor
	}
	if len(listed) != creates {
		t.Errorf("%d keys listed after %d answered creates", len(listed), creates)
	}
	for i, id := range ids {
		if listed[id] != 1 {
			t.Fatalf("create %d answered %s, listed %d times", i, id, listed[id])
		}
	}

	// The node now only reaches B.
	var srv struct{ ID, Status string }
	body := map[string]any{"name": "after-kill", "chip": "cpu", "ram": 4, "storage": 20, "stack": "deployment",
		"model": "node-model", "billing": "monthly"}
	if code := b.api("POST", "/v1/servers", body, &srv); code != http.StatusCreated {
		t.Fatalf("create server through B: %d", code)
	}
	testutil.WaitFor(t, 60*time.Second, "the server running through B", func() bool {
		b.api("GET", "/v1/servers/"+srv.ID, nil, &srv)
		return srv.Status == "running"
	})
}

// createUntilAnswered posts body to the replicas, starting with first and
// moving to the other whenever one gives no answer (killed) or a 5xx, with
// the same Idempotency-Key each time, and returns the created ID.
// failovers counts the tries that had to move to the other replica.
func createUntilAnswered(t *testing.T, replicas []*controlPlane, first int, key string, body any, failovers *atomic.Int64) string {
	raw, _ := json.Marshal(body)
	for try := 0; try < 50; try++ {
		c := replicas[(first+try)%len(replicas)]
		req, _ := http.NewRequest("POST", c.url+"/v1/ssh-keys", bytes.NewReader(raw))
		req.Header.Set("Authorization", "Bearer "+replicas[1].token)
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			failovers.Add(1)
			continue
		}
		var out struct{ ID string }
		err = json.NewDecoder(resp.Body).Decode(&out)
		resp.Body.Close()
		if resp.StatusCode >= 500 {
			failovers.Add(1)
			continue
		}
		if resp.StatusCode != http.StatusCreated || err != nil || out.ID == "" {
			t.Errorf("create %s: %d %v", key, resp.StatusCode, err)
			return ""
		}
		return out.ID
	}
	t.Errorf("create %s: no replica answered", key)
	return ""
}

func sshKeyBody(t *testing.T, i int) map[string]any {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"name": fmt.Sprintf("key-%d", i), "public_key": strings.TrimSpace(string(ssh.MarshalAuthorizedKey(k)))}
}
