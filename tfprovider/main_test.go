package tfprovider

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"
	"github.com/hashicorp/terraform-plugin-go/tfprotov6"
	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/terraform"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
	"github.com/hearthd/hearth/internal/sshdtest"
	"github.com/hearthd/hearth/internal/testutil"
)

var bins controltest.Binaries

func TestMain(m *testing.M) { os.Exit(controltest.Main(m, &bins)) }

// terraformVersion is the Terraform CLI the tests drive:
// scripts/ensure-terraform.sh builds it from source.
const terraformVersion = "1.5.7"

// useTerraform points terraform-plugin-testing at the Terraform CLI
// built from source — TF_ACC_TERRAFORM_PATH, as `make test` sets it, else
// where scripts/ensure-terraform.sh caches it — and never at one found on
// PATH or downloaded. Without it the test fails, saying how to build it.
// The provider is served from the test binary (no registry either).
func useTerraform(t *testing.T) string {
	t.Helper()
	testutil.Integration(t, "Terraform")
	bin := os.Getenv("TF_ACC_TERRAFORM_PATH")
	if bin == "" {
		out, err := exec.Command("go", "env", "GOPATH").Output()
		if err != nil {
			t.Fatalf("go env GOPATH: %v", err)
		}
		gopath, _, _ := strings.Cut(strings.TrimSpace(string(out)), ":")
		bin = filepath.Join(gopath, "hearth-terraform", "v"+terraformVersion, "terraform")
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("no Terraform CLI at %s (%v): build it with `scripts/ensure-terraform.sh` (`go install "+
			"github.com/hashicorp/terraform@v%s`, cached under $(go env GOPATH)/hearth-terraform; `make test` does it), "+
			"or set TF_ACC_TERRAFORM_PATH", bin, err, terraformVersion)
	}
	t.Setenv("TF_ACC_TERRAFORM_PATH", bin)
	t.Setenv("TF_ACC_TERRAFORM_VERSION", "")
	// The configurations name the provider by its source address.
	t.Setenv("TF_ACC_PROVIDER_NAMESPACE", "hearthd")
	t.Setenv("CHECKPOINT_DISABLE", "1")
	// An empty CLI configuration: none of the user's (mirrors, plugin
	// cache, dev_overrides) applies.
	rc := filepath.Join(t.TempDir(), "terraformrc")
	if err := os.WriteFile(rc, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TF_CLI_CONFIG_FILE", rc)
	return bin
}

// hcl is a configuration of the provider under its source address, as
// people write one (and as TF_ACC_PROVIDER_NAMESPACE makes the test
// serve it).
func hcl(body string) string {
	return `terraform {
  required_providers {
    hearth = { source = "hearthd/hearth" }
  }
}
` + body
}

// providers serves the provider from the test binary.
func providers() map[string]func() (tfprotov6.ProviderServer, error) {
	return map[string]func() (tfprotov6.ProviderServer, error){
		"hearth": providerserver.NewProtocol6WithError(New("test")()),
	}
}

// testCase is a TestCase that runs without TF_ACC: these tests need no
// cloud account, only what they start, so they run in every `go test`.
func testCase(steps ...resource.TestStep) resource.TestCase {
	return resource.TestCase{IsUnitTest: true, ProtoV6ProviderFactories: providers(), Steps: steps}
}

// controlPlane starts a real hearth-control and points the provider at
// it through HEARTH_URL and HEARTH_TOKEN; it returns the control plane
// and a client of the same project for the tests' own checks.
func controlPlane(t *testing.T, args ...string) (*controltest.Control, *client.Client) {
	t.Helper()
	ctl := controltest.Start(t, &bins, append([]string{"--rate-limit", "1000", "--rate-burst", "1000"}, args...)...)
	t.Setenv(EnvURL, ctl.URL)
	t.Setenv(EnvToken, ctl.Token)
	t.Setenv(EnvCAFile, "")
	c, err := client.New(ctl.URL, client.WithToken(ctl.Token))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return ctl, c
}

// nothingLeft is a CheckDestroy: every hearth resource of the state
// before the destroy is a 404 now, and the project has no server or SSH
// key left, as the API says.
func nothingLeft(c *client.Client) resource.TestCheckFunc {
	return func(s *terraform.State) error {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		var left []string
		for name, rs := range s.RootModule().Resources {
			if strings.HasPrefix(name, "data.") {
				continue
			}
			id, srv := rs.Primary.ID, rs.Primary.Attributes["server_id"]
			var err error
			switch rs.Type {
			case "hearth_server":
				_, err = c.GetServer(ctx, id)
			case "hearth_ssh_key":
				_, err = c.GetSSHKey(ctx, id)
			case "hearth_firewall_rule":
				_, err = c.GetFirewallRule(ctx, srv, id)
			case "hearth_api_key":
				_, err = c.GetAPIKey(ctx, srv, id)
			default:
				continue
			}
			if !client.IsNotFound(err) {
				left = append(left, fmt.Sprintf("%s %s (%v)", name, id, err))
			}
		}
		for s, err := range c.AllServers(ctx, client.ListServersParams{}) {
			if err != nil {
				return err
			}
			left = append(left, s.ID+" ("+string(s.Status)+")")
		}
		for k, err := range c.AllSSHKeys(ctx, client.ListParams{}) {
			if err != nil {
				return err
			}
			left = append(left, k.ID)
		}
		if len(left) > 0 {
			return fmt.Errorf("left after destroy: %s", strings.Join(left, ", "))
		}
		return nil
	}
}

// attr returns a resource's attribute from the state, for ImportStateIdFunc
// and checks.
func attr(s *terraform.State, res, name string) string {
	rs, ok := s.RootModule().Resources[res]
	if !ok {
		return ""
	}
	return rs.Primary.Attributes[name]
}

// testPublicKey is a fresh public key line with a comment.
func testPublicKey(t *testing.T, comment string) string {
	t.Helper()
	_, line := sshdtest.NewSigner(t)
	return line + " " + comment
}
