package e2e

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/pgtest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// deploymentServer is the part of a server record the journey reads.
type deploymentServer struct {
	ID            string `json:"id"`
	Status        string `json:"status"`
	Model         string `json:"model"`
	DeploymentURL string `json:"deployment_url"`
	Enforcement   struct {
		Runtime struct {
			Status string  `json:"status"`
			Model  *string `json:"model"`
			Error  *string `json:"error"`
		} `json:"runtime"`
	} `json:"enforcement"`
}

// issuedKey is a created API key as the management API answers it.
type issuedKey struct {
	ID  string `json:"id"`
	Key string `json:"key"`
}

// journey is the control plane and the one node the customer's servers
// land on.
type journey struct {
	t    *testing.T
	ctl  *controlPlane
	node *hearthd
	ak   string // the node's managed authorized_keys
}

func (j *journey) waitStatus(id, want string, within time.Duration) deploymentServer {
	j.t.Helper()
	var s deploymentServer
	testutil.WaitFor(j.t, within, "server "+want, func() bool {
		s = deploymentServer{}
		j.ctl.api("GET", "/v1/servers/"+id, nil, &s)
		return s.Status == want
	})
	return s
}

func (j *journey) createServer(name, model string, sshKeys ...string) deploymentServer {
	j.t.Helper()
	var s deploymentServer
	body := map[string]any{"name": name, "chip": "cpu", "ram": 4, "storage": 20, "stack": "deployment",
		"model": model, "billing": "monthly", "ssh_key_ids": sshKeys}
	if code := j.ctl.api("POST", "/v1/servers", body, &s); code != http.StatusCreated {
		j.t.Fatalf("create server %s: %d", name, code)
	}
	return j.waitStatus(s.ID, "running", 60*time.Second)
}

func (j *journey) issueKey(serverID, name string) issuedKey {
	j.t.Helper()
	var k issuedKey
	if code := j.ctl.api("POST", "/v1/servers/"+serverID+"/api-keys", map[string]any{"name": name}, &k); code != http.StatusCreated ||
		!strings.HasPrefix(k.Key, "hearth_live_") {
		j.t.Fatalf("create API key: %d %+v", code, k)
	}
	return k
}

// sdk is the official OpenAI client for a deployment URL and key.
func sdk(url, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL(url), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// status is the HTTP status of a chat with the SDK (200 when it worked).
func chatStatus(t *testing.T, c openai.Client, model string) int {
	t.Helper()
	_, err := c.Chat.Completions.New(context.Background(), userParams(model, "hi", 4))
	var apiErr *openai.Error
	switch {
	case err == nil:
		return http.StatusOK
	case errors.As(err, &apiErr):
		return apiErr.StatusCode
	}
	t.Fatalf("chat: %v", err)
	return 0
}

// chatBoth chats with and without streaming and checks the model answered.
func chatBoth(t *testing.T, c openai.Client, model string) {
	t.Helper()
	ctx := context.Background()
	resp, err := c.Chat.Completions.New(ctx, userParams(model, "Hello there", 8))
	if err != nil {
		t.Fatalf("chat with %s: %v", model, err)
	}
	if resp.Model != model || resp.Usage.CompletionTokens != 8 || resp.Choices[0].Message.Content == "" {
		t.Fatalf("chat with %s: %+v", model, resp)
	}
	stream := c.Chat.Completions.NewStreaming(ctx, userParams(model, "Hello there", 8))
	var acc openai.ChatCompletionAccumulator
	for stream.Next() {
		ch := stream.Current()
		if ch.Model != model {
			t.Fatalf("chunk from model %q, want %s", ch.Model, model)
		}
		acc.AddChunk(ch)
	}
	if err := stream.Err(); err != nil || acc.Choices[0].Message.Content == "" {
		t.Fatalf("stream with %s: %v %+v", model, err, acc)
	}
}

func modelIDs(t *testing.T, c openai.Client) []string {
	t.Helper()
	page, err := c.Models.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range page.Data {
		ids = append(ids, m.ID)
	}
	return ids
}

// The customer's journey, with real processes: the control plane, a node
// in front of a real Ollama holding two tiny models (A and B), the
// official OpenAI SDK. A deployment of B with an SSH key turns running and
// answers at its deployment_url with a key the management API issued;
// PATCH switches it to A; a revoked key is refused; deleting the server
// wipes the tenant, so none of its keys — management-issued or made on the
// box — works for the next tenant of the node, whose own key does. A model
// that is neither present nor pullable ends failed, saying why. The
// control plane keeps its state in embedded Pebble, then in PostgreSQL.
func TestDeploymentJourney(t *testing.T) {
	t.Run("pebble", func(t *testing.T) { testDeploymentJourney(t, nil) })
	t.Run("postgres", func(t *testing.T) {
		testDeploymentJourney(t, []string{"--database-url", pgtest.Start(t).NewDatabase(t)})
	})
}

func testDeploymentJourney(t *testing.T, ctlArgs []string) {
	inst := ollamatest.Start(t)
	modelA, modelB := inst.Model, "hearth-tiny-b"
	ggufB := filepath.Join(t.TempDir(), "b.gguf")
	if err := tinymodel.WriteFile(ggufB, tinymodel.Options{Seed: 2}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := ollamatest.CreateModel(ctx, inst.Client(), modelB, ggufB); err != nil {
		t.Fatal(err)
	}

	// The deployment URL the control plane hands out is the node's own
	// loopback address.
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	deployURL := "http://" + addr + "/api/v1"
	j := &journey{t: t, ak: filepath.Join(t.TempDir(), "authorized_keys")}
	args := append(append([]string{}, noRateLimit...), "--public-deployment-url-template", deployURL, "--provision-timeout", "20s")
	j.ctl = startControl(t, append(args, ctlArgs...)...)
	j.node = startHearthd(t, hearthdOpts{stateDir: t.TempDir(), ready: true, args: []string{"--listen", addr,
		"--model", modelA, "--ollama-url", inst.URL, "--control-url", j.ctl.url, "--enrollment-token", j.ctl.enrollmentToken(1),
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40", "--authorized-keys-file", j.ak}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(j.ctl.nodes()) == 1 })

	// Tenant one: an SSH key, a deployment of B.
	pub := genPubKey(t, "tenant-one")
	sshKey := j.ctl.mustCreate("/v1/ssh-keys", map[string]any{"name": "laptop", "public_key": pub})
	srv := j.createServer("tenant-one", modelB, sshKey)
	if srv.DeploymentURL != deployURL || srv.Model != modelB || srv.Enforcement.Runtime.Model == nil || *srv.Enforcement.Runtime.Model != modelB {
		t.Fatalf("running server %+v", srv)
	}
	if b, err := os.ReadFile(j.ak); err != nil || !strings.Contains(string(b), strings.Fields(pub)[1]) {
		t.Fatalf("authorized_keys %q %v", b, err)
	}

	key := j.issueKey(srv.ID, "app")
	spare := j.issueKey(srv.ID, "spare")
	local := j.node.createKey("break-glass") // made on the box
	c := sdk(srv.DeploymentURL, key.Key)
	testutil.WaitFor(t, 10*time.Second, "the issued key works", func() bool { return chatStatus(t, c, modelB) == http.StatusOK })
	chatBoth(t, c, modelB)
	if ids := modelIDs(t, c); len(ids) != 1 || ids[0] != modelB {
		t.Fatalf("/models %v", ids)
	}
	if code := chatStatus(t, c, modelA); code != http.StatusNotFound {
		t.Fatalf("a model the deployment does not serve: %d", code)
	}

	// Switch to A.
	if code := j.ctl.api("PATCH", "/v1/servers/"+srv.ID, map[string]any{"model": modelA}, nil); code != http.StatusOK {
		t.Fatalf("PATCH model: %d", code)
	}
	j.waitStatus(srv.ID, "running", 60*time.Second)
	if ids := modelIDs(t, c); len(ids) != 1 || ids[0] != modelA {
		t.Fatalf("/models after the switch %v", ids)
	}
	chatBoth(t, c, modelA)

	// Revoke the key: refused.
	if code := j.ctl.api("DELETE", "/v1/servers/"+srv.ID+"/api-keys/"+key.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("revoke: %d", code)
	}
	testutil.WaitFor(t, 10*time.Second, "the revoked key refused", func() bool { return chatStatus(t, c, modelA) == http.StatusUnauthorized })
	if code := chatStatus(t, sdk(deployURL, spare.Key), modelA); code != http.StatusOK {
		t.Fatalf("the other key after a revoke: %d", code)
	}

	// Delete the server: the node wipes the tenant.
	if code := j.ctl.api("DELETE", "/v1/servers/"+srv.ID, nil, nil); code != http.StatusNoContent {
		t.Fatalf("delete: %d", code)
	}
	testutil.WaitFor(t, 30*time.Second, "server gone", func() bool {
		return j.ctl.api("GET", "/v1/servers/"+srv.ID, nil, nil) == http.StatusNotFound
	})

	// Tenant two on the same node: tenant one's keys stay dead, its own
	// works.
	srv2 := j.createServer("tenant-two", modelB)
	if j.ctl.nodes()[0].ServerID != srv2.ID {
		t.Fatal("tenant two is not on the node tenant one had")
	}
	if b, _ := os.ReadFile(j.ak); strings.Contains(string(b), strings.Fields(pub)[1]) {
		t.Fatal("tenant one's SSH key survived the wipe")
	}
	key2 := j.issueKey(srv2.ID, "app")
	c2 := sdk(srv2.DeploymentURL, key2.Key)
	testutil.WaitFor(t, 10*time.Second, "tenant two's key works", func() bool { return chatStatus(t, c2, modelB) == http.StatusOK })
	for name, k := range map[string]string{"revoked": key.Key, "never revoked": spare.Key, "made on the box": local} {
		if code := chatStatus(t, sdk(deployURL, k), modelB); code != http.StatusUnauthorized {
			t.Fatalf("tenant one's %s key for tenant two: %d", name, code)
		}
	}

	// A model neither present nor pullable (its registry refuses: no
	// traffic leaves the host): failed after the provision timeout, with
	// the reason, while B goes on serving.
	ghost := "127.0.0.1:9/no/such-model"
	if code := j.ctl.api("PATCH", "/v1/servers/"+srv2.ID, map[string]any{"model": ghost}, nil); code != http.StatusOK {
		t.Fatalf("PATCH to a missing model: %d", code)
	}
	failed := j.waitStatus(srv2.ID, "failed", 60*time.Second)
	rt := failed.Enforcement.Runtime
	if rt.Status != "failed" || rt.Error == nil || !strings.Contains(*rt.Error, "pull model "+ghost) || rt.Model == nil || *rt.Model != modelB {
		t.Fatalf("runtime of the failed server: status %s, error %v, model %v", rt.Status, deref(rt.Error), deref(rt.Model))
	}
	t.Logf("runtime error: %s", *rt.Error)
	if code := chatStatus(t, c2, modelB); code != http.StatusOK {
		t.Fatalf("B while the switch fails: %d", code)
	}
}

func deref(p *string) string {
	if p == nil {
		return "<null>"
	}
	return *p
}
