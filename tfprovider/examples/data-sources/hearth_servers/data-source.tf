data "hearth_servers" "failed" {
  status = "failed"
}

output "failed_servers" {
  value = [for s in data.hearth_servers.failed.servers : s.name]
}
