package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/proctest"
)

// nodeDir holds the scripts driving the official OpenAI Node SDK, its
// package.json and lock file, and (after npm ci) node_modules.
const nodeDir = "node"

// nodeMaxBodyBytes is the --max-body-bytes of the hearthd the scripts talk
// to; body413.mjs sends far more.
const nodeMaxBodyBytes = 1 << 20

// nodeScriptTimeout bounds one script: a few short generations.
const nodeScriptTimeout = 3 * time.Minute

// TestNodeSDK runs every e2e/node/*.mjs with the official openai npm
// package against a real hearthd in front of a real Ollama, per Ollama
// version: `node <script>` in e2e/node with HEARTH_BASE_URL,
// HEARTH_API_KEY, HEARTH_MODEL, HEARTH_OLLAMA_VERSION and
// HEARTH_MAX_BODY_BYTES set; a script passes by exiting 0.
func TestNodeSDK(t *testing.T) {
	node := nodeSetup(t)
	scripts, err := filepath.Glob(filepath.Join(nodeDir, "*.mjs"))
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts in e2e/%s (%v)", nodeDir, err)
	}
	shared.ollama.ForEach(t, func(t *testing.T, inst *ollamatest.Instance) {
		// Four slots: the scripts ask for up to four choices at once.
		h := startHearthd(t, hearthdOpts{ready: true, args: []string{"--model", inst.Model, "--ollama-url", inst.URL,
			"--max-body-bytes", strconv.Itoa(nodeMaxBodyBytes), "--max-concurrent", "4"}})
		key := h.createKey("node-sdk") // through the admin socket of the running daemon
		env := []string{
			"HEARTH_BASE_URL=" + h.url,
			"HEARTH_API_KEY=" + key,
			"HEARTH_MODEL=" + inst.Model,
			"HEARTH_OLLAMA_VERSION=" + inst.Version,
			"HEARTH_MAX_BODY_BYTES=" + strconv.Itoa(nodeMaxBodyBytes),
		}
		for _, script := range scripts {
			name := filepath.Base(script)
			t.Run(strings.TrimSuffix(name, ".mjs"), func(t *testing.T) { runNodeScript(t, node, name, env, key) })
		}
	})
}

// nodeSetup returns the node binary, failing the test with the command to
// run when node is missing or node_modules is not what the lock file pins.
func nodeSetup(t *testing.T) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is not on PATH: run scripts/ensure-deps.sh as root (or `apt-get install nodejs npm`), then `cd e2e/%s && npm ci`", nodeDir)
	}
	if err := nodeModulesMatchLock(); err != nil {
		t.Fatalf("%v: run `cd e2e/%s && npm ci` (scripts/ensure-deps.sh does it for make test)", err, nodeDir)
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		t.Fatalf("%s --version: %v", node, err)
	}
	t.Logf("node %s", bytes.TrimSpace(out))
	return node
}

// runNodeScript runs one script to completion (bounded by
// nodeScriptTimeout) and fails the test with its output unless it exits 0.
// key must not appear in the output.
func runNodeScript(t *testing.T, node, script string, env []string, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), nodeScriptTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 5 * time.Second
	done, err := proctest.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	<-done
	// The output goes into the test log with the key blanked out.
	outs := [2]string{stdout.String(), stderr.String()}
	for i, o := range outs {
		if strings.Contains(o, key) {
			t.Errorf("%s printed the API key", script)
			outs[i] = strings.ReplaceAll(o, key, "<HEARTH_API_KEY>")
		}
	}
	if st := cmd.ProcessState; !st.Success() {
		why := st.String()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			why = "killed after " + nodeScriptTimeout.String()
		}
		t.Fatalf("node %s: %s\nstdout:\n%s\nstderr:\n%s", script, why, outs[0], outs[1])
	}
	if outs[1] != "" {
		t.Logf("%s stderr:\n%s", script, outs[1])
	}
}

// nodeModulesMatchLock says whether every package the lock file pins is
// installed at its version: a stale node_modules would test another SDK.
func nodeModulesMatchLock() error {
	var lock struct {
		Packages map[string]struct {
			Version  string
			Optional bool // e.g. for another platform: may be missing
		} `json:"packages"`
	}
	b, err := os.ReadFile(filepath.Join(nodeDir, "package-lock.json"))
	if err == nil {
		err = json.Unmarshal(b, &lock)
	}
	if err != nil {
		return fmt.Errorf("package-lock.json: %w", err)
	}
	for path, want := range lock.Packages {
		if !strings.HasPrefix(path, "node_modules/") {
			continue // "" is the project itself
		}
		var got struct{ Version string }
		b, err := os.ReadFile(filepath.Join(nodeDir, path, "package.json"))
		if err == nil {
			err = json.Unmarshal(b, &got)
		}
		if errors.Is(err, fs.ErrNotExist) && want.Optional {
			continue
		}
		if err != nil {
			return fmt.Errorf("npm package %s is not installed (%w)", path, err)
		}
		if got.Version != want.Version {
			return fmt.Errorf("npm package %s is %s, the lock file says %s", path, got.Version, want.Version)
		}
	}
	return nil
}
