resource "hearth_server" "chat" {
  name        = "chat"
  chip        = "cpu"
  ram         = 8
  storage     = 40
  model       = "llama3.2:1b"
  ssh_key_ids = [hearth_ssh_key.laptop.id]

  # The node may pull a large model first.
  timeouts {
    create = "30m"
    update = "30m"
  }
}

resource "hearth_ssh_key" "laptop" {
  name       = "laptop"
  public_key = trimspace(file("~/.ssh/id_ed25519.pub"))
}

output "deployment_url" {
  value = hearth_server.chat.deployment_url
}
