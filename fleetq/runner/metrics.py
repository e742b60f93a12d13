"""Prometheus metrics of one runner (`--metrics-port`), in a registry of its own."""

from __future__ import annotations

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REGISTRY = CollectorRegistry()
CLAIMS = Counter("fleetq_claims", "Jobs claimed", ["lane"], registry=REGISTRY)
STARTS = Counter("fleetq_starts", "Start reports sent", registry=REGISTRY)
OUTCOMES = Counter("fleetq_outcomes", "Outcomes recorded", ["outcome"], registry=REGISTRY)
# kind: "zombie" (the lease had moved on) or "self_race" (the write raced this runner's
# own committed outcome or hand-back: benign)
STALE = Counter(
    "fleetq_stale_lease_rejections",
    "Fenced writes refused as stale",
    ["write", "kind"],
    registry=REGISTRY,
)
HEARTBEAT_LAG = Gauge(
    "fleetq_heartbeat_lag_seconds", "Time the last heartbeat round trip took", registry=REGISTRY
)
HANDLER_RERUNS = Counter(
    "fleetq_handler_reruns",
    "Handler runs started again in place after their database connection was cut",
    registry=REGISTRY,
)
# kind: "claim" (the claim loop's) or "refill" (sent with a batch of outcomes)
EMPTY_CLAIMS = Counter(
    "fleetq_empty_claims", "Claim calls that took nothing", ["kind"], registry=REGISTRY
)
SLOTS_IN_USE = Gauge("fleetq_slots_in_use", "Executions running", ["lane"], registry=REGISTRY)


@functools.cache
def outcome(name: str) -> Counter:
    """The outcome counter's child for `name` (looked up once: this is the hot path)."""
    return OUTCOMES.labels(name)


def serve(port: int, host: str = "127.0.0.1") -> None:
    """Serve /metrics in a background thread."""
    start_http_server(port, addr=host, registry=REGISTRY)
