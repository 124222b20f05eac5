# A key by its server's ID and its own. The secret is not imported: only
# the create shows it.
terraform import hearth_api_key.app srv_4bQ2gN7kYxV1mP0sLr8tZc3W/dk_2HsK8vQx5NmW0cLp7RtY3bZe
