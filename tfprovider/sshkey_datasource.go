package tfprovider

import (
	"context"
	"fmt"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework-validators/datasourcevalidator"
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
)

type sshKeyDataSource struct{ configured }

var (
	_ datasource.DataSourceWithConfigure        = (*sshKeyDataSource)(nil)
	_ datasource.DataSourceWithConfigValidators = (*sshKeyDataSource)(nil)
)

func (d *sshKeyDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_ssh_key"
}

func (d *sshKeyDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "One SSH key of the project, by ID, name or fingerprint (e.g. one registered with the hearth CLI).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{Optional: true, Computed: true, Description: "The key's ID (`sk_…`)."},
			"name": schema.StringAttribute{Optional: true, Computed: true,
				Description: "The key's name; more than one key of that name is an error."},
			"fingerprint": schema.StringAttribute{Optional: true, Computed: true,
				Description: "`SHA256:…`, as `ssh-keygen -lf` prints it."},
			"public_key": schema.StringAttribute{Computed: true, Description: "The OpenSSH public key line."},
			"type":       schema.StringAttribute{Computed: true, Description: "The key type, e.g. `ssh-ed25519`."},
			"bits":       schema.Int64Attribute{Computed: true, Description: "The key's size in bits."},
		},
	}
}

func (d *sshKeyDataSource) ConfigValidators(context.Context) []datasource.ConfigValidator {
	return []datasource.ConfigValidator{datasourcevalidator.ExactlyOneOf(
		path.MatchRoot("id"), path.MatchRoot("name"), path.MatchRoot("fingerprint"))}
}

func (d *sshKeyDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.configure(req.ProviderData, &resp.Diagnostics)
}

func (d *sshKeyDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var cfg sshKeyModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	var k client.SSHKey
	if !cfg.ID.IsNull() {
		var err error
		if k, err = d.client.GetSSHKey(ctx, cfg.ID.ValueString()); err != nil {
			addError(&resp.Diagnostics, "Cannot read the SSH key", err, "id")
			return
		}
	} else {
		attr, want, match := "name", cfg.Name.ValueString(), func(k client.SSHKey) string { return k.Name }
		if !cfg.Fingerprint.IsNull() {
			attr, want, match = "fingerprint", cfg.Fingerprint.ValueString(), func(k client.SSHKey) string { return k.Fingerprint }
		}
		var found []string
		for key, err := range d.client.AllSSHKeys(ctx, client.ListParams{Limit: 100}) {
			if err != nil {
				addError(&resp.Diagnostics, "Cannot list the SSH keys", err)
				return
			}
			if match(key) == want {
				k = key
				found = append(found, key.ID)
			}
		}
		switch len(found) {
		case 0:
			resp.Diagnostics.AddAttributeError(path.Root(attr), "No such SSH key", fmt.Sprintf("the project has no SSH key with %s %q", attr, want))
			return
		case 1:
		default:
			resp.Diagnostics.AddAttributeError(path.Root(attr), "More than one SSH key",
				fmt.Sprintf("%d SSH keys have %s %q (%s): give the id", len(found), attr, want, strings.Join(found, ", ")))
			return
		}
	}
	cfg.PublicKey = types.StringNull()
	cfg.fill(k)
	resp.Diagnostics.Append(resp.State.Set(ctx, &cfg)...)
}
