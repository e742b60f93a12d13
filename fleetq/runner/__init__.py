"""`fleetq-runner`: claims, stages, runs and reports jobs on one node (arrives with its issue)."""
