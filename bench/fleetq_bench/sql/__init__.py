"""The benchmarks' SQL: what they read back from fleetq's schema (`bench.sql`,
`bench_scale.sql`), the server's counters, the floor, and the peers' own tables. Looked up
by name through `fleetq.core.queries.Library`, as fleetq's own blocks are."""

from fleetq.core.queries import Library

SQL = Library(__name__)
