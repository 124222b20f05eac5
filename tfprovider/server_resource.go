package tfprovider

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/setplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
)

// Default waits of hearth_server, each overridable in its timeouts block.
// The create and update waits outlast the control plane's default
// provision timeout (10 minutes), after which the server turns failed
// and the wait ends with the node's reason.
const (
	defaultCreateTimeout = 20 * time.Minute
	defaultUpdateTimeout = 20 * time.Minute
	defaultDeleteTimeout = 10 * time.Minute
)

type serverResource struct{ configured }

var (
	_ resource.ResourceWithConfigure   = (*serverResource)(nil)
	_ resource.ResourceWithImportState = (*serverResource)(nil)
	_ resource.ResourceWithModifyPlan  = (*serverResource)(nil)
)

// serverModel is hearth_server's state.
type serverModel struct {
	ID        types.String `tfsdk:"id"`
	Name      types.String `tfsdk:"name"`
	Chip      types.String `tfsdk:"chip"`
	RAM       types.Int64  `tfsdk:"ram"`
	Storage   types.Int64  `tfsdk:"storage"`
	Stack     types.String `tfsdk:"stack"`
	Billing   types.String `tfsdk:"billing"`
	Model     types.String `tfsdk:"model"`
	SSHKeyIDs types.Set    `tfsdk:"ssh_key_ids"`
	// Labels go here (and in the schema, replaced or PATCHed as the API
	// allows) once the management API has them.

	Status        types.String   `tfsdk:"status"`
	IP            types.String   `tfsdk:"ip"`
	DeploymentURL types.String   `tfsdk:"deployment_url"`
	Timeouts      timeouts.Value `tfsdk:"timeouts"`
}

func (r *serverResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_server"
}

func stringValues[T ~string](vs []T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

func (r *serverResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "A rented server. A `deployment` server serves one model at its `deployment_url` (the OpenAI-compatible " +
			"deployment API); a `bare` one serves none. Creating it waits until the server is `running` (its node applied its " +
			"SSH keys and serves the model) and fails with the node's reason if it turns `failed`. Changing `model` switches " +
			"the model in place and waits until the node serves it; any other change replaces the server.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "The server's ID (`srv_…`).",
			},
			"name": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "1–63 lowercase letters, digits and `-`, not starting or ending with `-`; unique in the project.",
			},
			"chip": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "The node's chip family, e.g. `cpu` or `m4`.",
			},
			"ram": schema.Int64Attribute{
				Required: true, PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
				Description: "RAM in GB.",
			},
			"storage": schema.Int64Attribute{
				Required: true, PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
				Description: "Storage in GB.",
			},
			"stack": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString(string(client.StackDeployment)),
				PlanModifiers: replace,
				Validators:    []validator.String{stringvalidator.OneOf(stringValues(client.Stacks())...)},
				Description:   "`deployment` (serves `model`; the default) or `bare` (no model).",
			},
			"billing": schema.StringAttribute{
				Optional: true, Computed: true, Default: stringdefault.StaticString(client.BillingMonthly),
				PlanModifiers: replace,
				Description:   "The billing plan: `monthly`, the one plan.",
			},
			"model": schema.StringAttribute{
				Optional: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplaceIf(
					func(_ context.Context, req planmodifier.StringRequest, resp *stringplanmodifier.RequiresReplaceIfFuncResponse) {
						resp.RequiresReplace = !req.StateValue.IsNull() && req.PlanValue.IsNull()
					}, "Removing the model replaces the server.", "Removing the model replaces the server.")},
				Description: "The model a deployment serves, e.g. `llama3.2:1b` (required for `deployment`, absent for `bare`). " +
					"Changed in place: the node pulls the new model while the old one keeps serving, then switches.",
			},
			"ssh_key_ids": schema.SetAttribute{
				ElementType: types.StringType, Optional: true,
				// None and an empty set are the same to the API (an imported
				// server without keys has none).
				PlanModifiers: []planmodifier.Set{setplanmodifier.RequiresReplaceIf(
					func(_ context.Context, req planmodifier.SetRequest, resp *setplanmodifier.RequiresReplaceIfFuncResponse) {
						resp.RequiresReplace = len(req.StateValue.Elements()) > 0 || len(req.PlanValue.Elements()) > 0 || req.PlanValue.IsUnknown()
					}, "A change replaces the server.", "A change replaces the server.")},
				Description: "IDs of the project's SSH keys (`sk_…`) the server's node lets in.",
			},
			"status": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "`provisioning`, `running`, `updating`, `failed`, `unreachable` or `deleting`.",
			},
			"ip": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "The server's address, once its node reported it.",
			},
			"deployment_url": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "Base URL of the deployment API (`…/api/v1`) for OpenAI SDKs; null for a `bare` server.",
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Update: true, Delete: true,
				CreateDescription: "How long creating waits for `running` (default 20m).",
				UpdateDescription: "How long a model change waits for `running` (default 20m).",
				DeleteDescription: "How long deleting waits until the node wiped the server (default 10m)."}),
		},
	}
}

// ModifyPlan leaves the status unknown when the model changes: the
// server then goes from whatever it is (failed, say) to running, while
// other changes keep the status the state has.
func (r *serverResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.State.Raw.IsNull() || req.Plan.Raw.IsNull() {
		return
	}
	var planModel, stateModel types.String
	resp.Diagnostics.Append(req.Plan.GetAttribute(ctx, path.Root("model"), &planModel)...)
	resp.Diagnostics.Append(req.State.GetAttribute(ctx, path.Root("model"), &stateModel)...)
	if !resp.Diagnostics.HasError() && !planModel.Equal(stateModel) {
		resp.Diagnostics.Append(resp.Plan.SetAttribute(ctx, path.Root("status"), types.StringUnknown())...)
	}
}

func (r *serverResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.configure(req.ProviderData, &resp.Diagnostics)
}

// serverParams are the attributes of a server the API names as the
// resource does: its errors on them are shown on the attribute.
var serverParams = []string{"name", "chip", "ram", "storage", "stack", "billing", "model", "ssh_key_ids"}

// fill sets m's attributes from the API's server, keeping m's null for
// an empty ssh_key_ids (the API lists none as []).
func (m *serverModel) fill(ctx context.Context, s client.Server) diag.Diagnostics {
	m.ID = types.StringValue(s.ID)
	m.Name = types.StringValue(s.Name)
	m.Chip = types.StringValue(s.Chip)
	m.RAM = types.Int64Value(int64(s.RAM))
	m.Storage = types.Int64Value(int64(s.Storage))
	m.Stack = types.StringValue(string(s.Stack))
	m.Billing = types.StringValue(s.Billing)
	m.Model = optString(s.Model)
	m.Status = types.StringValue(string(s.Status))
	m.IP = optStringPtr(s.IP)
	m.DeploymentURL = optString(s.DeploymentURL)
	if len(s.SSHKeyIDs) == 0 && m.SSHKeyIDs.IsNull() {
		return nil
	}
	var diags diag.Diagnostics
	m.SSHKeyIDs, diags = types.SetValueFrom(ctx, types.StringType, s.SSHKeyIDs)
	return diags
}

func (r *serverResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan serverModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	wait, diags := plan.Timeouts.Create(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	cr := client.CreateServerRequest{Name: plan.Name.ValueString(), Chip: plan.Chip.ValueString(),
		RAM: int(plan.RAM.ValueInt64()), Storage: int(plan.Storage.ValueInt64()), Stack: client.Stack(plan.Stack.ValueString()),
		Model: plan.Model.ValueString(), Billing: plan.Billing.ValueString()}
	resp.Diagnostics.Append(plan.SSHKeyIDs.ElementsAs(ctx, &cr.SSHKeyIDs, false)...)
	if resp.Diagnostics.HasError() {
		return
	}
	srv, err := r.client.CreateServer(ctx, cr)
	if err != nil {
		addError(&resp.Diagnostics, "Cannot create the server", err, serverParams...)
		return
	}
	// Kept at once: if the wait fails, Terraform still knows the server
	// (tainted, to be replaced) rather than leaving it behind.
	resp.Diagnostics.Append(plan.fill(ctx, srv)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	srv, err = r.waitRunning(ctx, srv, wait)
	resp.Diagnostics.Append(plan.fill(ctx, srv)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
	if err != nil {
		resp.Diagnostics.AddError("The server did not reach running", err.Error())
	}
}

// waitRunning waits up to limit for srv to be running, returning the
// last server seen and why it is not running.
func (r *serverResource) waitRunning(ctx context.Context, srv client.Server, limit time.Duration) (client.Server, error) {
	wctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	last := srv
	got, err := r.client.WaitServerRunning(wctx, srv.ID, client.WaitOptions{Interval: time.Second, Progress: func(s client.Server) { last = s }})
	if err == nil {
		return got, nil
	}
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		err = fmt.Errorf("server %s still %s after %v: %s", srv.ID, last.Status, limit, client.Diagnose(last))
	}
	return last, err
}

func (r *serverResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state serverModel
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	srv, err := r.client.GetServer(ctx, state.ID.ValueString())
	// A server being deleted is as good as gone: the next plan creates it
	// again.
	if client.IsNotFound(err) || err == nil && srv.Status == client.StatusDeleting {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Cannot read the server", err)
		return
	}
	resp.Diagnostics.Append(state.fill(ctx, srv)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
}

func (r *serverResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state serverModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// Everything but the model and the timeouts forces a replacement.
	if plan.Model.Equal(state.Model) {
		resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
		return
	}
	wait, diags := plan.Timeouts.Update(ctx, defaultUpdateTimeout)
	resp.Diagnostics.Append(diags...)
	if resp.Diagnostics.HasError() {
		return
	}
	srv, err := r.client.UpdateServer(ctx, state.ID.ValueString(), client.UpdateServerRequest{Model: plan.Model.ValueString()})
	if err != nil {
		addError(&resp.Diagnostics, "Cannot change the server's model", err, serverParams...)
		return
	}
	srv, err = r.waitRunning(ctx, srv, wait)
	resp.Diagnostics.Append(plan.fill(ctx, srv)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
	if err != nil {
		resp.Diagnostics.AddError("The server did not reach running with the new model", err.Error())
	}
}

func (r *serverResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state serverModel
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	wait, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	if resp.Diagnostics.HasError() {
		return
	}
	id := state.ID.ValueString()
	err := r.client.DeleteServer(ctx, id)
	if client.IsNotFound(err) {
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Cannot delete the server", err)
		return
	}
	// Until its node has wiped it the server keeps its name, so a
	// replacement of the same name would be refused.
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if err := r.client.WaitServerGone(wctx, id, client.WaitOptions{Interval: time.Second}); err != nil {
		resp.Diagnostics.AddError("The server was not wiped in time",
			fmt.Sprintf("server %s is being deleted but its node has not reported the wipe after %v: %v", id, wait, err))
	}
}

func (r *serverResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}
