data "hearth_server" "chat" {
  name = "chat"
}

output "chat_url" {
  value = data.hearth_server.chat.deployment_url
}
