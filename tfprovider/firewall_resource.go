package tfprovider

import (
	"context"
	"errors"

	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/firewall"
)

type firewallRuleResource struct {
	immutable[firewallRuleModel, client.FirewallRule, *firewallRuleModel]
}

func newFirewallRuleResource() resource.Resource {
	return &firewallRuleResource{immutable[firewallRuleModel, client.FirewallRule, *firewallRuleModel]{what: "firewall rule",
		get: (*client.Client).GetFirewallRule,
		del: (*client.Client).DeleteFirewallRule}}
}

func (m *firewallRuleModel) ids() (string, string) {
	return m.ServerID.ValueString(), m.ID.ValueString()
}

var (
	_ resource.ResourceWithConfigure      = (*firewallRuleResource)(nil)
	_ resource.ResourceWithImportState    = (*firewallRuleResource)(nil)
	_ resource.ResourceWithValidateConfig = (*firewallRuleResource)(nil)
)

type firewallRuleModel struct {
	ID          types.String `tfsdk:"id"`
	ServerID    types.String `tfsdk:"server_id"`
	Direction   types.String `tfsdk:"direction"`
	Protocol    types.String `tfsdk:"protocol"`
	PortRange   types.String `tfsdk:"port_range"`
	Source      types.String `tfsdk:"source"`
	Destination types.String `tfsdk:"destination"`
	Action      types.String `tfsdk:"action"`
	Description types.String `tfsdk:"description"`
}

// ruleParams are the attributes the API names as the resource does.
var ruleParams = []string{"server_id", "direction", "protocol", "port_range", "source", "destination", "action", "description"}

func (r *firewallRuleResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_firewall_rule"
}

func (r *firewallRuleResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	sameRule := []planmodifier.String{replaceUnlessSame(sameRule)}
	resp.Schema = schema.Schema{
		Description: "One firewall rule of a server, enforced by its node with nftables. Rules are immutable: any change " +
			"replaces the rule. The rule is checked at plan time by the same validation as the management API's (ports, " +
			"addresses, which direction takes which address).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Computed: true, PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
				Description: "The rule's ID (`fw_…`).",
			},
			"server_id": schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "The server's ID (`srv_…`)."},
			"direction": schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "`inbound` or `outbound`."},
			"protocol":  schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "`tcp`, `udp` or `icmp`."},
			"port_range": schema.StringAttribute{
				Optional: true, PlanModifiers: sameRule,
				Description: "`\"22\"` or `\"8000-9000\"` (ports 1–65535); absent: every port. Not for `icmp`.",
			},
			"source": schema.StringAttribute{
				Optional: true, PlanModifiers: sameRule,
				Description: "Inbound only: an IPv4 or IPv6 address or CIDR; absent: any address.",
			},
			"destination": schema.StringAttribute{
				Optional: true, PlanModifiers: sameRule,
				Description: "Outbound only: an IPv4 or IPv6 address or CIDR; absent: any address.",
			},
			"action": schema.StringAttribute{Required: true, PlanModifiers: replace, Description: "`allow` or `deny`."},
			"description": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString(""), PlanModifiers: replace,
				Description: "At most 255 characters, no control or invisible formatting characters.",
			},
		},
	}
}

// rule is m's rule as the firewall package takes it.
func (m firewallRuleModel) rule() firewall.Rule {
	return firewall.Rule{Direction: m.Direction.ValueString(), Protocol: m.Protocol.ValueString(),
		PortRange: m.PortRange.ValueString(), Source: m.Source.ValueString(), Destination: m.Destination.ValueString(),
		Action: m.Action.ValueString(), Description: m.Description.ValueString()}
}

// ValidateConfig checks the rule with firewall.Canonicalize, the
// management API's own check, so a rule it would refuse fails
// `terraform validate` and plans with the API's message on the field.
// While some fields are unknown (set from other resources), the known
// addresses and ports are checked alone.
func (r *firewallRuleResource) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var m firewallRuleModel
	resp.Diagnostics.Append(req.Config.Get(ctx, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// A missing required field is Terraform's to report.
	if m.Direction.IsNull() || m.Protocol.IsNull() || m.Action.IsNull() {
		return
	}
	known := func(v types.String) bool { return !v.IsUnknown() }
	if m.known() {
		_, err := firewall.Canonicalize(m.rule())
		var fe *firewall.FieldError
		switch {
		case errors.As(err, &fe):
			resp.Diagnostics.AddAttributeError(path.Root(fe.Field), "Invalid firewall rule", fe.Error())
		case err != nil:
			resp.Diagnostics.AddError("Invalid firewall rule", err.Error())
		}
		return
	}
	if v := m.PortRange; known(v) && !v.IsNull() {
		if _, _, err := firewall.ParsePortRange(v.ValueString()); err != nil {
			resp.Diagnostics.AddAttributeError(path.Root("port_range"), "Invalid firewall rule", err.Error())
		}
	}
	for field, v := range map[string]types.String{"source": m.Source, "destination": m.Destination} {
		if known(v) && !v.IsNull() {
			if _, err := firewall.ParsePrefix(field, v.ValueString()); err != nil {
				resp.Diagnostics.AddAttributeError(path.Root(field), "Invalid firewall rule", err.Error())
			}
		}
	}
}

// fill sets m from the API's rule. The API keeps rules in canonical form
// (198.51.100.7 as 198.51.100.7/32, ports 1-65535 as none); m's own
// values stay while they canonicalize to the API's rule.
func (m *firewallRuleModel) fill(fr client.FirewallRule) {
	m.ID = types.StringValue(fr.ID)
	m.ServerID = types.StringValue(fr.ServerID)
	api := firewall.Rule{Direction: string(fr.Direction), Protocol: string(fr.Protocol), PortRange: deref(fr.PortRange),
		Source: deref(fr.Source), Destination: deref(fr.Destination), Action: string(fr.Action), Description: fr.Description}
	if mine, err := firewall.Canonicalize(m.rule()); err == nil && mine == api {
		return
	}
	m.Direction = types.StringValue(api.Direction)
	m.Protocol = types.StringValue(api.Protocol)
	m.PortRange = optString(api.PortRange)
	m.Source = optString(api.Source)
	m.Destination = optString(api.Destination)
	m.Action = types.StringValue(api.Action)
	m.Description = types.StringValue(api.Description)
}

// sameRule reports whether the planned rule is the rule in the state,
// once both are in canonical form.
func sameRule(ctx context.Context, req planmodifier.StringRequest) bool {
	var plan, state firewallRuleModel
	if req.Plan.Get(ctx, &plan).HasError() || req.State.Get(ctx, &state).HasError() || !plan.known() {
		return false
	}
	a, err := firewall.Canonicalize(plan.rule())
	if err != nil {
		return false
	}
	b, err := firewall.Canonicalize(state.rule())
	return err == nil && a == b
}

// known reports whether every field of the rule is known.
func (m firewallRuleModel) known() bool {
	for _, v := range []types.String{m.Direction, m.Protocol, m.PortRange, m.Source, m.Destination, m.Action, m.Description} {
		if v.IsUnknown() {
			return false
		}
	}
	return true
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func (r *firewallRuleResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan firewallRuleModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	fr, err := r.client.CreateFirewallRule(ctx, plan.ServerID.ValueString(), client.CreateFirewallRuleRequest{
		Direction: client.Direction(plan.Direction.ValueString()), Protocol: client.Protocol(plan.Protocol.ValueString()),
		PortRange: plan.PortRange.ValueString(), Source: plan.Source.ValueString(), Destination: plan.Destination.ValueString(),
		Action: client.Action(plan.Action.ValueString()), Description: plan.Description.ValueString()})
	if err != nil {
		addError(&resp.Diagnostics, "Cannot create the firewall rule", err, ruleParams...)
		return
	}
	plan.fill(fr)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

// ImportState takes SERVER_ID/RULE_ID.
func (r *firewallRuleResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importChild(ctx, "RULE_ID", "fw_", req, resp)
}

// importChild imports a server's rule or API key by SERVER_ID/ID.
func importChild(ctx context.Context, what, prefix string, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	serverID, id, err := splitID(req.ID, what, prefix)
	if err != nil {
		resp.Diagnostics.AddError("Invalid import ID", err.Error())
		return
	}
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("server_id"), serverID)...)
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("id"), id)...)
}
