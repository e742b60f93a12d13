"""fleetq: a fleet job queue on PostgreSQL."""

__version__ = "0.1.0"
