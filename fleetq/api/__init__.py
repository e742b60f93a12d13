"""The HTTP producer API (`fleetq api`): submit, status, result, cancel, health."""
