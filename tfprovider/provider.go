// Package tfprovider is hearth's Terraform provider (terraform-provider-hearth):
// deployment servers, SSH keys, firewall rules and deployment API keys of
// the management API as Terraform resources, and data sources to look
// servers and SSH keys up. It is built on terraform-plugin-framework and
// speaks to the API only through the client package.
//
// Every resource but hearth_server is immutable in the API, so any change
// to one replaces it; a server's model is changed in place (PATCH). A
// resource deleted outside Terraform is dropped from the state on refresh,
// so the next plan creates it again instead of failing. Input the
// project's own validators can judge — firewall rules (firewall) and
// public keys (sshkeys) — is checked at validate/plan time, with the
// API's message on the attribute at fault.
package tfprovider

import (
	"context"
	"os"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
)

// Address is the provider's source address, as a configuration's
// required_providers and a .terraformrc's dev_overrides name it.
const Address = "registry.terraform.io/hearthd/hearth"

// Environment variables the provider configuration falls back to, the
// same the hearth CLI reads.
const (
	EnvURL    = "HEARTH_URL"
	EnvToken  = "HEARTH_TOKEN"
	EnvCAFile = "HEARTH_CA_FILE"
)

// New returns a constructor of the provider, as providerserver.Serve
// wants it; version is the provider's own (the binary's).
func New(version string) func() provider.Provider {
	return func() provider.Provider { return &hearthProvider{version: version} }
}

type hearthProvider struct {
	version string
}

type providerModel struct {
	URL    types.String `tfsdk:"url"`
	Token  types.String `tfsdk:"token"`
	CAFile types.String `tfsdk:"ca_file"`
}

func (p *hearthProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "hearth"
	resp.Version = p.version
}

func (p *hearthProvider) Schema(_ context.Context, _ provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "Manages hearth deployments through the management API: deployment servers, their SSH keys, " +
			"firewall rules and deployment API keys.",
		Attributes: map[string]schema.Attribute{
			"url": schema.StringAttribute{
				Optional: true,
				Description: "Base URL of the management API (scheme, host and port, e.g. https://control.example.com). " +
					"Default: the " + EnvURL + " environment variable. Plain http is accepted for loopback only.",
			},
			"token": schema.StringAttribute{
				Optional:  true,
				Sensitive: true,
				Description: "Management API token of the project (hct_…, from `hearth-control tokens create`). " +
					"Default: the " + EnvToken + " environment variable.",
			},
			"ca_file": schema.StringAttribute{
				Optional: true,
				Description: "PEM file of the CA that signed the management API's certificate, trusted besides the system's roots. " +
					"Default: the " + EnvCAFile + " environment variable.",
			},
		},
	}
}

// setting is a provider attribute's value, else its environment variable.
func setting(v types.String, env string) string {
	if !v.IsNull() && !v.IsUnknown() {
		return v.ValueString()
	}
	return os.Getenv(env)
}

func (p *hearthProvider) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var cfg providerModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	for _, a := range []struct {
		name string
		v    types.String
	}{{"url", cfg.URL}, {"token", cfg.Token}, {"ca_file", cfg.CAFile}} {
		if a.v.IsUnknown() {
			resp.Diagnostics.AddAttributeError(path.Root(a.name), "Unknown hearth provider setting",
				"The provider's "+a.name+" is not known until apply; it must be known when the provider is configured. "+
					"Set it to a literal or a variable, or use the environment variable.")
		}
	}
	if resp.Diagnostics.HasError() {
		return
	}
	url, token, caFile := setting(cfg.URL, EnvURL), setting(cfg.Token, EnvToken), setting(cfg.CAFile, EnvCAFile)
	if url == "" {
		resp.Diagnostics.AddAttributeError(path.Root("url"), "Missing hearth management API URL",
			"Set the provider's url or the "+EnvURL+" environment variable.")
	}
	if token == "" {
		resp.Diagnostics.AddAttributeError(path.Root("token"), "Missing hearth management API token",
			"Set the provider's token or the "+EnvToken+" environment variable.")
	}
	if resp.Diagnostics.HasError() {
		return
	}
	opts := []client.Option{client.WithToken(token), client.WithUserAgent("terraform-provider-hearth/" + p.version)}
	if caFile != "" {
		opts = append(opts, client.WithCAFile(caFile))
	}
	c, err := client.New(url, opts...)
	if err != nil {
		resp.Diagnostics.AddError("Cannot configure the hearth provider", err.Error())
		return
	}
	resp.ResourceData = c
	resp.DataSourceData = c
}

func (p *hearthProvider) Resources(context.Context) []func() resource.Resource {
	return []func() resource.Resource{
		func() resource.Resource { return &serverResource{} },
		newSSHKeyResource,
		newFirewallRuleResource,
		newAPIKeyResource,
	}
}

func (p *hearthProvider) DataSources(context.Context) []func() datasource.DataSource {
	return []func() datasource.DataSource{
		func() datasource.DataSource { return &serverDataSource{} },
		func() datasource.DataSource { return &serversDataSource{} },
		func() datasource.DataSource { return &sshKeyDataSource{} },
	}
}
