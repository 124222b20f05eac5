# An SSH key by its ID.
terraform import hearth_ssh_key.laptop sk_7TnW2qLc9XbR4mYv0KdJ6sHa
