"""The authorization matrix (issue 41): every function a fleetq group can execute has a
row in `fleetq.core.authz.MATRIX`, and every row's call against another tenant's job,
runner and schedule is refused or changes and locks nothing of theirs, from every login
kind. Entry points added after the core (notes, output, runner state, schedules) wrote a
forged claim under token 999999, injected output, held other runners' rows and undid an
operator's pause, each through a function nobody had listed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from fleetq.core import authz, roles, tokens
from fleetq.core.authz import Kind
from fleetq.core.db import SyncConnection, connect
from tests.fleet import SHA
from tests.integration.conftest import Login

OTHER_SHA = "b" * 40
OWN = "node-a/r1"  # the attacker's runner (a runner login acts as it)
VICTIM = "node-b/r2"
SCHEDULE = "nightly"


def executable(conn: SyncConnection) -> dict[str, set[Kind]]:
    """Each fleetq function any group may execute, with the kinds that may."""
    rows = conn.execute(
        b"SELECT p.oid::regprocedure::text, substr(g.rolname, 8) "
        b"FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        b"CROSS JOIN pg_roles g "
        b"WHERE n.nspname = 'fleetq' AND g.rolname = ANY ($1) "
        b"AND has_function_privilege(g.rolname, p.oid, 'EXECUTE')",
        [[f"fleetq_{k.value}" for k in Kind]],
    ).fetchall()
    found: dict[str, set[Kind]] = {}
    for function, kind in rows:
        found.setdefault(str(function), set()).add(Kind(kind))
    return found


def test_every_executable_function_has_a_row(sync_conn: SyncConnection) -> None:
    """A function a group can execute and the matrix does not name fails here: a new
    entry point cannot ship without saying who may call it."""
    granted = executable(sync_conn)
    listed = {e.function: set(e.touches) for e in authz.MATRIX}
    missing = sorted(set(granted) - set(listed))
    assert not missing, f"executable by a fleetq group but not in authz.MATRIX: {missing}"
    wrong = {f: (granted[f], listed[f]) for f in granted if granted[f] != listed[f]}
    assert not wrong, f"granted to other kinds than the matrix says (granted, listed): {wrong}"
    stale = sorted(set(listed) - set(granted))
    assert not stale, f"in authz.MATRIX but executable by no group: {stale}"


def test_no_group_reads_the_logins_or_the_tokens(sync_conn: SyncConnection) -> None:
    for kind in Kind:
        for table in ("fleetq.logins", "fleetq.api_tokens"):
            row = sync_conn.execute(
                b"SELECT has_table_privilege($1, $2, 'SELECT')", [f"fleetq_{kind.value}", table]
            ).fetchone()
            assert row is not None and row[0] is False, (kind, table)


def test_the_docs_show_the_matrix() -> None:
    docs = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    assert authz.markdown() in docs, "docs/security.md: paste `python -m fleetq.core.authz`"


@dataclass
class Victim:
    job: int


@pytest.fixture
def victim(sync_conn: SyncConnection) -> Victim:
    """node-b/r2 runs a job of victim-bot under token 1 (its lease an hour long, so no
    reaper pass takes it); node-a/r1, serving the checks lane only, is paused by an
    operator; a branch schedule of the control lane has ticks due."""
    register = b"SELECT fleetq.register_runner($1, $2, '{}', 16384, 8000, $3, $4, 'x', 1)"
    sync_conn.execute(register, ["node-b", "r2", ["checks", "control"], [4, 1]])
    sync_conn.execute(register, ["node-a", "r1", ["checks"], [4]])
    row = sync_conn.execute(
        b"SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, 'victim-key', NULL, "
        b"'victim-bot', '{}', NULL, NULL)",
        [SHA],
    ).fetchone()
    assert row is not None
    job = int(row[0])
    sync_conn.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [VICTIM])
    sync_conn.execute(
        b"SELECT fleetq.report_start($1, $2, 1, 'node-b', gen_random_uuid(), 1, NULL, 1)",
        [VICTIM, job],
    )
    sync_conn.execute(b"SELECT fleetq.append_output($1, $2, 1, 0, 'real output')", [VICTIM, job])
    sync_conn.execute(
        b"UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() + interval '1 hour' "
        b"WHERE id = $1",
        [job],
    )
    sync_conn.execute(b"SELECT fleetq.set_runner_state($1, 'paused', 'disk check', 'alice')", [OWN])
    sync_conn.execute(
        b"INSERT INTO fleetq.schedules (name, cron, project, operation, branch, last_tick) "
        b"VALUES ($1, '* * * * *', 'webapp', 'notify', 'main', "
        b"clock_timestamp() - interval '1 hour')",
        [SCHEDULE],
    )
    return Victim(job)


def fingerprint(conn: SyncConnection, job: int) -> tuple[object, ...]:
    """What another tenant owns: the job, its history (the attacker's own refusals
    aside), output, executions, the ledger, both runners' rows and the schedule."""
    row = conn.execute(
        b"SELECT (SELECT row(state, lease_owner, lease_version, lease_expires_at, reserved_on, "
        b"  failure_reason, cancel_requested_at)::text FROM fleetq.jobs WHERE id = $1),"
        b" (SELECT array_agg(row(kind, runner_id, lease_version, detail)::text ORDER BY id) "
        b"  FROM fleetq.events WHERE job_id = $1 AND NOT (runner_id IS NOT DISTINCT FROM $2 "
        b"  AND kind IN ('stale_rejected', 'stale_self_race'))),"
        b" (SELECT array_agg(row(lease_version, seq, data)::text ORDER BY lease_version, seq) "
        b"  FROM fleetq.job_output WHERE job_id = $1),"
        b" (SELECT array_agg(row(lease_version, runner_id, ended_at, stop_confirmed)::text) "
        b"  FROM fleetq.executions WHERE job_id = $1),"
        b" (SELECT count(*) FROM fleetq.fenced_ledger),"
        b" (SELECT array_agg(row(id, state, state_reason, capabilities)::text ORDER BY id) "
        b"  FROM fleetq.runners),"
        b" (SELECT array_agg(row(name, holder_pid)::text ORDER BY name) "
        b"  FROM fleetq.coordination WHERE name LIKE 'runner:%'),"
        b" (SELECT row(last_tick, paused_at, resolving_by)::text FROM fleetq.schedules "
        b"  WHERE name = $3),"
        b" (SELECT count(*) FROM fleetq.schedule_ticks)",
        [job, OWN, SCHEDULE],
    ).fetchone()
    assert row is not None
    return tuple(row)


def locked_rows(conn: SyncConnection, job: int) -> list[str]:
    """The victim's rows another transaction holds, tried as a renewal and a state change
    would take them (NOWAIT: a held row answers at once)."""
    held = []
    for what, statement, params in (
        ("job", b"SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR NO KEY UPDATE NOWAIT", [job]),
        ("runner", b"SELECT 1 FROM fleetq.runners WHERE id = $1 FOR UPDATE NOWAIT", [VICTIM]),
        (
            "schedule",
            b"SELECT 1 FROM fleetq.schedules WHERE name = $1 FOR UPDATE NOWAIT",
            [SCHEDULE],
        ),
    ):
        try:
            with conn.transaction():
                conn.execute(statement, params)
        except psycopg.errors.LockNotAvailable:
            held.append(what)
    return held


def _logins(login: Login) -> dict[Kind, str]:
    return {
        Kind.RUNNER: login(roles.Kind.RUNNER, OWN),
        Kind.SUBMITTER: login(roles.Kind.SUBMITTER, "ci-bot"),
        Kind.OPERATOR: login(roles.Kind.OPERATOR, "alice"),
        Kind.READER: login(roles.Kind.READER, "dashboard"),
        Kind.GATEWAY: login(roles.Kind.GATEWAY, "api"),
    }


def _attack(entry: authz.Entry, victim: Victim) -> str:
    """The row's call against the victim's job, runner and schedule."""
    assert entry.attack is not None
    return entry.attack.format(
        own=OWN, victim=VICTIM, job=victim.job, schedule=SCHEDULE, sha=OTHER_SHA, lane="checks"
    )


def _attempts() -> Iterator[tuple[authz.Entry, Kind]]:
    for entry in authz.MATRIX:
        if entry.attack is None:
            continue
        for kind in Kind:
            if kind not in entry.reaches_any:
                yield entry, kind


def test_no_call_acts_on_another_tenant(
    login: Login, sync_conn: SyncConnection, victim: Victim
) -> None:
    """Each row's call, from each login kind, inside a transaction left open: refused
    (42501; a gateway without a token: FQ007), or it holds none of the victim's rows and,
    committed, changed nothing of theirs."""
    dsns = _logins(login)
    before = fingerprint(sync_conn, victim.job)
    failures: list[str] = []
    for entry, kind in _attempts():
        assert entry.attack is not None
        call = _attack(entry, victim)
        where = f"{entry.function.split('(')[0]} as {kind.value}"
        with connect(dsns[kind]) as conn:
            try:
                conn.execute(f"SELECT * FROM {call}".encode())
            except psycopg.Error as exc:
                conn.rollback()
                allowed = {"42501", "FQ007"} if kind is Kind.GATEWAY else {"42501"}
                if kind in entry.touches:
                    allowed |= {"FQ002", "FQ003", "FQ004", "FQ006"}  # its own refusals
                if exc.sqlstate not in allowed:
                    failures.append(f"{where}: refused with {exc.sqlstate}, not 42501: {exc}")
                continue
            if kind not in entry.touches:
                failures.append(f"{where}: allowed, but the matrix gives it no row")
            if held := locked_rows(sync_conn, victim.job):
                failures.append(f"{where}: holds the victim's {', '.join(held)} row")
            conn.commit()
        if (after := fingerprint(sync_conn, victim.job)) != before:
            failures.append(f"{where}: changed the victim's state: {before} -> {after}")
            before = after
    assert not failures, "\n".join(failures)


def test_a_runner_token_through_the_gateway_acts_as_its_runner_only(
    login: Login, sync_conn: SyncConnection, victim: Victim
) -> None:
    """Issue 46: the gateway may call a runner's functions for a runner token. Each row's
    call, made by the gateway login presenting a token of the attacker's runner (as
    `fleetq api` does for `fleetq-runner --api`), is held to exactly what that runner's
    own login is: refused, or it changes and holds nothing of the victim's."""
    gateway = login(roles.Kind.GATEWAY, "api")
    _, secret = tokens.add(sync_conn, roles.Kind.RUNNER, OWN, name="attacker", created_by="t")
    sync_conn.commit()
    before = fingerprint(sync_conn, victim.job)
    failures: list[str] = []
    tried = 0
    for entry in authz.MATRIX:
        if entry.attack is None or not {Kind.RUNNER, Kind.GATEWAY} <= set(entry.touches):
            continue
        tried += 1
        call = _attack(entry, victim)
        where = f"{entry.function.split('(')[0]} for a runner token"
        with connect(gateway) as conn:
            conn.execute(b"SELECT * FROM fleetq.act_for_token($1)", [secret])
            try:
                conn.execute(f"SELECT * FROM {call}".encode())
            except psycopg.Error as exc:
                conn.rollback()
                if exc.sqlstate not in {"42501", "FQ002", "FQ003", "FQ004", "FQ006"}:
                    failures.append(f"{where}: refused with {exc.sqlstate}: {exc}")
                continue
            if held := locked_rows(sync_conn, victim.job):
                failures.append(f"{where}: holds the victim's {', '.join(held)} row")
            conn.commit()
        if (after := fingerprint(sync_conn, victim.job)) != before:
            failures.append(f"{where}: changed the victim's state: {before} -> {after}")
            before = after
    assert tried >= 20, tried
    assert not failures, "\n".join(failures)
