package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/testutil"
)

// TestCustomerJourneyWithTheCLI is the README's "Manage your deployments"
// session with real processes: the hearth CLI against the control plane,
// a hearthd node serving the model with a real Ollama, and the official
// OpenAI SDK using the API key the CLI printed. The client package checks
// what the CLI did.
func TestCustomerJourneyWithTheCLI(t *testing.T) {
	ctl := startControl(t)
	inst := shared.ollama.Get(t)
	node := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL,
		"--control-url", ctl.url, "--enrollment-token", ctl.enrollmentToken(1),
		"--node-chip", "cpu", "--node-ram", "8", "--node-storage", "40"}})
	testutil.WaitFor(t, 30*time.Second, "node enrolled", func() bool { return len(ctl.nodes()) == 1 })
	c, err := client.New(ctl.url, client.WithToken(ctl.token))
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	cli := hearthCLI{t: t, bin: binary(t, "hearth"), env: []string{"HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HEARTH_URL=", "HEARTH_TOKEN=", "HEARTH_CONTEXT=", "HEARTH_CONFIG="}}

	// hearth context create, the token piped in.
	cli.stdin = ctl.token + "\n"
	cli.run("context", "create", "e2e", "--url", ctl.url)
	cli.stdin = ""
	os.MkdirAll(filepath.Join(home, ".ssh"), 0o700)
	pub := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGVgrKUnB2Bm+Ec7FNvhMjIjW1GiTqnPWhCrE5hyeWpL me@laptop"
	os.WriteFile(filepath.Join(home, ".ssh", "id_ed25519.pub"), []byte(pub+"\n"), 0o644)
	cli.run("ssh-key", "add", "--public-key-from-file", "~/.ssh/id_ed25519.pub")

	var srv client.Server
	cli.json(&srv, "server", "create", "--name", "chat", "--chip", "cpu", "--ram", "8", "--storage", "40",
		"--model", inst.Model, "--ssh-key", "me@laptop", "--wait", "--wait-timeout", "2m")
	if srv.Status != client.StatusRunning || srv.Model != inst.Model || len(srv.SSHKeyIDs) != 1 {
		t.Fatalf("server create --wait: %+v", srv)
	}

	var key client.CreatedAPIKey
	cli.json(&key, "api-key", "create", "--server", "chat", "--name", "my-app")
	if key.Key == nil {
		t.Fatalf("api-key create: no key: %+v", key)
	}
	// The key reaches the node within a second of its creation.
	testutil.WaitFor(t, 5*time.Second, "the API key applied on the node", func() bool {
		s, err := c.GetServer(context.Background(), srv.ID)
		return err == nil && s.Enforcement.APIKeys.Status == client.EnforcementApplied
	})
	ai := node.client(*key.Key)
	resp, err := ai.Chat.Completions.New(context.Background(), userParams(inst.Model, "Hello", 4))
	if err != nil || len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
		t.Fatalf("chat with the CLI's key: %+v %v", resp, err)
	}
	testutil.WaitFor(t, 30*time.Second, "usage reported", func() bool {
		k, err := c.GetAPIKey(context.Background(), srv.ID, key.ID)
		return err == nil && k.Requests == 1 && k.CompletionTokens == 4 && k.LastUsedAt != nil
	})
	if out := cli.run("api-key", "list", "--server", "chat", "-o", "table"); strings.Contains(out, *key.Key) {
		t.Fatalf("api-key list shows the secret:\n%s", out)
	}

	cli.run("api-key", "delete", key.ID, "--server", "chat")
	testutil.WaitFor(t, 5*time.Second, "the deleted key refused", func() bool {
		_, err := ai.Chat.Completions.New(context.Background(), userParams(inst.Model, "Hello", 1))
		var apiErr *openai.Error
		return errors.As(err, &apiErr) && apiErr.StatusCode == 401
	})

	cli.run("server", "delete", "chat", "--wait", "--wait-timeout", "1m")
	if _, err := c.GetServer(context.Background(), srv.ID); !client.IsNotFound(err) {
		t.Fatalf("after delete --wait: %v", err)
	}
}

// hearthCLI runs the hearth binary with a home of its own.
type hearthCLI struct {
	t     *testing.T
	bin   string
	env   []string
	stdin string
}

// run runs hearth and returns its stdout; it must exit 0.
func (h hearthCLI) run(args ...string) string {
	h.t.Helper()
	cmd := exec.Command(h.bin, args...)
	cmd.Env = append(os.Environ(), h.env...)
	cmd.Stdin = strings.NewReader(h.stdin)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		h.t.Fatalf("hearth %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return string(out)
}

// json runs hearth with -o json and decodes its stdout into v.
func (h hearthCLI) json(v any, args ...string) {
	h.t.Helper()
	out := h.run(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		h.t.Fatalf("hearth %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}
