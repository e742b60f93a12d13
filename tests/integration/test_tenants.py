"""Each party acts only as itself, at the entry points added after the core (issue 41):
a runner's notes, its own state, the schedules of its lanes, idempotency keys, and what a
submit may carry. Each test here was passed by a forbidden call before migration 0030 (the
schedules': before 0031)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from fleetq.cli.main import main as fleetq
from fleetq.core import roles
from fleetq.core.db import SyncConnection, connect, wrap_errors
from fleetq.core.errors import DatabaseBusy
from tests.fleet import OTHER_SHA, SHA
from tests.integration.conftest import Login

RUNNER = "node-a/r1"


@pytest.fixture(autouse=True)
def _fleet(login: Login) -> None:
    """The test fleet's projects and operations (the login fixture makes them)."""


def _refused(conn: SyncConnection, statement: str, params: list[object], code: str) -> None:
    with pytest.raises(psycopg.Error) as exc:
        conn.execute(statement.encode(), params)
    conn.rollback()
    assert exc.value.sqlstate == code, exc.value


@pytest.fixture
def as_runner(login: Login, sync_conn: SyncConnection) -> Iterator[SyncConnection]:
    """node-a/r1's own login, registered, holding a job under token 1."""
    sync_conn.execute(
        b"SELECT fleetq.register_runner('node-a', 'r1', '{}', 16384, 8000, ARRAY['checks'], "
        b"ARRAY[4], 'x', 1)"
    )
    with connect(login(roles.Kind.RUNNER, RUNNER), autocommit=True) as conn:
        yield conn


SUCCEED = (
    "SELECT status FROM fleetq.complete($1, $2::bigint[], $3::bigint[], $4::text[], "
    "$5::integer[], $6::text[], $7::text[], $8::integer[], $9::integer[], $10::integer[])"
)


def _succeeded(*jobs: int) -> list[object]:
    """SUCCEED's parameters: node-a/r1's outcome `succeeded` for `jobs`, each under token 1."""
    n = len(jobs)
    nulls: list[None] = [None] * n
    return [RUNNER, list(jobs), [1] * n, ["succeeded"] * n, [0] * n, nulls, [""] * n,
            [1] * n, [1] * n, nulls]  # fmt: skip


def _succeed(conn: SyncConnection, *jobs: int) -> list[str]:
    """node-a/r1 ends `jobs` succeeded (token 1 each); the answers, in order."""
    return [str(row[0]) for row in conn.execute(SUCCEED.encode(), _succeeded(*jobs)).fetchall()]


def _job(sync_conn: SyncConnection, who: str = "alice", key: str | None = None) -> int:
    row = sync_conn.execute(
        b"SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, $2, NULL, $3, '{}', "
        b"NULL, NULL)",
        [SHA, key, who],
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_runner_notes_only_its_observations(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A runner login wrote a 'claimed' event under token 999999, which the fenced ledger
    and the output then believed."""
    job = _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    note = "SELECT fleetq.runner_note($1, $2, $3, 1, '{}')"
    _refused(as_runner, note, ["claimed", job, RUNNER], "42501")
    as_runner.execute(note.encode(), ["adoption_refused", job, RUNNER])
    _refused(as_runner, "SELECT fleetq.fenced_write('k', $1, 999999, '{}')", [job], "42501")


def test_a_runner_may_drain_itself_never_resume_or_pause(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    state = "SELECT state FROM fleetq.set_runner_state($1, $2, 'x', 'x')"
    for forbidden in ("active", "paused"):
        _refused(as_runner, state, [RUNNER, forbidden], "42501")
    row = as_runner.execute(state.encode(), [RUNNER, "draining"]).fetchone()
    assert row == ("drained",)  # it holds nothing


OTHER_LANE = "node-b/r2"  # a runner of the control lane only
DUE = "date_trunc('minute', clock_timestamp())"
NOT_DUE = ("'infinity'", f"{DUE} + interval '1 hour'", "clock_timestamp() - interval '1 second'")


def _schedule(conn: SyncConnection, commit: str | None) -> None:
    """`nightly`, of tools/lint (the checks lane), at a fixed commit or main's head, with
    ticks due."""
    conn.execute(
        b"INSERT INTO fleetq.schedules (name, cron, project, operation, commit_sha, branch, "
        b"last_tick) VALUES ('nightly', '* * * * *', 'tools', 'lint', $1, $2, "
        b"clock_timestamp() - interval '1 hour')",
        [commit, None if commit else "main"],
    )


@pytest.mark.parametrize("commit", [None, SHA], ids=["branch", "fixed"])
def test_only_a_runner_of_the_schedule_s_lane_settles_it(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection, commit: str | None
) -> None:
    """Any runner login, another tenant's of another lane included, fired a due tick of a
    branch schedule at a commit of its choosing, the verdict then that commit's (issue 41,
    finding 6); a fixed schedule's it fired or skipped at will."""
    _schedule(sync_conn, commit)
    sync_conn.execute(
        b"SELECT fleetq.register_runner('node-b', 'r2', '{}', 16384, 8000, ARRAY['control'], "
        b"ARRAY[1], 'x', 1)"
    )
    with connect(login(roles.Kind.RUNNER, OTHER_LANE), autocommit=True) as other:
        fire = f"SELECT * FROM fleetq.fire_schedule('nightly', {DUE}, $1)"
        _refused(other, fire, [OTHER_SHA], "42501")
        _refused(other, fire, [SHA], "42501")
        _refused(other, f"SELECT fleetq.skip_schedule('nightly', {DUE})", [], "42501")
        turn = f"SELECT fleetq.take_schedule_turn($1, 'nightly', {DUE})"
        _refused(other, turn, [OTHER_LANE], "42501")
        listed = b"SELECT name FROM fleetq.lane_schedules($1)"
        assert other.execute(listed, [OTHER_LANE]).fetchall() == []
    assert as_runner.execute(listed, [RUNNER]).fetchall() == [("nightly",)]
    assert as_runner.execute(turn.encode(), [RUNNER]).fetchone() == (True,)
    row = as_runner.execute(fire.encode(), [SHA]).fetchone()
    assert row is not None and row[1] is True


def test_a_runner_of_the_lane_settles_due_ticks_at_the_schedule_s_commit(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A runner of the lane decides no more than that lane's outcomes: a fixed commit stays
    the schedule's, a tick not yet due is nobody's to settle (skipped to 'infinity', a
    schedule was silenced for good), and its turn it takes as itself only."""
    _schedule(sync_conn, SHA)
    fire = "SELECT * FROM fleetq.fire_schedule('nightly', {}, $1)"
    _refused(as_runner, fire.format(DUE), [OTHER_SHA], "42501")
    for tick in NOT_DUE:
        _refused(as_runner, fire.format(tick), [SHA], "42501")
        _refused(as_runner, f"SELECT fleetq.skip_schedule('nightly', {tick})", [], "42501")
        turn = f"SELECT fleetq.take_schedule_turn($1, 'nightly', {tick})"
        _refused(as_runner, turn, [RUNNER], "42501")
    _refused(as_runner, f"SELECT fleetq.take_schedule_turn($1, 'nightly', {DUE})", ["x/y"], "42501")
    row = sync_conn.execute(b"SELECT count(*) FROM fleetq.schedule_ticks").fetchone()
    assert row == (0,)


def test_idempotency_keys_are_each_identity_s_own(sync_conn: SyncConnection) -> None:
    """One bot's key blocked another's; a submitter's `schedule:NAME:<tick>` made the
    schedule's leader fail every tick."""
    assert _job(sync_conn, "ci-bot", "k") != _job(sync_conn, "other-bot", "k")
    assert _job(sync_conn, "ci-bot", "k") == _job(sync_conn, "ci-bot", "k")
    sync_conn.execute(
        b"INSERT INTO fleetq.schedules (name, cron, project, operation, commit_sha, last_tick) "
        b"VALUES ('nightly', '* * * * *', 'tools', 'lint', $1, '2026-01-01T00:00:00Z')",
        [SHA],
    )
    squatted = _job(sync_conn, "ci-bot", "schedule:nightly:2026-01-01T00:01:00Z")
    row = sync_conn.execute(
        b"SELECT job_id, fired FROM fleetq.fire_schedule('nightly', '2026-01-01T00:01:00Z', $1)",
        [SHA],
    ).fetchone()
    assert row is not None and row[1] is True and row[0] != squatted


BAD_SUBMITS = {
    "a list payload": ("[1, 2, 3]", None, None, None, None),
    "a string payload": ('"text"', None, None, None, None),
    "a null payload": ("null", None, None, None, None),
    "an escape in the node": ("{}", "node\x1b]0;pwned\x07", None, None, None),
    "a line feed in the key": ("{}", None, "key\r\ninjected", None, None),
    "a C1 control in the task": ("{}", None, None, "task\x9b31m", None),
    "a huge node": ("{}", "n" * 10_000, None, None, None),
    "an empty key": ("{}", None, "", None, None),
    # what Python cannot decode: every runner claiming such a job exited (a later review)
    "a 5,000-digit number": ('{"a": 1' + "0" * 5000 + "}", None, None, None, None),
    # past a double's range: Python read infinity, and `--json` printed Infinity
    "a 400-digit number": ('{"a": 1' + "0" * 400 + ".5}", None, None, None, None),
    "a negative one": ('{"a": [-1' + "0" * 400 + ".25]}", None, None, None, None),
    "arrays 1,100 deep": ('{"a": ' + "[" * 1100 + "]" * 1100 + "}", None, None, None, None),
    "objects 101 deep": ('{"a": ' * 101 + "1" + "}" * 101, None, None, None, None),
    "a malformed traceparent": ("{}", None, None, None, "00-xyz"),
}


@pytest.mark.parametrize("bad", list(BAD_SUBMITS))
def test_the_database_refuses_what_the_api_refuses(
    bad: str, login: Login, sync_conn: SyncConnection
) -> None:
    """Through SQL a submitter stored a list payload (every runner of the lane then
    exited on its claim), a 100 MiB node and terminal escapes."""
    payload, node, key, task, trace = BAD_SUBMITS[bad]
    with connect(login(roles.Kind.SUBMITTER, "ci-bot")) as conn:
        _refused(
            conn,
            "SELECT * FROM fleetq.submit('tools', 'lint', $1, $2, $3, $4, NULL, $5::jsonb, "
            "NULL, $6)",
            [SHA, node, key, task, payload, trace],
            "FQ003",
        )
        _refused(
            conn,
            "SELECT * FROM fleetq.submit_many(ARRAY['tools'], ARRAY['lint'], ARRAY[$1], "
            "ARRAY[$2]::text[], ARRAY[$3]::text[], ARRAY[$4]::text[], ARRAY[$5::jsonb], "
            "ARRAY[$6]::text[], NULL)",
            [SHA, node, key, task, payload, trace],
            "FQ003",
        )
    row = sync_conn.execute(b"SELECT count(*) FROM fleetq.jobs").fetchone()
    assert row == (0,)


def test_the_database_takes_what_python_reads(login: Login, sync_conn: SyncConnection) -> None:
    """The bounds refuse only what cannot be read: 100 levels, a 1,000-digit integer
    and 1e400 (an integer to jsonb) go."""
    deep = '{"a": ' * 99 + '{"n": ' + "9" * 1000 + ', "e": 1e400}' + "}" * 99
    with connect(login(roles.Kind.SUBMITTER, "ci-bot")) as conn:
        conn.execute(
            "SELECT * FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, NULL, $2::jsonb, "
            "NULL, NULL)",
            [SHA, deep],
        )
        conn.commit()
    row = sync_conn.execute(b"SELECT payload FROM fleetq.jobs").fetchone()
    assert row is not None and json.dumps(row[0]).count("{") == 100


def test_a_bulk_submit_is_capped(login: Login) -> None:
    n = 10_001
    with connect(login(roles.Kind.SUBMITTER, "ci-bot")) as conn:
        _refused(
            conn,
            "SELECT * FROM fleetq.submit_many(array_fill('tools'::text, ARRAY[$1::int]), "
            "array_fill('lint'::text, ARRAY[$1::int]), array_fill($2::text, ARRAY[$1::int]), "
            "NULL, NULL, NULL, NULL, NULL, NULL)",
            [n, SHA],
            "FQ003",
        )


@pytest.mark.parametrize(
    ("kind", "argv"),
    [
        (roles.Kind.READER, ("roles", "list")),
        (roles.Kind.OPERATOR, ("roles", "list")),
        (roles.Kind.READER, ("tokens", "list")),
        (roles.Kind.READER, ("roles", "add-reader", "evil")),
        (roles.Kind.SUBMITTER, ("config", "show")),
        (roles.Kind.RUNNER, ("jobs",)),
        (roles.Kind.RUNNER, ("drain", "node-b/r2")),
    ],
)
def test_every_refusal_exits_77(
    kind: roles.Kind,
    argv: tuple[str, ...],
    login: Login,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A table, database or role the login may not touch exited 70, an unexpected error."""
    subject = RUNNER if kind is roles.Kind.RUNNER else "someone"
    extra = ("--password-file", str(tmp_path / "evil.pgpass")) if "add-reader" in argv else ()
    code = fleetq(["--dsn", login(kind, subject), *argv, *extra])
    assert code == 77, capsys.readouterr().err


def test_a_waiter_holding_what_it_cleaned_up_blocks_no_other_waiter(
    login: Login, sync_conn: SyncConnection
) -> None:
    """`watch_jobs` removes the rows of waiters that are gone; a reader calling it in a
    transaction it keeps open held them, and every other `fleetq wait` then waited on it
    (until its lock timeout, then failed)."""
    job = _job(sync_conn)
    reader = login(roles.Kind.READER, "someone")
    watch = "SELECT * FROM fleetq.watch_jobs(ARRAY[$1::bigint])"
    with connect(reader, autocommit=True) as gone:  # a waiter that ends: its row stays
        gone.execute(watch.encode(), [job])
    with connect(reader) as holder, connect(reader, autocommit=True) as victim:
        holder.execute(watch.encode(), [job])  # deletes the row of the one gone; stays open
        victim.execute(b"SET lock_timeout = '5s'")
        (row,) = victim.execute(watch.encode(), [job]).fetchall()  # not 55P03
        assert row == (job, "queued")
        holder.commit()
        victim.execute(watch.encode(), [job])  # the gone one's row goes, the living stay
        watching = sync_conn.execute(b"SELECT count(*) FROM fleetq.job_watchers").fetchone()
        assert watching == (2,)  # the holder's and the victim's


def test_a_lock_not_had_in_time_is_busy_not_an_outage(
    db_dsn: str, sync_conn: SyncConnection
) -> None:
    """What the CLI said of a login's lock timeout: "database unreachable or connection
    lost" (exit 69, as for an outage)."""
    job = _job(sync_conn)
    with connect(db_dsn) as holder, connect(db_dsn) as waiter:
        holder.execute(b"SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [job])
        waiter.execute(b"SET lock_timeout = '50ms'")
        busy = pytest.raises(DatabaseBusy, match="database busy: canceling statement due to lock")
        with busy, wrap_errors():
            waiter.execute(b"SELECT 1 FROM fleetq.jobs WHERE id = $1 FOR UPDATE", [job])


def test_a_runner_holding_the_reaper_s_row_stalls_expiry_ten_seconds_at_most(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A runner login calling `reap` in a transaction it kept open held the leader's
    row: every other reaper stood aside, and expired leases stayed claimed for as long
    as it liked. Past 10 s without a pass, the others expire leases without a leader."""
    job = _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    sync_conn.execute(
        b"UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 s' "
        b"WHERE id = $1",
        [job],
    )
    reap = b"SELECT requeued, failed, leader FROM fleetq.reap(1000, NULL)"
    sync_conn.execute(b"SELECT requeued FROM fleetq.reap(0, NULL)")  # a pass ends now
    with connect(login(roles.Kind.RUNNER, "node-x/r9")) as holder:
        hold = b"SELECT leader FROM fleetq.reap(0, NULL)"  # leads, takes nothing, holds the row
        assert holder.execute(hold).fetchall() == [(True,)]
        assert sync_conn.execute(reap).fetchall() == [(0, 0, False)]  # a leader is at work
        holder.rollback()
        sync_conn.execute(
            b"UPDATE fleetq.coordination SET taken_at = clock_timestamp() - interval '11 s' "
            b"WHERE name = 'reaper'"
        )
        assert holder.execute(hold).fetchall() == [(True,)]  # holds it again
        assert sync_conn.execute(reap).fetchall() == [(1, 0, False)]
        holder.execute(b"SELECT 1")  # not ended yet: that is 30 s on
    row = sync_conn.execute(b"SELECT state FROM fleetq.jobs WHERE id = $1", [job]).fetchone()
    assert row == ("queued",)


def test_what_a_runner_reports_is_bounded(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A runner login registered a 1,000,000-character capability, reported its node as
    a terminal escape and stored a 2 MiB failure reason, all shown to operators."""
    register = (
        "SELECT 1 FROM fleetq.register_runner('node-a', 'r1', $1, 16384, 8000, "
        "ARRAY['checks'], ARRAY[4], $2, 1)"
    )
    for capabilities, version in (
        (["x" * 1_000_000], "1"),
        (["gpu\x1b]0;pwned\x07"], "1"),
        ([f"c{i}" for i in range(257)], "1"),
        (["gpu"], "v\r\n2"),
    ):
        _refused(as_runner, register, [capabilities, version], "FQ003")
    as_runner.execute(register.encode(), [["gpu"], "1.0"])
    job = _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    start = "SELECT fleetq.report_start($1, $2, 1, $3, gen_random_uuid(), 7, clock_timestamp(), 0)"
    _refused(as_runner, start, [RUNNER, job, "node-a\x1b]52;c;ZWNobw==\x07"], "FQ003")
    as_runner.execute(start.encode(), [RUNNER, job, "node-a"])
    as_runner.execute(
        b"SELECT * FROM fleetq.complete($1, ARRAY[$2::bigint], '{1}', '{failed}', '{1}', "
        b"ARRAY[$3], ARRAY[$4], '{1}', '{1}', '{NULL}')",
        [RUNNER, job, "r" * (2 << 20), "head\n" + "t" * 20_000 + "\nlast line"],
    )
    row = sync_conn.execute(
        b"SELECT length(v.reason), length(v.log_tail), right(v.log_tail, 9) "
        b"FROM fleetq.verdicts v WHERE v.job_id = $1",
        [job],
    ).fetchone()
    assert row == (2000, 8192, "last line")


def test_a_dependent_submit_held_open_holds_no_ending_up(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A submitter holding `submit --after J` open held J's row (KEY SHARE), and J's
    outcome, cancel and the settling of jobs waiting on J took it FOR UPDATE: each
    waited on that submitter for as long as it liked."""
    job, cancelled = _job(sync_conn), _job(sync_conn)
    waiting = _job_after(sync_conn, job)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    after = "SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, NULL, "
    after += "'{}', ARRAY[$2::bigint], NULL)"
    with connect(login(roles.Kind.SUBMITTER, "mallory")) as holder:
        held = [holder.execute(after.encode(), [SHA, j]).fetchone() for j in (job, waiting)]
        holder.execute(after.encode(), [SHA, cancelled])
        as_runner.execute(b"SET lock_timeout = '5s'")  # a wait would end as 55P03
        assert _succeed(as_runner, job) == ["ok"]
        sync_conn.execute(b"SET lock_timeout = '5s'")
        sync_conn.execute(b"SELECT * FROM fleetq.cancel($1, 'operator', 'x')", [cancelled])
        assert _states(sync_conn, job, waiting, cancelled) == ["succeeded", "queued", "cancelled"]
        holder.commit()
    mine = [int(row[0]) for row in held if row is not None]
    assert _states(sync_conn, *mine) == ["waiting", "waiting"]  # each read its dependency live
    sync_conn.execute(b"SELECT * FROM fleetq.reap(1000, NULL)")  # the leader settles again
    assert _states(sync_conn, *mine) == ["queued", "waiting"]  # the second waits on `waiting`


def _job_after(sync_conn: SyncConnection, job: int) -> int:
    row = sync_conn.execute(
        b"SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'alice', "
        b"'{}', ARRAY[$2::bigint], NULL)",
        [SHA, job],
    ).fetchone()
    assert row is not None
    return int(row[0])


def _states(sync_conn: SyncConnection, *jobs: int) -> list[str]:
    rows = sync_conn.execute(
        b"SELECT state FROM fleetq.jobs WHERE id = ANY ($1) ORDER BY array_position($1, id)",
        [list(jobs)],
    ).fetchall()
    return [str(row[0]) for row in rows]


def test_a_cancel_held_open_holds_no_other_outcome_up(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A submitter cancelling its own running job in a transaction it kept open held the
    job's row, and the runner's outcome batch waited on it whole: every outcome of that
    runner (another tenant's too) waited, and its slots stayed full."""
    mine, theirs = _job(sync_conn, who="mallory"), _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 2, NULL)", [RUNNER])
    with connect(login(roles.Kind.SUBMITTER, "mallory")) as holder:
        holder.execute(b"SELECT * FROM fleetq.cancel($1, 'mallory', 'x')", [mine])
        as_runner.execute(b"SET lock_timeout = '5s'")  # a wait would end as 55P03
        assert _succeed(as_runner, mine, theirs) == ["busy", "ok"]
        holder.rollback()
    assert _succeed(as_runner, mine, theirs) == ["ok", "already"]
    assert _states(sync_conn, mine, theirs) == ["succeeded", "succeeded"]


def test_a_dependent_s_cancel_held_open_holds_no_ending_up(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A submitter cancelling its own job waiting on another tenant's, in a transaction
    it kept open, held that job's outcome: settling its dependents waited for the row."""
    job = _job(sync_conn)
    waiting = sync_conn.execute(
        b"SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, 'mallory', "
        b"'{}', ARRAY[$2::bigint], NULL)",
        [SHA, job],
    ).fetchone()
    assert waiting is not None
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    with connect(login(roles.Kind.SUBMITTER, "mallory")) as holder:
        holder.execute(b"SELECT * FROM fleetq.cancel($1, 'mallory', 'x')", [waiting[0]])
        as_runner.execute(b"SET lock_timeout = '5s'")  # a wait would end as 55P03
        assert _succeed(as_runner, job) == ["ok"]
        holder.rollback()
    assert _states(sync_conn, job, waiting[0]) == ["succeeded", "waiting"]
    sync_conn.execute(b"SELECT * FROM fleetq.reap(1000, NULL)")  # the leader settles again
    assert _states(sync_conn, waiting[0]) == ["queued"]


def test_a_pass_held_open_is_ended_after_thirty_seconds(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A runner login calling `reap` in a transaction it kept open led the pass and held
    what it took, another runner's row included: that runner's claims waited on it for
    as long as the holder liked. Past 30 s, another reaper ends the holder's session."""
    job = _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    sync_conn.execute(
        b"UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 s' "
        b"WHERE id = $1",
        [job],
    )
    sync_conn.execute(
        b"UPDATE fleetq.coordination SET taken_at = clock_timestamp() - interval '11 s' "
        b"WHERE name = 'reaper'"
    )
    with connect(login(roles.Kind.RUNNER, "node-x/r9")) as holder:
        took = holder.execute(b"SELECT requeued, leader FROM fleetq.reap(1000, NULL)")
        assert took.fetchall() == [(1, True)]  # node-a/r1's job, and so its runner's row
        later = b"SELECT leader FROM fleetq.reap(1000, clock_timestamp() + interval '31 s')"
        assert sync_conn.execute(later).fetchall() == [(False,)]
        with pytest.raises(psycopg.OperationalError):
            holder.execute(b"SELECT 1")
    as_runner.execute(b"SET lock_timeout = '5s'")  # a wait would end as 55P03
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    # the pass that ended the holder expired the lease, and node-a/r1 took the job again
    row = sync_conn.execute(
        b"SELECT state, lease_owner, lease_version FROM fleetq.jobs WHERE id = $1", [job]
    ).fetchone()
    assert row == ("claimed", RUNNER, 2)


def test_dependencies_are_read_at_read_committed_only(
    login: Login, as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """An ending at REPEATABLE READ did not see a job submitted to wait on it after its
    snapshot began, and that job (another tenant's) waited for ever; a submit `--after`
    at REPEATABLE READ read its dependencies as of its snapshot likewise."""
    job = _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    as_runner.execute(b"SET default_transaction_isolation = 'repeatable read'")
    _refused(as_runner, SUCCEED, _succeeded(job), "FQ003")
    with connect(login(roles.Kind.SUBMITTER, "mallory")) as submitter:
        submitter.execute(b"SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        after = (
            "SELECT job_id FROM fleetq.submit('tools', 'lint', $1, NULL, NULL, NULL, NULL, "
            "'{}', ARRAY[$2::bigint], NULL)"
        )
        _refused(submitter, after, [SHA, job], "FQ003")
    as_runner.execute(b"SET default_transaction_isolation = 'read committed'")
    assert _succeed(as_runner, job) == ["ok"]


def test_what_a_runner_stores_of_a_job_is_bounded(
    as_runner: SyncConnection, sync_conn: SyncConnection
) -> None:
    """A runner login saying every output chunk started at byte 0 kept them all as the
    output's head (124 MB of one job), and a drain reason of 5 MB was stored and shown."""
    job = _job(sync_conn)
    as_runner.execute(b"SELECT * FROM fleetq.claim($1, 'checks', 1, NULL)", [RUNNER])
    chunk = b"x" * 65536
    for seq in range(40):
        as_runner.execute(
            b"SELECT fleetq.append_output($1, $2, 1, $3, 0, $4)", [RUNNER, job, seq, chunk]
        )
    row = sync_conn.execute(
        b"SELECT sum(octet_length(data)) FROM fleetq.job_output WHERE job_id = $1", [job]
    ).fetchone()
    assert row is not None and row[0] <= 65536
    as_runner.execute(
        b"SELECT 1 FROM fleetq.set_runner_state($1, 'draining', $2, NULL)",
        [RUNNER, "r" * 5_000_000],
    )
    row = sync_conn.execute(
        b"SELECT length(state_reason) FROM fleetq.runners WHERE id = $1", [RUNNER]
    ).fetchone()
    assert row == (2000,)


def test_a_pass_leads_at_its_transaction_s_top_level_only(
    login: Login, sync_conn: SyncConnection
) -> None:
    """A runner login leading the pass in a savepoint it then released held the row as a
    subtransaction that pg_locks no longer named: end_stuck_pass found no one to end."""
    with connect(login(roles.Kind.RUNNER, "node-x/r9")) as holder:
        holder.execute(b"SAVEPOINT s")
        _refused(holder, "SELECT leader FROM fleetq.reap(1000, NULL)", [], "FQ003")
        assert holder.execute(b"SELECT leader FROM fleetq.reap(1000, NULL)").fetchall() == [(True,)]
