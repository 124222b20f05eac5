package tfprovider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
	"github.com/hearthd/hearth/sshkeys"
)

type sshKeyResource struct {
	immutable[sshKeyModel, client.SSHKey, *sshKeyModel]
}

func newSSHKeyResource() resource.Resource {
	return &sshKeyResource{immutable[sshKeyModel, client.SSHKey, *sshKeyModel]{what: "SSH key",
		get: func(c *client.Client, ctx context.Context, _, id string) (client.SSHKey, error) {
			return c.GetSSHKey(ctx, id)
		},
		del: func(c *client.Client, ctx context.Context, _, id string) error { return c.DeleteSSHKey(ctx, id) }}}
}

func (m *sshKeyModel) ids() (string, string) { return "", m.ID.ValueString() }

var (
	_ resource.ResourceWithConfigure   = (*sshKeyResource)(nil)
	_ resource.ResourceWithImportState = (*sshKeyResource)(nil)
)

type sshKeyModel struct {
	ID          types.String `tfsdk:"id"`
	Name        types.String `tfsdk:"name"`
	PublicKey   types.String `tfsdk:"public_key"`
	Fingerprint types.String `tfsdk:"fingerprint"`
	Type        types.String `tfsdk:"type"`
	Bits        types.Int64  `tfsdk:"bits"`
}

func (r *sshKeyResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_ssh_key"
}

func (r *sshKeyResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		Description: "An SSH public key of the project, which servers list in `ssh_key_ids` to let it in. Any change " +
			"replaces it; deleting it removes it from every server.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The key's ID (`sk_…`)."},
			"name": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "1–100 characters, no control characters or surrounding spaces.",
			},
			"public_key": schema.StringAttribute{
				Required: true, PlanModifiers: []planmodifier.String{replaceUnlessSame(samePublicKey)},
				Validators: []validator.String{publicKeyValidator{}},
				Description: "One OpenSSH public key line: type, base64 key, optional comment (no options, no line break: " +
					"`trimspace(file(\"~/.ssh/id_ed25519.pub\"))`). Checked at plan time. Unique in the project.",
			},
			"fingerprint": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "`SHA256:…`, as `ssh-keygen -lf` prints it.",
			},
			"type": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The key type, e.g. `ssh-ed25519`."},
			"bits": schema.Int64Attribute{
				Computed: true, PlanModifiers: []planmodifier.Int64{int64planmodifier.UseStateForUnknown()},
				Description: "The key's size in bits.",
			},
		},
	}
}

// publicKeyValidator checks a public key with the parser the management
// API uses, so a key it would refuse fails the plan with its message.
type publicKeyValidator struct{}

func (publicKeyValidator) Description(context.Context) string {
	return "must be an OpenSSH public key line the management API accepts"
}

func (v publicKeyValidator) MarkdownDescription(ctx context.Context) string {
	return v.Description(ctx)
}

func (publicKeyValidator) ValidateString(_ context.Context, req validator.StringRequest, resp *validator.StringResponse) {
	if req.ConfigValue.IsNull() || req.ConfigValue.IsUnknown() {
		return
	}
	if _, err := sshkeys.Parse(req.ConfigValue.ValueString()); err != nil {
		resp.Diagnostics.AddAttributeError(req.Path, "Invalid SSH public key", err.Error())
	}
}

// samePublicKey reports whether the planned key is the state's, as the
// API stores it (trimmed).
func samePublicKey(_ context.Context, req planmodifier.StringRequest) bool {
	a, err1 := sshkeys.Parse(req.PlanValue.ValueString())
	b, err2 := sshkeys.Parse(req.StateValue.ValueString())
	return err1 == nil && err2 == nil && a.Line == b.Line
}

// fill sets m from the API's key. The API keeps a key in canonical form
// (trimmed); m's own public_key stays when it is the same key.
func (m *sshKeyModel) fill(k client.SSHKey) {
	m.ID = types.StringValue(k.ID)
	m.Name = types.StringValue(k.Name)
	if pk, err := sshkeys.Parse(m.PublicKey.ValueString()); m.PublicKey.IsNull() || err != nil || pk.Line != k.PublicKey {
		m.PublicKey = types.StringValue(k.PublicKey)
	}
	m.Fingerprint = types.StringValue(k.Fingerprint)
	m.Type = types.StringValue(k.Type)
	m.Bits = types.Int64Value(int64(k.Bits))
}

func (r *sshKeyResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan sshKeyModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	k, err := r.client.CreateSSHKey(ctx, client.CreateSSHKeyRequest{Name: plan.Name.ValueString(), PublicKey: plan.PublicKey.ValueString()})
	if err != nil {
		addError(&resp.Diagnostics, "Cannot create the SSH key", err, "name", "public_key")
		return
	}
	plan.fill(k)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *sshKeyResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughID(ctx, path.Root("id"), req, resp)
}
