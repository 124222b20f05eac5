# A rule by its server's ID and its own.
terraform import hearth_firewall_rule.ssh srv_4bQ2gN7kYxV1mP0sLr8tZc3W/fw_9pLm3RtX6cVb1NqZ8wEy2KsD
