"""No time fleetq writes lies in the future: every stamp (created, claimed, started,
finished, heartbeat, stop requested...) is the database's clock when it was written.

Checked on every test database before it is dropped, so the whole suite watches every
path that stamps a row: a stamp from a wrong clock or an offset one (a renewal's
arithmetic landing in `finished_at`, a caller's time taken for the server's) fails the
test that wrote it. Deadlines are the future by design and are left out.
"""

from __future__ import annotations

import psycopg

# How the check fails a test (scripts/mutant_worker.py counts it a catch: it fails in the
# test database's teardown, not in the test's call).
FAILURE = "a time written from the future"

# Columns that hold a time to come, or a time the caller names, not a time something
# happened by the database's clock.
NOT_STAMPS = frozenset(
    {
        "lease_expires_at",  # a lease runs until then
        "retry_at",  # a failed job is queued again then
        "resolving_until",  # a schedule's turn is held until then
        "holder_until",  # a runner id held through the API runs until then
        "tick",  # a schedule's tick: when it is due, named by who fires it
        "last_tick",
        "resolving_tick",
        "queue_samples.at",  # the sampler's clock, which a caller may give (p_now)
        "process_started_at",  # the node's clock, as it reported it: evidence, not a date
    }
)


def future_stamps(dsn: str) -> list[str]:
    """`table.column = value` for every stamp later than the database's clock now."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name FROM information_schema.columns c "
            "JOIN information_schema.tables t USING (table_schema, table_name) "
            "WHERE c.table_schema = 'fleetq' AND t.table_type = 'BASE TABLE' "
            "AND c.data_type = 'timestamp with time zone' ORDER BY 1, 2"
        ).fetchall()
        checked = [(t, c) for t, c in columns if not {c, f"{t}.{c}"} & NOT_STAMPS]
        if not checked:
            return []
        query = " UNION ALL ".join(
            f"(SELECT '{t}.{c} = ' || {c}::text FROM fleetq.{t} "
            f"WHERE {c} > clock_timestamp() LIMIT 1)"
            for t, c in checked
        )
        return [row[0] for row in conn.execute(query).fetchall()]
