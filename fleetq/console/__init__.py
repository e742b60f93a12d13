"""`fleetq-console`: the operator's live Textual view of the fleet (arrives with its issue)."""
