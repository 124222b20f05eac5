package tfprovider

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"

	"github.com/hearthd/hearth/internal/controltest"
)

// The provider block's url, token and ca_file reach a control plane that
// serves HTTPS with a private CA's certificate; without the CA file the
// certificate is refused; without a URL or token the provider says
// which, and where it looks for them.
func TestProviderConfiguration(t *testing.T) {
	useTerraform(t)
	tlsArgs, caFile := controltest.TLSArgs(t)
	ctl, _ := controlPlane(t, tlsArgs...)
	t.Setenv(EnvURL, "")
	t.Setenv(EnvToken, "")

	cfg := func(provider string) string {
		return hcl(provider + `
data "hearth_servers" "all" {}
`)
	}
	step := func(config string, expectError *regexp.Regexp) resource.TestStep {
		// The configuration has its own provider block, so the step
		// serves the provider.
		return resource.TestStep{Config: config, ExpectError: expectError, ProtoV6ProviderFactories: providers(),
			Check: resource.TestCheckResourceAttr("data.hearth_servers.all", "servers.#", "0")}
	}
	resource.Test(t, resource.TestCase{IsUnitTest: true, Steps: []resource.TestStep{
		step(cfg(fmt.Sprintf(`provider "hearth" {
  url   = %q
  token = %q
}`, ctl.URL, ctl.Token)), regexp.MustCompile(`Cannot list the servers(?s).*certificate signed by unknown authority`)),
		step(cfg(fmt.Sprintf(`provider "hearth" {
  token = %q
}`, ctl.Token)), regexp.MustCompile(`Missing hearth management API URL(?s).*HEARTH_URL`)),
		step(cfg(fmt.Sprintf(`provider "hearth" {
  url     = %q
  ca_file = %q
}`, ctl.URL, caFile)), regexp.MustCompile(`Missing hearth management API token(?s).*HEARTH_TOKEN`)),
		// Last: the destroy after the test uses it.
		step(cfg(fmt.Sprintf(`provider "hearth" {
  url     = %q
  token   = %q
  ca_file = %q
}`, ctl.URL, ctl.Token, caFile)), nil),
	}})
}
