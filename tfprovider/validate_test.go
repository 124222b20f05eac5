package tfprovider

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
)

// apiRefusal is what the management API answers to a bad request: its
// message and the field it names.
func apiRefusal(t *testing.T, err error) client.APIError {
	t.Helper()
	var apiErr client.APIError
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || apiErr.Param == "" {
		t.Fatalf("the API should refuse with a 400 naming the field, got %v", err)
	}
	return apiErr
}

// refusedAt matches Terraform's diagnostic for a value refused on an
// attribute: the attribute's line in the configuration, then message
// (Terraform wraps long messages, so any run of spaces may be a line
// break).
func refusedAt(attribute, message string) *regexp.Regexp {
	words := strings.Fields(message)
	for i, w := range words {
		words[i] = regexp.QuoteMeta(w)
	}
	return regexp.MustCompile(`(?s)\n\s*\d+:\s+` + regexp.QuoteMeta(attribute) + `\s+=.*\n\n` + strings.Join(words, `\s+`))
}

// Bad input fails the plan, before anything is created, with the
// management API's own message for it on the attribute at fault: a port
// range, an address or CIDR, a field on the wrong direction, a public
// key. Each case is first sent to the API, whose answer the plan's error
// must repeat. Fields the plan cannot know yet do not stop the others
// from being checked.
func TestBadInputFailsThePlan(t *testing.T) {
	useTerraform(t)
	ctl, c := controlPlane(t)
	ctl.StartNode(controltest.NodeOptions{})
	ctx := context.Background()
	srv, err := c.CreateServer(ctx, client.CreateServerRequest{Name: "web", Chip: "cpu", RAM: 4, Storage: 20,
		Stack: client.StackDeployment, Model: "m", Billing: client.BillingMonthly})
	if err != nil {
		t.Fatal(err)
	}

	rule := func(fields string) string {
		return hcl(fmt.Sprintf(`
resource "hearth_firewall_rule" "bad" {
  server_id = %q
  %s
}`, srv.ID, fields))
	}
	for _, tc := range []struct {
		name   string
		req    client.CreateFirewallRuleRequest
		fields string
	}{
		{"port out of range", client.CreateFirewallRuleRequest{Direction: client.Inbound, Protocol: client.TCP, PortRange: "70000", Action: client.Allow},
			`direction = "inbound"
  protocol = "tcp"
  port_range = "70000"
  action = "allow"`},
		{"port range backwards", client.CreateFirewallRuleRequest{Direction: client.Inbound, Protocol: client.UDP, PortRange: "9000-8000", Action: client.Deny},
			`direction = "inbound"
  protocol = "udp"
  port_range = "9000-8000"
  action = "deny"`},
		{"bad CIDR", client.CreateFirewallRuleRequest{Direction: client.Inbound, Protocol: client.TCP, Source: "10.0.0.256/8", Action: client.Allow},
			`direction = "inbound"
  protocol = "tcp"
  source = "10.0.0.256/8"
  action = "allow"`},
		{"destination on an inbound rule", client.CreateFirewallRuleRequest{Direction: client.Inbound, Protocol: client.TCP, Destination: "192.0.2.0/24", Action: client.Allow},
			`direction = "inbound"
  protocol = "tcp"
  destination = "192.0.2.0/24"
  action = "allow"`},
		{"ports on icmp", client.CreateFirewallRuleRequest{Direction: client.Outbound, Protocol: client.ICMP, PortRange: "22", Action: client.Allow},
			`direction = "outbound"
  protocol = "icmp"
  port_range = "22"
  action = "allow"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.CreateFirewallRule(ctx, srv.ID, tc.req)
			want := apiRefusal(t, err)
			resource.Test(t, testCase(resource.TestStep{Config: rule(tc.fields), PlanOnly: true,
				ExpectError: refusedAt(want.Param, want.Message)}))
		})
	}

	t.Run("public key", func(t *testing.T) {
		bad := "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBad laptop"
		_, err := c.CreateSSHKey(ctx, client.CreateSSHKeyRequest{Name: "laptop", PublicKey: bad})
		want := apiRefusal(t, err)
		resource.Test(t, testCase(resource.TestStep{PlanOnly: true, ExpectError: refusedAt(want.Param, want.Message),
			Config: hcl(fmt.Sprintf(`
resource "hearth_ssh_key" "bad" {
  name       = "laptop"
  public_key = %q
}`, bad))}))
	})

	// The direction comes from another resource, unknown until apply:
	// the port range is still checked.
	t.Run("with unknown fields", func(t *testing.T) {
		resource.Test(t, testCase(resource.TestStep{PlanOnly: true,
			ExpectError: refusedAt("port_range", "port_range: port must be between 1 and 65535"),
			Config: hcl(fmt.Sprintf(`
resource "hearth_ssh_key" "k" {
  name       = "k"
  public_key = %q
}
resource "hearth_firewall_rule" "bad" {
  server_id  = %q
  direction  = hearth_ssh_key.k.type == "" ? "inbound" : "outbound"
  protocol   = "tcp"
  port_range = "0"
  action     = "allow"
}`, testPublicKey(t, "k"), srv.ID))}))
	})

	t.Run("expiry", func(t *testing.T) {
		resource.Test(t, testCase(resource.TestStep{PlanOnly: true,
			ExpectError: refusedAt("expires_at", "expires_at must be an RFC 3339 time"),
			Config: hcl(fmt.Sprintf(`
resource "hearth_api_key" "bad" {
  server_id  = %q
  name       = "app"
  expires_at = "tomorrow"
}`, srv.ID))}))
	})

	t.Run("status filter", func(t *testing.T) {
		resource.Test(t, testCase(resource.TestStep{PlanOnly: true,
			ExpectError: regexp.MustCompile(`(?s)status = "asleep".*value must be one of`),
			Config: hcl(`
data "hearth_servers" "bad" {
  status = "asleep"
}`)}))
	})
}

// devOverrides builds the provider binary and returns the Terraform CLI
// and a CLI configuration that installs it as the README's dev_overrides
// example says: no init, no registry.
func devOverrides(t *testing.T) (tf, rc string) {
	t.Helper()
	tf = useTerraform(t)
	pluginDir := t.TempDir()
	build := exec.Command("go", "build", "-o", filepath.Join(pluginDir, "terraform-provider-hearth"), "./cmd/terraform-provider-hearth")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the provider: %v\n%s", err, out)
	}
	rc = filepath.Join(t.TempDir(), "terraformrc")
	writeFile(t, rc, fmt.Sprintf(`provider_installation {
  dev_overrides {
    "hearthd/hearth" = %q
  }
  direct {}
}
`, pluginDir))
	return tf, rc
}

// validate runs `terraform validate` on a configuration of the files
// given (name → content) with the provider from devOverrides, in a home
// directory holding ~/.ssh/id_ed25519.pub, and returns its output.
func validate(t *testing.T, tf, rc string, files map[string]string) (string, error) {
	t.Helper()
	dir, home := t.TempDir(), t.TempDir()
	for name, content := range files {
		writeFile(t, filepath.Join(dir, name), content)
	}
	if err := os.Mkdir(filepath.Join(home, ".ssh"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(home, ".ssh", "id_ed25519.pub"), testPublicKey(t, "alice@laptop")+"\n")
	cmd := exec.Command(tf, "validate", "-no-color")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+home, "TF_CLI_CONFIG_FILE="+rc, "CHECKPOINT_DISABLE=1", "HEARTH_URL=", "HEARTH_TOKEN=")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// `terraform validate` with the provider binary installed through
// dev_overrides refuses a bad rule with the API's message, before any
// provider configuration or network; every example of the documentation
// validates, its values checked as at plan time.
func TestValidate(t *testing.T) {
	tf, rc := devOverrides(t)
	out, err := validate(t, tf, rc, map[string]string{"main.tf": hcl(`
resource "hearth_firewall_rule" "bad" {
  server_id  = "srv_x"
  direction  = "outbound"
  protocol   = "tcp"
  port_range = "22"
  source     = "198.51.100.0/24"
  action     = "allow"
}`)})
	if err == nil || !refusedAt("source", "source: is only allowed on inbound rules; use destination for outbound").MatchString(out) {
		t.Fatalf("terraform validate of a bad rule: %v\n%s", err, out)
	}

	examples, err := filepath.Glob("examples/*/*/*.tf")
	if err != nil {
		t.Fatal(err)
	}
	examples = append(examples, example)
	if len(examples) < 8 {
		t.Fatalf("examples: %v", examples)
	}
	for _, ex := range examples {
		src, err := os.ReadFile(ex)
		if err != nil {
			t.Fatal(err)
		}
		files := map[string]string{"main.tf": string(src)}
		if !strings.Contains(string(src), "required_providers") {
			files["versions.tf"] = hcl("")
		}
		if out, err := validate(t, tf, rc, files); err != nil || !strings.Contains(out, "The configuration is valid") {
			t.Errorf("terraform validate %s: %v\n%s", ex, err, out)
		}
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
