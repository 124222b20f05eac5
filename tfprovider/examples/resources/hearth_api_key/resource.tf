data "hearth_server" "chat" {
  name = "chat"
}

resource "hearth_api_key" "app" {
  server_id           = data.hearth_server.chat.id
  name                = "my-app"
  expires_at          = "2030-01-01T00:00:00Z"
  requests_per_minute = 600
  tokens_per_minute   = 200000

  # Rotating (a new name, limits or expiry): the new key first.
  lifecycle {
    create_before_destroy = true
  }
}

output "api_key" {
  value     = hearth_api_key.app.key
  sensitive = true
}
