"""PgBouncer for the tests (the helper lives with the scale benchmark, which uses it too)."""

from __future__ import annotations

import pytest

from fleetq_bench.pgbouncer import PgBouncer, installed

__all__ = ["PgBouncer", "require"]


def require() -> None:
    """Skip the test unless PgBouncer is installed (`apt-get install pgbouncer`)."""
    if not installed():
        pytest.skip("PgBouncer is not installed (apt-get install pgbouncer)")
