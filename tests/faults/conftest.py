"""The fault suite shares the end-to-end fixtures: real runner processes, a real
repository, and a PostgreSQL of the test's own where the test restarts it."""

from tests.e2e.conftest import fleet_dsn, repo, start_runner
from tests.e2e.test_faults import own_server

__all__ = ["fleet_dsn", "own_server", "repo", "start_runner"]
