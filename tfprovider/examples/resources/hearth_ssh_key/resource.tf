resource "hearth_ssh_key" "laptop" {
  name       = "laptop"
  public_key = trimspace(file("~/.ssh/id_ed25519.pub"))
}
