package tfprovider

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/internal/controltest"
	"github.com/hearthd/hearth/internal/testutil"
)

// lifecycleConfig declares the four resources and the three data sources,
// with the public key, the rule's source and the key's expiry as given.
func lifecycleConfig(pub, source, expiry string) string {
	return hcl(fmt.Sprintf(`
resource "hearth_ssh_key" "k" {
  name       = "laptop"
  public_key = %q
}

resource "hearth_server" "web" {
  name        = "web"
  chip        = "cpu"
  ram         = 4
  storage     = 20
  model       = "m1"
  ssh_key_ids = [hearth_ssh_key.k.id]
}

resource "hearth_firewall_rule" "ssh" {
  server_id   = hearth_server.web.id
  direction   = "inbound"
  protocol    = "tcp"
  port_range  = "22"
  source      = %q
  action      = "allow"
}

resource "hearth_api_key" "app" {
  server_id           = hearth_server.web.id
  name                = "app"
  expires_at          = %q
  requests_per_minute = 60
}

data "hearth_server" "by_name" {
  name       = hearth_server.web.name
  depends_on = [hearth_server.web]
}

data "hearth_servers" "running" {
  status     = "running"
  depends_on = [hearth_server.web]
}

data "hearth_ssh_key" "by_fingerprint" {
  fingerprint = hearth_ssh_key.k.fingerprint
}
`, pub, source, expiry))
}

// With a real control plane and a fake node: the four resources are
// created and kept as written — a key with spaces around it, a bare
// address, an expiry with an offset — though the API stores them in
// canonical form, and without a diff; the data sources find them;
// resources deleted outside Terraform show as creates in the next plan,
// which applies; the canonical spelling of the same values changes only
// the state; each resource imports to the same state; destroying leaves
// nothing in the API.
func TestLifecycle(t *testing.T) {
	useTerraform(t)
	ctl, c := controlPlane(t)
	ctl.StartNode(controltest.NodeOptions{})
	pub := testPublicKey(t, "alice@laptop")
	cfg := lifecycleConfig("  "+pub+" ", "198.51.100.7", "2040-01-01T01:00:00+01:00")
	canonical := lifecycleConfig(pub, "198.51.100.7/32", "2040-01-01T00:00:00Z")
	ctx := context.Background()

	var serverID string
	ids := map[string]string{}
	keepIDs := func(s *terraform.State) error {
		for name, rs := range s.RootModule().Resources {
			if strings.HasPrefix(name, "data.") {
				continue
			}
			if old, ok := ids[name]; ok && old != rs.Primary.ID {
				return fmt.Errorf("%s replaced: %s, was %s", name, rs.Primary.ID, old)
			}
			ids[name] = rs.Primary.ID
		}
		return nil
	}
	resource.Test(t, resource.TestCase{IsUnitTest: true, ProtoV6ProviderFactories: providers(), CheckDestroy: nothingLeft(c),
		Steps: []resource.TestStep{
			{
				Config: cfg,
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("hearth_server.web", "status", "running"),
					resource.TestCheckResourceAttr("hearth_server.web", "stack", "deployment"),
					resource.TestCheckResourceAttr("hearth_server.web", "billing", "monthly"),
					resource.TestCheckResourceAttr("hearth_server.web", "ip", "203.0.113.7"),
					resource.TestCheckResourceAttr("hearth_server.web", "deployment_url", "http://web.deploy.test/api/v1"),
					resource.TestCheckResourceAttrPair("hearth_server.web", "ssh_key_ids.0", "hearth_ssh_key.k", "id"),
					resource.TestCheckResourceAttr("hearth_ssh_key.k", "type", "ssh-ed25519"),
					resource.TestMatchResourceAttr("hearth_ssh_key.k", "fingerprint", regexp.MustCompile(`^SHA256:`)),
					resource.TestCheckResourceAttr("hearth_ssh_key.k", "public_key", "  "+pub+" "),
					resource.TestCheckResourceAttr("hearth_firewall_rule.ssh", "source", "198.51.100.7"),
					resource.TestCheckResourceAttr("hearth_firewall_rule.ssh", "description", ""),
					resource.TestMatchResourceAttr("hearth_api_key.app", "key", regexp.MustCompile(`^hearth_live_[0-9A-Za-z]{32}$`)),
					resource.TestMatchResourceAttr("hearth_api_key.app", "hint", regexp.MustCompile(`^hearth_live_…`)),
					resource.TestCheckResourceAttr("hearth_api_key.app", "expires_at", "2040-01-01T01:00:00+01:00"),
					resource.TestCheckResourceAttr("hearth_api_key.app", "tokens_per_minute", "0"),
					resource.TestCheckResourceAttrPair("data.hearth_server.by_name", "id", "hearth_server.web", "id"),
					resource.TestCheckResourceAttr("data.hearth_server.by_name", "ip", "203.0.113.7"),
					resource.TestCheckResourceAttr("data.hearth_servers.running", "servers.#", "1"),
					resource.TestCheckResourceAttrPair("data.hearth_servers.running", "servers.0.id", "hearth_server.web", "id"),
					resource.TestCheckResourceAttr("data.hearth_servers.running", "servers.0.ip", "203.0.x.x"),
					resource.TestCheckResourceAttrPair("data.hearth_ssh_key.by_fingerprint", "id", "hearth_ssh_key.k", "id"),
					resource.TestCheckResourceAttr("data.hearth_ssh_key.by_fingerprint", "public_key", pub),
					func(s *terraform.State) error {
						serverID = attr(s, "hearth_server.web", "id")
						// What the API stores: the canonical forms.
						fr, err := c.GetFirewallRule(ctx, serverID, attr(s, "hearth_firewall_rule.ssh", "id"))
						if err != nil || fr.Source == nil || *fr.Source != "198.51.100.7/32" {
							return fmt.Errorf("the rule in the API: %+v, %v", fr, err)
						}
						k, err := c.GetAPIKey(ctx, serverID, attr(s, "hearth_api_key.app", "id"))
						if err != nil || k.ExpiresAt == nil || !k.ExpiresAt.Equal(time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)) || k.RequestsPerMinute != 60 {
							return fmt.Errorf("the API key in the API: %+v, %v", k, err)
						}
						return nil
					},
				),
			},
			{Config: cfg, PlanOnly: true},
			// The rule and the key are deleted outside Terraform: the
			// plan wants them back, and applying creates them.
			{
				PreConfig: func() {
					deleteOutside(t, c, serverID, "hearth_firewall_rule", "hearth_api_key")
				},
				Config: cfg, PlanOnly: true, ExpectNonEmptyPlan: true,
				ConfigPlanChecks: resource.ConfigPlanChecks{PostApplyPostRefresh: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("hearth_firewall_rule.ssh", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("hearth_api_key.app", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("hearth_server.web", plancheck.ResourceActionNoop),
				}},
			},
			{
				Config: cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("hearth_firewall_rule.ssh", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("hearth_api_key.app", plancheck.ResourceActionCreate),
				}},
			},
			// The server is deleted outside Terraform (its rule and key go
			// with it): all three are created again.
			{
				PreConfig: func() {
					if err := c.DeleteServer(ctx, serverID); err != nil {
						t.Fatal(err)
					}
					if err := c.WaitServerGone(ctx, serverID, client.WaitOptions{Interval: 100 * time.Millisecond}); err != nil {
						t.Fatal(err)
					}
				},
				Config: cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("hearth_server.web", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("hearth_firewall_rule.ssh", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("hearth_api_key.app", plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction("hearth_ssh_key.k", plancheck.ResourceActionNoop),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(func(s *terraform.State) error {
					if id := attr(s, "hearth_server.web", "id"); id == serverID || id == "" {
						return fmt.Errorf("server id %q after the server was deleted outside (was %s)", id, serverID)
					}
					return nil
				}, keepIDs),
			},
			// The same values as the API writes them: an update of the
			// state, no replacement.
			{
				Config: canonical,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("hearth_ssh_key.k", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("hearth_firewall_rule.ssh", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("hearth_api_key.app", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("hearth_server.web", plancheck.ResourceActionNoop),
				}},
				Check: resource.ComposeAggregateTestCheckFunc(keepIDs,
					resource.TestCheckResourceAttr("hearth_firewall_rule.ssh", "source", "198.51.100.7/32"),
					resource.TestMatchResourceAttr("hearth_api_key.app", "key", regexp.MustCompile(`^hearth_live_`))),
			},
			importStep(canonical, "hearth_ssh_key.k", false),
			importStep(canonical, "hearth_server.web", false),
			importStep(canonical, "hearth_firewall_rule.ssh", true),
			importStep(canonical, "hearth_api_key.app", true, "key"),
		}})
}

// deleteOutside deletes the state's resources of the given types (of
// server serverID) through the API, as someone without Terraform would.
func deleteOutside(t *testing.T, c *client.Client, serverID string, types ...string) {
	t.Helper()
	ctx := context.Background()
	for _, typ := range types {
		var err error
		switch typ {
		case "hearth_firewall_rule":
			for r, lerr := range c.AllFirewallRules(ctx, serverID, client.ListParams{}) {
				if lerr != nil {
					t.Fatal(lerr)
				}
				err = c.DeleteFirewallRule(ctx, serverID, r.ID)
			}
		case "hearth_api_key":
			for k, lerr := range c.AllAPIKeys(ctx, serverID, client.ListParams{}) {
				if lerr != nil {
					t.Fatal(lerr)
				}
				err = c.DeleteAPIKey(ctx, serverID, k.ID)
			}
		}
		if err != nil {
			t.Fatalf("delete %s outside Terraform: %v", typ, err)
		}
	}
}

// importStep imports res into a fresh state and checks the import
// matches the applied state, but for ignore (the API key's secret, which
// no read returns). A server's rule or API key is imported as
// SERVER_ID/ID.
func importStep(cfg, res string, underServer bool, ignore ...string) resource.TestStep {
	step := resource.TestStep{Config: cfg, ResourceName: res, ImportState: true, ImportStateVerify: true,
		ImportStateVerifyIgnore: ignore}
	if underServer {
		step.ImportStateIdFunc = func(s *terraform.State) (string, error) {
			return attr(s, res, "server_id") + "/" + attr(s, res, "id"), nil
		}
	}
	return step
}

// A server that turns failed fails the apply with the node's reason, and
// stays in the state as tainted: once the node converges, the next apply
// replaces it. (An empty set of SSH keys for none then changes only the
// state.) A model change the node does not carry out fails the same way.
func TestCreateFailsWithTheServersReason(t *testing.T) {
	useTerraform(t)
	ctl, c := controlPlane(t, "--provision-timeout", "1s")
	node := ctl.StartNode(controltest.NodeOptions{Hold: true})
	cfg := hcl(`
resource "hearth_server" "web" {
  name    = "web"
  chip    = "cpu"
  ram     = 4
  storage = 20
  model   = "m1"
}`)
	resource.Test(t, resource.TestCase{IsUnitTest: true, ProtoV6ProviderFactories: providers(), CheckDestroy: nothingLeft(c),
		Steps: []resource.TestStep{
			{Config: cfg, ExpectError: regexp.MustCompile(`(?s)The server did not reach running.*server srv_\w+: server failed:\s+model\s+pending`)},
			{
				PreConfig: node.Release,
				Config:    cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("hearth_server.web", plancheck.ResourceActionDestroyBeforeCreate),
				}},
				Check: resource.TestCheckResourceAttr("hearth_server.web", "status", "running"),
			},
			// No SSH keys written as an empty set: the same server.
			{
				Config: strings.Replace(cfg, `model   = "m1"`, `model   = "m1"
  ssh_key_ids = []`, 1),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("hearth_server.web", plancheck.ResourceActionUpdate),
				}},
			},
			// A model the node does not come to serve: the update fails
			// with the reason, the state keeps the ordered model.
			{
				PreConfig:   node.Hold,
				Config:      strings.Replace(cfg, `"m1"`, `"m2"`, 1),
				ExpectError: regexp.MustCompile(`(?s)The server did not reach running with the new model.*server failed:\s+model\s+pending`),
			},
			// Once it does, the server runs and nothing is left to change.
			{
				PreConfig: node.Release,
				Config:    strings.Replace(cfg, `"m1"`, `"m2"`, 1),
				Check: resource.ComposeAggregateTestCheckFunc(
					resource.TestCheckResourceAttr("hearth_server.web", "status", "running"),
					resource.TestCheckResourceAttr("hearth_server.web", "model", "m2")),
			},
		}})
}

// Creating waits no longer than the create timeout, then says what the
// server still waits for.
func TestWaitRunningTimesOut(t *testing.T) {
	ctl, c := controlPlane(t)
	ctl.StartNode(controltest.NodeOptions{Hold: true})
	ctx := context.Background()
	srv, err := c.CreateServer(ctx, client.CreateServerRequest{Name: "web", Chip: "cpu", RAM: 4, Storage: 20,
		Stack: client.StackDeployment, Model: "m1", Billing: client.BillingMonthly})
	if err != nil {
		t.Fatal(err)
	}
	// Once the node has reported, what the server waits for is known.
	testutil.WaitFor(t, 30*time.Second, "the node's first report", func() bool {
		s, err := c.GetServer(ctx, srv.ID)
		return err == nil && s.Enforcement.ReportedAt != nil
	})
	r := &serverResource{configured{client: c}}
	last, err := r.waitRunning(ctx, srv, 300*time.Millisecond)
	want := "server " + srv.ID + " still provisioning after 300ms: model pending"
	if err == nil || err.Error() != want || last.ID != srv.ID {
		t.Fatalf("waitRunning: %v (server %s), want %q", err, last.ID, want)
	}
	if !strings.HasPrefix(client.Diagnose(last), "model pending") {
		t.Fatalf("last server seen: %+v", last)
	}
}
