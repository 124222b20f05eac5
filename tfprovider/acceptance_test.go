package tfprovider

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/config"
	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"

	"github.com/hearthd/hearth/internal/controltest"
	"github.com/hearthd/hearth/internal/ollamatest"
	"github.com/hearthd/hearth/internal/proctest"
	"github.com/hearthd/hearth/internal/testutil"
	"github.com/hearthd/hearth/llm/tinymodel"
)

// example is the configuration docs/terraform shows first: a deployment
// with its SSH key, firewall rules and API key.
const example = "examples/provider/provider.tf"

// The provider against the real thing: hearth-control and an enrolled
// hearthd in front of a real Ollama holding two tiny models, driven by
// the documented example. Applying it creates all four kinds of
// resource, and the deployment serves the model at deployment_url to the
// key Terraform got; the plan is then empty; a new model is an in-place
// update after which the node serves it; every resource imports to the
// state it has; destroying leaves nothing in the API.
func TestAcceptance(t *testing.T) {
	useTerraform(t)
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
	addr, err := testutil.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	deployURL := "http://" + addr + "/api/v1"
	ctl, c := controlPlane(t, "--public-deployment-url-template", deployURL)
	ak := filepath.Join(t.TempDir(), "authorized_keys")
	startHearthd(t, ctl, addr, "--model", modelA, "--ollama-url", inst.URL, "--authorized-keys-file", ak)

	pub := testPublicKey(t, "alice@laptop")
	vars := func(model string) config.Variables {
		return config.Variables{"public_key": config.StringVariable(pub + "\n"), "model": config.StringVariable(model)}
	}
	var serverID string
	resources := []string{"hearth_ssh_key.laptop", "hearth_server.chat", "hearth_firewall_rule.api",
		"hearth_firewall_rule.ssh", "hearth_api_key.app"}
	steps := []resource.TestStep{
		{
			ConfigFile: config.StaticFile(example), ConfigVariables: vars(modelB),
			Check: resource.ComposeAggregateTestCheckFunc(
				resource.TestCheckResourceAttr("hearth_server.chat", "status", "running"),
				resource.TestCheckResourceAttr("hearth_server.chat", "model", modelB),
				resource.TestCheckResourceAttr("hearth_server.chat", "deployment_url", deployURL),
				resource.TestCheckOutput("deployment_url", deployURL),
				func(s *terraform.State) error {
					serverID = attr(s, "hearth_server.chat", "id")
					if b, err := os.ReadFile(ak); err != nil || !strings.Contains(string(b), strings.Fields(pub)[1]) {
						return fmt.Errorf("the node's authorized_keys: %q, %v", b, err)
					}
					return serves(t, deployURL, attr(s, "hearth_api_key.app", "key"), modelB)
				},
			),
		},
		{ConfigFile: config.StaticFile(example), ConfigVariables: vars(modelB), PlanOnly: true},
		{
			ConfigFile: config.StaticFile(example), ConfigVariables: vars(modelA),
			ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
				plancheck.ExpectResourceAction("hearth_server.chat", plancheck.ResourceActionUpdate),
				plancheck.ExpectResourceAction("hearth_api_key.app", plancheck.ResourceActionNoop),
			}},
			Check: resource.ComposeAggregateTestCheckFunc(
				resource.TestCheckResourceAttr("hearth_server.chat", "status", "running"),
				resource.TestCheckResourceAttr("hearth_server.chat", "model", modelA),
				func(s *terraform.State) error {
					if id := attr(s, "hearth_server.chat", "id"); id != serverID {
						return fmt.Errorf("server %s after the model change, was %s", id, serverID)
					}
					return serves(t, deployURL, attr(s, "hearth_api_key.app", "key"), modelA)
				},
			),
		},
	}
	// The imports use the example without its outputs: an import leaves
	// them null, and terraform-plugin-testing cannot read a state with a
	// null output back ("unexpected output type: <nil>").
	src, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	noOutputs := regexp.MustCompile(`(?ms)^output "[^"]*" \{.*?^\}\n`).ReplaceAllString(string(src), "")
	for _, res := range resources {
		step := importStep(noOutputs, res, strings.HasPrefix(res, "hearth_firewall_rule") || strings.HasPrefix(res, "hearth_api_key"), "key")
		step.ConfigVariables = vars(modelA)
		steps = append(steps, step)
	}
	// The example configures the provider itself: the steps serve it.
	for i := range steps {
		steps[i].ProtoV6ProviderFactories = providers()
	}
	resource.Test(t, resource.TestCase{IsUnitTest: true, CheckDestroy: nothingLeft(c), Steps: steps})
}

// serves checks that the deployment at url lists model, and only it, to
// key, and answers a chat with it. A new key reaches the node within a
// second (README), so it is given a few.
func serves(t *testing.T, url, key, model string) error {
	get := func() (int, []byte, error) {
		req, err := http.NewRequest(http.MethodGet, url+"/models", nil)
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	var (
		code int
		body []byte
		err  error
	)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, body, err = get(); err == nil && code == http.StatusOK {
			break
		}
	}
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if code != http.StatusOK || json.Unmarshal(body, &models) != nil || len(models.Data) != 1 || models.Data[0].ID != model {
		return fmt.Errorf("GET %s/models with the key: %d %s %v, want only %s", url, code, body, err, model)
	}
	chat := fmt.Sprintf(`{"model":%q,"max_tokens":4,"messages":[{"role":"user","content":"Hello"}]}`, model)
	req, err := http.NewRequest(http.MethodPost, url+"/chat/completions", strings.NewReader(chat))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"model":"`+model+`"`) {
		return fmt.Errorf("chat with %s: %d %s", model, resp.StatusCode, b)
	}
	return nil
}

// startHearthd runs a real hearthd listening on addr that enrolls in ctl
// (a cpu node of 16 GB RAM and 100 GB storage), with args after the
// defaults, and returns once it is ready (its model loaded) and enrolled.
// It is stopped when the test ends; its log is printed if the test failed.
func startHearthd(t *testing.T, ctl *controltest.Control, addr string, args ...string) {
	t.Helper()
	enroll := strings.TrimSpace(ctl.CLI("enrollment-tokens", "create", "--uses", "1", "--ttl", "1h"))
	argv := append([]string{"serve", "--listen", addr, "--metrics-listen", "127.0.0.1:0", "--state-dir", t.TempDir(),
		"--log-level", "debug", "--control-url", ctl.URL, "--enrollment-token", enroll,
		"--node-chip", "cpu", "--node-ram", "16", "--node-storage", "100"}, args...)
	log := &proctest.LogBuffer{Max: 8 << 20}
	cmd := exec.Command(bins.Path(t, "hearthd"), argv...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	exited, err := proctest.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proctest.StopGroup(cmd.Process.Pid, exited, 30*time.Second)
		if t.Failed() {
			t.Logf("hearthd log:\n%s", log.Tail(64<<10))
		}
	})
	err = proctest.WaitReady("hearthd on "+addr, exited, 2*time.Minute, func() error {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("/readyz: %d", resp.StatusCode)
		}
		if !strings.Contains(ctl.CLI("nodes", "list"), `"hardware"`) {
			return fmt.Errorf("not enrolled yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.Tail(64<<10))
	}
}
