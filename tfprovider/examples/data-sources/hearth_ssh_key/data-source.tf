# A key registered with `hearth ssh-key add`.
data "hearth_ssh_key" "laptop" {
  fingerprint = "SHA256:uNiVztksCsDhcc0u9e8BujQXVUpKZIDTMczCvj3tD2s"
}

resource "hearth_server" "chat" {
  name        = "chat"
  chip        = "cpu"
  ram         = 8
  storage     = 40
  model       = "llama3.2:1b"
  ssh_key_ids = [data.hearth_ssh_key.laptop.id]
}
