package e2e

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/testutil"
)

var (
	runDeployRe = regexp.MustCompile(`deployment URL\s+(http://127\.0\.0\.1:\d+/api/v1)\n`)
	runKeyRe    = regexp.MustCompile(`API key\s+(hearth_live_[A-Za-z0-9]{32})\n`)
	runMgmtRe   = regexp.MustCompile(`management API\s+(http://127\.0\.0\.1:\d+/v1)\s+\(token (hct_\w+)\)`)
	runCLIRe    = regexp.MustCompile(`export HEARTH_URL=(\S+) HEARTH_TOKEN=(\S+)\n\s+(\S+/hearth) server get demo`)
	runLinkRe   = regexp.MustCompile(`web console\s+(http://127\.0\.0\.1:\d+/console/sign-in/link\?code=\S+)\n`)
	runCurlRe   = regexp.MustCompile(`(?s)(curl -sN .*?\n.*?\n.*?'\n)`)
)

// `make run` (scripts/run.sh) shows the whole product: it prints the
// management URL and token, a loopback deployment_url, the model, a key
// issued through the management API and a curl line that works, and a
// one-time link that signs a browser in to the web console; Ctrl-C
// stops the control plane, hearthd and its Ollama. Ports and directories
// are the test's own.
func TestMakeRun(t *testing.T) {
	bin, err := ollamatest.FindBinary()
	if err != nil {
		t.Fatal(err)
	}
	port := func() string {
		addr, err := testutil.FreeAddr()
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(addr)
		return p
	}
	apiPort, controlPort := port(), port()
	env := []string{"HEARTH_OLLAMA_BIN=" + bin, "HEARTH_RUN_DIR=" + t.TempDir(), "HEARTH_BIN_DIR=" + t.TempDir(),
		"HEARTH_PORT=" + apiPort, "HEARTH_CONTROL_PORT=" + controlPort, "HEARTH_OLLAMA_PORT=" + port(),
		"HEARTH_METRICS_PORT=" + port(), "HEARTH_CONTROL_METRICS_PORT=" + port()}
	p := startProc(t, "make run", procSpec{argv: []string{"../scripts/run.sh"}, env: env, ready: []probe{{
		what: "the product running", within: 5 * time.Minute, check: func(p *proc) error {
			if !strings.Contains(p.logs(), "Ctrl-C stops") {
				return errors.New("not printed yet")
			}
			return nil
		}}}})
	out := p.logs()
	deploy, key, mgmt, curl := runDeployRe.FindStringSubmatch(out), runKeyRe.FindStringSubmatch(out),
		runMgmtRe.FindStringSubmatch(out), runCurlRe.FindStringSubmatch(out)
	if deploy == nil || key == nil || mgmt == nil || curl == nil || !strings.Contains(deploy[1], ":"+apiPort+"/") ||
		!strings.Contains(mgmt[1], ":"+controlPort+"/") || !strings.Contains(out, "model           hearth-tiny") {
		t.Fatalf("make run printed:\n%s", out)
	}
	// The printed curl line works as printed.
	got, err := exec.Command("bash", "-c", curl[1]).Output()
	if err != nil || !strings.Contains(string(got), `"model":"hearth-tiny"`) || !strings.HasSuffix(strings.TrimSpace(string(got)), "data: [DONE]") {
		t.Fatalf("the printed curl line: %v\n%s\n%s", err, curl[1], got)
	}
	// The server was made through the management API: it shows there,
	// running, with the printed deployment URL.
	var list struct {
		Data []struct {
			Status        string `json:"status"`
			DeploymentURL string `json:"deployment_url"`
		} `json:"data"`
	}
	c := &controlPlane{t: t, url: strings.TrimSuffix(mgmt[1], "/v1"), token: mgmt[2], client: http.DefaultClient}
	if code := c.api("GET", "/v1/servers", nil, &list); code != 200 || len(list.Data) != 1 ||
		list.Data[0].Status != "running" || list.Data[0].DeploymentURL != deploy[1] {
		t.Fatalf("the management API with the printed token: %d %+v", code, list)
	}
	// The printed hearth CLI line works.
	cli := runCLIRe.FindStringSubmatch(out)
	if cli == nil {
		t.Fatalf("no hearth CLI line in:\n%s", out)
	}
	cmd := exec.Command(cli[3], "server", "get", "demo", "-o", "json")
	cmd.Env = append(os.Environ(), "HEARTH_URL="+cli[1], "HEARTH_TOKEN="+cli[2], "HEARTH_CONTEXT=")
	shown, err := cmd.Output()
	var srv struct{ Status string }
	if err != nil || json.Unmarshal(shown, &srv) != nil || srv.Status != "running" {
		t.Fatalf("%s server get demo: %v\n%s", cli[3], err, shown)
	}

	// The printed console link signs a browser in, once.
	link := runLinkRe.FindStringSubmatch(out)
	if link == nil {
		t.Fatalf("no console link in:\n%s", out)
	}
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for i, want := range []int{http.StatusSeeOther, http.StatusNotFound} {
		resp, err := noFollow.Get(link[1])
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want || (i == 0 && (resp.Header.Get("Location") != "/console/servers" || len(resp.Cookies()) != 1)) {
			t.Fatalf("console link, use %d: %d %v", i+1, resp.StatusCode, resp.Header)
		}
	}

	// Ctrl-C stops everything.
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		t.Fatal("make run did not stop on Ctrl-C")
	}
	for _, port := range []string{apiPort, controlPort} {
		if conn, err := net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			conn.Close()
			t.Fatalf("port %s still served after Ctrl-C", port)
		}
	}
}
