// Command terraform-provider-hearth is hearth's Terraform provider (see
// tfprovider and docs/terraform/). Terraform starts it; run by hand with
// --debug it serves for a debugger and prints the TF_REATTACH_PROVIDERS
// value to give Terraform.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/hashicorp/terraform-plugin-framework/providerserver"

	"github.com/hearthd/hearth/tfprovider"
)

// version is set at build time (-X main.version=…).
var version = "dev"

func main() {
	debug := flag.Bool("debug", false, "serve for a debugger: print TF_REATTACH_PROVIDERS instead of waiting for Terraform to start the provider")
	flag.Parse()
	err := providerserver.Serve(context.Background(), tfprovider.New(version), providerserver.ServeOpts{
		Address: tfprovider.Address,
		Debug:   *debug,
	})
	if err != nil {
		slog.Error("terraform-provider-hearth", "err", err)
		os.Exit(1)
	}
}
