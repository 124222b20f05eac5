data "hearth_server" "chat" {
  name = "chat"
}

# Once a direction has an allow rule, the rest of its traffic is dropped.
resource "hearth_firewall_rule" "api" {
  server_id   = data.hearth_server.chat.id
  direction   = "inbound"
  protocol    = "tcp"
  port_range  = "443"
  action      = "allow"
  description = "the deployment API, from anywhere"
}

resource "hearth_firewall_rule" "ssh" {
  server_id   = data.hearth_server.chat.id
  direction   = "inbound"
  protocol    = "tcp"
  port_range  = "22"
  source      = "198.51.100.0/24"
  action      = "allow"
  description = "ssh from the office"
}

resource "hearth_firewall_rule" "no_smtp" {
  server_id   = data.hearth_server.chat.id
  direction   = "outbound"
  protocol    = "tcp"
  port_range  = "25"
  action      = "deny"
  description = "no mail from the box"
}
