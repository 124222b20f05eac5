package tfprovider

import (
	"context"
	"time"

	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64default"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/int64planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
)

type apiKeyResource struct {
	immutable[apiKeyModel, client.APIKey, *apiKeyModel]
}

func newAPIKeyResource() resource.Resource {
	return &apiKeyResource{immutable[apiKeyModel, client.APIKey, *apiKeyModel]{what: "API key",
		get: (*client.Client).GetAPIKey,
		del: (*client.Client).DeleteAPIKey}}
}

func (m *apiKeyModel) ids() (string, string) { return m.ServerID.ValueString(), m.ID.ValueString() }

var (
	_ resource.ResourceWithConfigure   = (*apiKeyResource)(nil)
	_ resource.ResourceWithImportState = (*apiKeyResource)(nil)
)

type apiKeyModel struct {
	ID                types.String `tfsdk:"id"`
	ServerID          types.String `tfsdk:"server_id"`
	Name              types.String `tfsdk:"name"`
	ExpiresAt         types.String `tfsdk:"expires_at"`
	RequestsPerMinute types.Int64  `tfsdk:"requests_per_minute"`
	TokensPerMinute   types.Int64  `tfsdk:"tokens_per_minute"`
	Key               types.String `tfsdk:"key"`
	Hint              types.String `tfsdk:"hint"`
	CreatedAt         types.String `tfsdk:"created_at"`
}

// apiKeyParams are the attributes the API names as the resource does.
var apiKeyParams = []string{"server_id", "name", "expires_at", "requests_per_minute", "tokens_per_minute"}

func (r *apiKeyResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_api_key"
}

func (r *apiKeyResource) Schema(_ context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	limit := func(what string) schema.Int64Attribute {
		return schema.Int64Attribute{
			Optional: true, Computed: true, Default: int64default.StaticInt64(0),
			PlanModifiers: []planmodifier.Int64{int64planmodifier.RequiresReplace()},
			Description:   what + " per minute the node lets the key use, 0 (the default) to 1 000 000 000; 0 is unlimited.",
		}
	}
	resp.Schema = schema.Schema{
		Description: "A deployment API key (`hearth_live_…`) of a deployment server, for OpenAI SDKs at its " +
			"`deployment_url`. The secret, `key`, is known only when the key is created: it is kept in the state " +
			"(sensitive) and is null for an imported key. Any change replaces the key (rotation: a new key, then the old " +
			"one deleted; `lifecycle { create_before_destroy = true }` keeps one working throughout).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "The key's ID (`dk_…`)."},
			"server_id": schema.StringAttribute{
				Required: true, PlanModifiers: replace, Description: "The deployment server's ID (`srv_…`).",
			},
			"name": schema.StringAttribute{
				Required: true, PlanModifiers: replace,
				Description: "1–100 characters, no control characters or surrounding spaces; need not be unique.",
			},
			"expires_at": schema.StringAttribute{
				Optional: true, PlanModifiers: []planmodifier.String{replaceUnlessSame(sameExpiry)},
				Validators: []validator.String{rfc3339Validator{}},
				Description: "When the key stops working, an RFC 3339 time in the future (kept to the second), e.g. " +
					"`2030-01-01T00:00:00Z`; absent: never.",
			},
			"requests_per_minute": limit("Requests"),
			"tokens_per_minute":   limit("Tokens (prompt and completion)"),
			"key": schema.StringAttribute{
				Computed: true, Sensitive: true, PlanModifiers: keep,
				Description: "The secret (`hearth_live_…`), sent as `Authorization: Bearer …`. Known only from the create; " +
					"null for an imported key.",
			},
			"hint": schema.StringAttribute{
				Computed: true, PlanModifiers: keep,
				Description: "`hearth_live_…` and the secret's last 4 characters, to recognise it.",
			},
			"created_at": schema.StringAttribute{Computed: true, PlanModifiers: keep, Description: "RFC 3339, UTC."},
		},
	}
}

// rfc3339Validator refuses a time the management API could not parse.
type rfc3339Validator struct{}

func (rfc3339Validator) Description(context.Context) string { return "must be an RFC 3339 time" }

func (v rfc3339Validator) MarkdownDescription(ctx context.Context) string { return v.Description(ctx) }

func (rfc3339Validator) ValidateString(_ context.Context, req validator.StringRequest, resp *validator.StringResponse) {
	if req.ConfigValue.IsNull() || req.ConfigValue.IsUnknown() {
		return
	}
	if _, err := time.Parse(time.RFC3339, req.ConfigValue.ValueString()); err != nil {
		resp.Diagnostics.AddAttributeError(req.Path, "Invalid time", "expires_at must be an RFC 3339 time, e.g. 2030-01-01T00:00:00Z: "+err.Error())
	}
}

// sameExpiry reports whether the planned expiry is the state's second.
func sameExpiry(_ context.Context, req planmodifier.StringRequest) bool {
	a, err1 := time.Parse(time.RFC3339, req.PlanValue.ValueString())
	b, err2 := time.Parse(time.RFC3339, req.StateValue.ValueString())
	return err1 == nil && err2 == nil && a.Truncate(time.Second).Equal(b.Truncate(time.Second))
}

// fill sets m from the API's key; the secret is not in it. m's own
// expires_at stays while it is the same second.
func (m *apiKeyModel) fill(k client.APIKey) {
	m.ID = types.StringValue(k.ID)
	m.ServerID = types.StringValue(k.ServerID)
	m.Name = types.StringValue(k.Name)
	mine, err := time.Parse(time.RFC3339, m.ExpiresAt.ValueString())
	switch {
	case k.ExpiresAt == nil:
		m.ExpiresAt = types.StringNull()
	case m.ExpiresAt.IsNull() || err != nil || !mine.Truncate(time.Second).Equal(*k.ExpiresAt):
		m.ExpiresAt = types.StringValue(k.ExpiresAt.UTC().Format(time.RFC3339))
	}
	m.RequestsPerMinute = types.Int64Value(int64(k.RequestsPerMinute))
	m.TokensPerMinute = types.Int64Value(int64(k.TokensPerMinute))
	m.Hint = types.StringValue(k.Hint)
	m.CreatedAt = types.StringValue(k.CreatedAt.UTC().Format(time.RFC3339))
	if m.Key.IsUnknown() {
		m.Key = types.StringNull()
	}
}

func (r *apiKeyResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan apiKeyModel
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	cr := client.CreateAPIKeyRequest{Name: plan.Name.ValueString(),
		RequestsPerMinute: int(plan.RequestsPerMinute.ValueInt64()), TokensPerMinute: int(plan.TokensPerMinute.ValueInt64())}
	if !plan.ExpiresAt.IsNull() {
		t, err := time.Parse(time.RFC3339, plan.ExpiresAt.ValueString())
		if err != nil { // checked by the validator already
			resp.Diagnostics.AddError("Invalid expires_at", err.Error())
			return
		}
		cr.ExpiresAt = &t
	}
	k, err := r.client.CreateAPIKey(ctx, plan.ServerID.ValueString(), cr)
	if err != nil {
		addError(&resp.Diagnostics, "Cannot create the API key", err, apiKeyParams...)
		return
	}
	plan.Key = optStringPtr(k.Key)
	if k.Key == nil {
		resp.Diagnostics.AddWarning("The API key's secret is unknown",
			"The create was answered as a replay of an earlier attempt whose answer was lost, and the secret is only in "+
				"that first answer. Replace the key to get one: terraform apply -replace=<this resource>.")
	}
	plan.fill(k.APIKey)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

// ImportState takes SERVER_ID/KEY_ID. The secret cannot be imported.
func (r *apiKeyResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importChild(ctx, "KEY_ID", "dk_", req, resp)
}
