"""A pytest plugin that judges many SQL mutants in one test session (scripts/mutants.py).

Why: a mutant run as a pytest process of its own paid the interpreter's start, the
collection and a template migrated from nothing, about 1.8 s of CPU, before its first
test; with a mutant for every guard that was most of CI's time. Here one session
collects the protocol tests once and, for each mutant it is sent, writes the mutated
protocol file into its scratch copy, re-applies it to the session's live databases with
`fleetq migrate`'s own code (protocol files are CREATE OR REPLACE, re-applied when their
text changes), runs the tests asked for until one fails, and puts the file back the
same way. Databases made after that (every test's own, cloned from the template) carry
the mutant; a test that migrates a database itself reads the mutated file.

Loaded as `-p mutant_worker` from the scratch copy's root. Jobs arrive as JSON lines
on the file descriptor in $FLEETQ_MUTANT_IN (with `budget_s`, a job stops, not judged,
once that much time has passed: for trying out candidates); each verdict goes back as a
JSON line on $FLEETQ_MUTANT_OUT.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _pytest.nodes import Node
from _pytest.runner import runtestprotocol

from fleetq.core import migrate
from fleetq.core.db import with_database
from tests.stamps import FAILURE

IN = "FLEETQ_MUTANT_IN"
OUT = "FLEETQ_MUTANT_OUT"


def selected(nodeid: str, wanted: list[str]) -> bool:
    """Whether a test is one of `wanted` (files, or node ids with or without parameters)."""
    return any(nodeid == w or nodeid.startswith((w + "::", w + "[")) for w in wanted)


def _live_databases(server: str) -> list[str]:
    """This session's databases that hold a fleetq schema now: between two tests only
    those of session- and module-scoped fixtures (the template, the shared one, a
    served API's) are alive; tests name theirs fleetq_test_PID_..."""
    pattern = f"fleetq_test_{os.getpid()}\\_%"
    with psycopg.connect(server, autocommit=True, connect_timeout=10) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", [pattern]
            )
        ]
    live = []
    for name in names:
        with psycopg.connect(with_database(server, name), connect_timeout=10) as conn:
            row = conn.execute("SELECT to_regnamespace('fleetq') IS NOT NULL").fetchone()
            if row is not None and row[0]:
                live.append(name)
    return live


def _remigrate(server: str) -> None:
    """Re-apply the protocol files whose text changed to every live database."""
    for name in _live_databases(server):
        migrate.migrate(with_database(server, name))


def _common(a: Node, b: Node | None, session: pytest.Session) -> Node:
    """The deepest node both descend from: what stays set up between them."""
    if b is None:
        return session
    chain = b.listchain()
    keep: Node = session
    for node in a.listchain():
        if node in chain and node is not a:
            keep = node
    return keep


def _judge(
    session: pytest.Session, job: dict[str, Any], protocol: Path, server: str
) -> dict[str, Any]:
    """Run one job's test groups with its mutated file in place; the first group with a
    failing test catches it."""
    start = time.monotonic()
    path = protocol / str(job["file"])
    original = path.read_text()

    def verdict(caught: bool, by: str) -> dict[str, Any]:
        return {
            "name": job["name"],
            "caught": caught,
            "by": by,
            "seconds": time.monotonic() - start,
        }

    path.write_text(str(job["text"]))
    try:
        try:
            _remigrate(server)
        except Exception as exc:  # the mutated SQL does not even apply: proves nothing
            return verdict(False, f"not judged: migrate failed: {exc}"[:300])
        for group in job["groups"]:
            chosen = [i for i in session.items if selected(i.nodeid, list(group))]
            if not chosen:  # a `first` naming no test would run every protocol test instead
                return verdict(False, f"not judged: no test is {', '.join(group)}")
            for index, item in enumerate(chosen):
                if "budget_s" in job and time.monotonic() - start > float(job["budget_s"]):
                    session._setupstate.teardown_exact(session)  # type: ignore[arg-type]
                    return verdict(False, "not judged: out of time")
                following = chosen[index + 1] if index + 1 < len(chosen) else None
                keep = _common(item, following, session)
                # `nextitem` only says which fixtures stay set up: the node kept
                reports = runtestprotocol(item, log=False, nextitem=keep)  # type: ignore[arg-type]
                for report in reports:
                    if report.failed:
                        if following is not None:  # stop here: tear down to the session
                            session._setupstate.teardown_exact(session)  # type: ignore[arg-type]
                        # a failed call, or a stamp from the future (tests/stamps.py)
                        if report.when == "call" or FAILURE in str(report.longrepr):
                            return verdict(True, item.nodeid)
                        return verdict(
                            False,
                            f"not judged: {report.when} of {item.nodeid} "
                            f"failed: {str(report.longrepr)[-200:]}",
                        )
        return verdict(False, "every test passed")
    finally:
        path.write_text(original)
        _remigrate(server)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> bool:
    if session.testsfailed:
        raise session.Interrupted(f"{session.testsfailed} error(s) during collection")
    server = os.environ["FLEETQ_TEST_DSN"]
    protocol = Path(session.config.rootpath) / "migrations" / "protocol"
    with (
        os.fdopen(int(os.environ[IN]), "r") as jobs,
        os.fdopen(int(os.environ[OUT]), "w", buffering=1) as verdicts,
    ):
        for line in jobs:
            verdict = _judge(session, json.loads(line), protocol, server)
            verdicts.write(json.dumps(verdict) + "\n")
            if str(verdict["by"]).startswith("not judged"):
                # a fixture that failed stays failed for its scope (pytest caches the
                # error): this session is spent, the next job gets a new one
                break
    return True
