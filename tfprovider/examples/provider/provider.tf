# A deployment as code: an SSH key, a server serving a model, its firewall
# rules and an API key; prints the deployment's URL and key.
#
#   export HEARTH_URL=https://control.example.com HEARTH_TOKEN=hct_…
#   terraform apply -var public_key="$(cat ~/.ssh/id_ed25519.pub)"
#   curl "$(terraform output -raw deployment_url)/models" \
#     -H "Authorization: Bearer $(terraform output -raw api_key)"
terraform {
  required_providers {
    hearth = {
      source = "hearthd/hearth"
    }
  }
}

# url, token and ca_file default to HEARTH_URL, HEARTH_TOKEN and
# HEARTH_CA_FILE.
provider "hearth" {}

variable "public_key" {
  description = "An OpenSSH public key line, e.g. the contents of ~/.ssh/id_ed25519.pub."
  type        = string
}

variable "model" {
  description = "The model the deployment serves; changing it switches the model in place."
  type        = string
  default     = "llama3.2:1b"
}

resource "hearth_ssh_key" "laptop" {
  name       = "laptop"
  public_key = trimspace(var.public_key)
}

# Waits until the server runs: its node applied the SSH key and serves
# the model.
resource "hearth_server" "chat" {
  name        = "chat"
  chip        = "cpu"
  ram         = 8
  storage     = 40
  model       = var.model
  ssh_key_ids = [hearth_ssh_key.laptop.id]
}

# Once a direction has an allow rule, the rest of its traffic is dropped:
# allow the deployment API's port as well as SSH.
resource "hearth_firewall_rule" "api" {
  server_id   = hearth_server.chat.id
  direction   = "inbound"
  protocol    = "tcp"
  port_range  = "443"
  action      = "allow"
  description = "the deployment API, from anywhere"
}

resource "hearth_firewall_rule" "ssh" {
  server_id   = hearth_server.chat.id
  direction   = "inbound"
  protocol    = "tcp"
  port_range  = "22"
  source      = "198.51.100.0/24"
  action      = "allow"
  description = "ssh from the office"
}

resource "hearth_api_key" "app" {
  server_id = hearth_server.chat.id
  name      = "my-app"
}

output "deployment_url" {
  value = hearth_server.chat.deployment_url
}

output "api_key" {
  value     = hearth_api_key.app.key
  sensitive = true
}
