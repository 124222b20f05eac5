package tfprovider

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/hearthd/hearth/client"
)

// configured is what every resource and data source keeps from the
// provider: its client, nil until the provider is configured (Terraform
// validates configurations before that).
type configured struct {
	client *client.Client
}

// configure takes the provider's client from data, which is nil before
// the provider is configured.
func (c *configured) configure(data any, diags *diag.Diagnostics) {
	if data == nil {
		return
	}
	cl, ok := data.(*client.Client)
	if !ok {
		diags.AddError("Unexpected provider data", fmt.Sprintf("want a *client.Client, got %T", data))
		return
	}
	c.client = cl
}

// addError reports err under summary. An APIError whose param is one of
// attrs (the resource's attributes the API knows by the same name) is put
// on that attribute, as Terraform shows a validation error.
func addError(diags *diag.Diagnostics, summary string, err error, attrs ...string) {
	var apiErr client.APIError
	if errors.As(err, &apiErr) && apiErr.Param != "" && slices.Contains(attrs, apiErr.Param) {
		diags.AddAttributeError(path.Root(apiErr.Param), summary, err.Error())
		return
	}
	diags.AddError(summary, err.Error())
}

// optString is s as an optional attribute: null when empty.
func optString(s string) types.String {
	if s == "" {
		return types.StringNull()
	}
	return types.StringValue(s)
}

// optStringPtr is *p as an optional attribute: null when nil.
func optStringPtr(p *string) types.String {
	if p == nil {
		return types.StringNull()
	}
	return types.StringValue(*p)
}

// splitID splits an import ID of the form "srv_…/fw_…" (a server's
// firewall rule or API key) into the server's ID and the child's; what
// and prefix name the child in the error.
func splitID(id, what, prefix string) (serverID, childID string, err error) {
	serverID, childID, ok := strings.Cut(id, "/")
	if !ok || serverID == "" || childID == "" || strings.Contains(childID, "/") {
		return "", "", fmt.Errorf("want SERVER_ID/%s (e.g. srv_…/%s…), got %q", what, prefix, id)
	}
	return serverID, childID, nil
}

// replaceUnlessSame replaces the resource when the attribute changes,
// unless same reports that the old and new values are one to the API
// (an address and its /32, a time in another offset): that change is
// only the state's, made in place. It lets a configuration written one
// way keep a resource imported in the API's canonical form.
func replaceUnlessSame(same func(ctx context.Context, req planmodifier.StringRequest) bool) planmodifier.String {
	const desc = "A change replaces the resource unless the API takes the new value for the old one."
	return stringplanmodifier.RequiresReplaceIf(
		func(ctx context.Context, req planmodifier.StringRequest, resp *stringplanmodifier.RequiresReplaceIfFuncResponse) {
			resp.RequiresReplace = req.PlanValue.IsUnknown() || !same(ctx, req)
		}, desc, desc)
}

// apiState is the state model M of a resource the API only creates and
// deletes, through its pointer: it takes the API's object A and names it.
type apiState[M, A any] interface {
	*M
	fill(A)
	// ids is what the API finds the object by: its server's ID (for a
	// rule or an API key; else "") and its own.
	ids() (serverID, id string)
}

// immutable is the Configure, Read, Update and Delete of such a
// resource: read and delete by ID, a 404 (the object or its server gone
// outside Terraform) dropping it from the state; an Update only records
// a value written another way (see replaceUnlessSame), as any change the
// API would have to make replaces the resource.
type immutable[M, A any, P apiState[M, A]] struct {
	configured
	what string // for errors: "SSH key"
	get  func(c *client.Client, ctx context.Context, serverID, id string) (A, error)
	del  func(c *client.Client, ctx context.Context, serverID, id string) error
}

func (r *immutable[M, A, P]) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.configure(req.ProviderData, &resp.Diagnostics)
}

func (r *immutable[M, A, P]) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state M
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	serverID, id := P(&state).ids()
	obj, err := r.get(r.client, ctx, serverID, id)
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Cannot read the "+r.what, err)
		return
	}
	P(&state).fill(obj)
	resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
}

func (r *immutable[M, A, P]) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan M
	resp.Diagnostics.Append(req.Plan.Get(ctx, &plan)...)
	resp.Diagnostics.Append(resp.State.Set(ctx, &plan)...)
}

func (r *immutable[M, A, P]) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state M
	resp.Diagnostics.Append(req.State.Get(ctx, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	serverID, id := P(&state).ids()
	if err := r.del(r.client, ctx, serverID, id); err != nil && !client.IsNotFound(err) {
		addError(&resp.Diagnostics, "Cannot delete the "+r.what, err)
	}
}
