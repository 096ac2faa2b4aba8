"""How the pieces run together: the local all-in-one demo and the process harness it uses."""
