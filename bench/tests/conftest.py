"""fleetq's own fixtures: the real PostgreSQL of the session (embedded, or
FLEETQ_TEST_DSN), the migrated template and a database or a rolled-back transaction per
test, as every test of fleetq gets them."""

pytest_plugins = ["tests.conftest"]
