"""The `fleetq` command: server, migrate, apply, demo and the operator's verbs."""
