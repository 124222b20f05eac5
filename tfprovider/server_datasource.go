package tfprovider

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-validators/datasourcevalidator"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
)

// serverData is a server as the data sources show it.
type serverData struct {
	ID            types.String `tfsdk:"id"`
	Name          types.String `tfsdk:"name"`
	Status        types.String `tfsdk:"status"`
	Chip          types.String `tfsdk:"chip"`
	RAM           types.Int64  `tfsdk:"ram"`
	Storage       types.Int64  `tfsdk:"storage"`
	Stack         types.String `tfsdk:"stack"`
	Billing       types.String `tfsdk:"billing"`
	Model         types.String `tfsdk:"model"`
	DeploymentURL types.String `tfsdk:"deployment_url"`
	SSHKeyIDs     types.List   `tfsdk:"ssh_key_ids"`
	IP            types.String `tfsdk:"ip"`
	CreatedAt     types.String `tfsdk:"created_at"`
	// Labels go here once the management API has them.
}

func newServerData(ctx context.Context, s client.Server) (serverData, diag.Diagnostics) {
	keys, diags := types.ListValueFrom(ctx, types.StringType, s.SSHKeyIDs)
	return serverData{ID: types.StringValue(s.ID), Name: types.StringValue(s.Name), Status: types.StringValue(string(s.Status)),
		Chip: types.StringValue(s.Chip), RAM: types.Int64Value(int64(s.RAM)), Storage: types.Int64Value(int64(s.Storage)),
		Stack: types.StringValue(string(s.Stack)), Billing: types.StringValue(s.Billing), Model: optString(s.Model),
		DeploymentURL: optString(s.DeploymentURL), SSHKeyIDs: keys, IP: optStringPtr(s.IP),
		CreatedAt: types.StringValue(s.CreatedAt.UTC().Format(time.RFC3339))}, diags
}

// serverDataAttributes is the schema of serverData; ip says what it
// holds (lists mask addresses).
func serverDataAttributes(ip string) map[string]schema.Attribute {
	str := func(d string) schema.StringAttribute { return schema.StringAttribute{Computed: true, Description: d} }
	return map[string]schema.Attribute{
		"id":             str("The server's ID (`srv_…`)."),
		"name":           str("The server's name."),
		"status":         str("`provisioning`, `running`, `updating`, `failed`, `unreachable` or `deleting`."),
		"chip":           str("The node's chip family."),
		"ram":            schema.Int64Attribute{Computed: true, Description: "RAM in GB."},
		"storage":        schema.Int64Attribute{Computed: true, Description: "Storage in GB."},
		"stack":          str("`deployment` or `bare`."),
		"billing":        str("The billing plan."),
		"model":          str("The model the deployment serves (ordered); null for `bare`."),
		"deployment_url": str("Base URL of the deployment API (`…/api/v1`); null for `bare`."),
		"ssh_key_ids": schema.ListAttribute{Computed: true, ElementType: types.StringType,
			Description: "IDs of the SSH keys the server lets in."},
		"ip":         str(ip),
		"created_at": str("RFC 3339, UTC."),
	}
}

type serverDataSource struct{ configured }

var (
	_ datasource.DataSourceWithConfigure        = (*serverDataSource)(nil)
	_ datasource.DataSourceWithConfigValidators = (*serverDataSource)(nil)
)

func (d *serverDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_server"
}

func (d *serverDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	attrs := serverDataAttributes("The server's address, once its node reported it.")
	attrs["id"] = schema.StringAttribute{Optional: true, Computed: true, Description: "The server's ID (`srv_…`): give it or `name`."}
	attrs["name"] = schema.StringAttribute{Optional: true, Computed: true, Description: "The server's name: give it or `id`."}
	resp.Schema = schema.Schema{
		Description: "One server of the project, by ID or name.",
		Attributes:  attrs,
	}
}

func (d *serverDataSource) ConfigValidators(context.Context) []datasource.ConfigValidator {
	return []datasource.ConfigValidator{datasourcevalidator.ExactlyOneOf(path.MatchRoot("id"), path.MatchRoot("name"))}
}

func (d *serverDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.configure(req.ProviderData, &resp.Diagnostics)
}

func (d *serverDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var cfg serverData
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	id := cfg.ID.ValueString()
	if cfg.ID.IsNull() {
		name := cfg.Name.ValueString()
		for s, err := range d.client.AllServers(ctx, client.ListServersParams{ListParams: client.ListParams{Limit: 100}}) {
			if err != nil {
				addError(&resp.Diagnostics, "Cannot list the servers", err)
				return
			}
			if s.Name == name {
				id = s.ID
				break
			}
		}
		if id == "" {
			resp.Diagnostics.AddAttributeError(path.Root("name"), "No such server", fmt.Sprintf("the project has no server named %q", name))
			return
		}
	}
	// A list masks the address: the server's own answer has it whole.
	s, err := d.client.GetServer(ctx, id)
	if err != nil {
		addError(&resp.Diagnostics, "Cannot read the server", err, "id")
		return
	}
	out, diags := newServerData(ctx, s)
	resp.Diagnostics.Append(diags...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &out)...)
}

type serversDataSource struct{ configured }

var _ datasource.DataSourceWithConfigure = (*serversDataSource)(nil)

type serversData struct {
	Status types.String `tfsdk:"status"`
	// A label filter goes here once servers have labels.
	Servers []serverData `tfsdk:"servers"`
}

func (d *serversDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_servers"
}

func (d *serversDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		Description: "The project's servers, newest first, optionally of one status.",
		Attributes: map[string]schema.Attribute{
			"status": schema.StringAttribute{
				Optional:    true,
				Validators:  []validator.String{stringvalidator.OneOf(stringValues(client.ServerStatuses())...)},
				Description: "Only servers of this status: `provisioning`, `running`, `updating`, `failed`, `unreachable` or `deleting`.",
			},
			"servers": schema.ListNestedAttribute{
				Computed:     true,
				NestedObject: schema.NestedAttributeObject{Attributes: serverDataAttributes("The address, masked as lists show it (203.0.x.x).")},
				Description:  "The servers.",
			},
		},
	}
}

func (d *serversDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.configure(req.ProviderData, &resp.Diagnostics)
}

func (d *serversDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var cfg serversData
	resp.Diagnostics.Append(req.Config.Get(ctx, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	p := client.ListServersParams{ListParams: client.ListParams{Limit: 100}, Status: client.ServerStatus(cfg.Status.ValueString())}
	cfg.Servers = []serverData{}
	for s, err := range d.client.AllServers(ctx, p) {
		if err != nil {
			addError(&resp.Diagnostics, "Cannot list the servers", err, "status")
			return
		}
		sd, diags := newServerData(ctx, s)
		resp.Diagnostics.Append(diags...)
		cfg.Servers = append(cfg.Servers, sd)
	}
	resp.Diagnostics.Append(resp.State.Set(ctx, &cfg)...)
}
