# A server by its ID.
terraform import hearth_server.chat srv_4bQ2gN7kYxV1mP0sLr8tZc3W
