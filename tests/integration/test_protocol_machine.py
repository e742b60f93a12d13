"""A stateful property test of the whole protocol on a real database.

Three simulated runners interleave claim, start, heartbeat, complete, fail, loss,
hand-back (after a self-fence too), cancel, stop confirmation, lease expiry, retries of
a claim and of an outcome whose replies were lost, and fenced-ledger writes, and keep
presenting leases they *believe* they hold, long after some were taken from them
(zombies). The same actions as the TLA+ model (spec/FleetqLease.tla): the model checks
the design, this machine the SQL. After every step: at most one terminal outcome per
job, tokens only increase, no stale write ever succeeds, no job disappears, terminal
jobs stay terminal, every runner's reserved capacity equals what its jobs hold, and the
ledger accepted exactly what fencing allows (an independent model of it here), with
its violation and duplicate counters agreeing with that model.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from fleetq.core import fleet as fleet_api
from fleetq.core import leasing, producer
from fleetq.core.db import SyncConnection
from fleetq.core.driver import AsyncpgDriver
from fleetq.core.errors import StaleLease
from fleetq.core.models import (
    FencingToken,
    JobId,
    Outcome,
    OutcomeReport,
    Registration,
    RunnerId,
    StartReport,
    WriteStatus,
)
from tests import fleet
from tests.fleet import SHA

RUNNERS = ["node-a/r0", "node-b/r1", "node-c/r2"]
OPERATIONS = [("tools", "lint"), ("webapp", "unit"), ("webapp", "notify")]
TERMINAL_EVENTS = ("succeeded", "failed", "cancelled", "refused")
runner_ids = st.sampled_from(RUNNERS)


class QueueMachine(RuleBasedStateMachine):
    """The model is thin on purpose: the database is the truth; the machine remembers
    only what runners believe and what it has observed, and checks that against it."""

    dsn: ClassVar[str] = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.Runner()
        self.driver = self.loop.run(AsyncpgDriver.connect(self.dsn))
        self.cap = 0  # reassignment_cap, read by _reset
        self.run(self._reset())
        self.submitted = 0
        self.believed: dict[str, list[tuple[JobId, FencingToken]]] = {r: [] for r in RUNNERS}
        self.max_token: dict[int, int] = {}
        self.terminal: dict[int, str] = {}
        self.ledger_high: dict[str, int] = {}  # key -> highest token accepted
        self.effects: dict[int, set[int]] = {}  # job -> tokens whose effect was accepted
        self.ledger_writes = 0

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def teardown(self) -> None:
        self.run(self.driver.close())
        self.loop.close()

    async def _reset(self) -> None:
        conn = self.driver.conn
        await conn.execute(
            "TRUNCATE fleetq.jobs, fleetq.executions, fleetq.events, fleetq.verdicts, "
            "fleetq.task_notifications, fleetq.runner_lanes, fleetq.runners, "
            "fleetq.fenced_writes, fleetq.fenced_ledger CASCADE"
        )
        (cap,) = await self.driver.fetch(
            "SELECT value::integer AS cap FROM fleetq.settings WHERE name = 'reassignment_cap'"
        )
        self.cap = int(cap["cap"])
        for i, rid in enumerate(RUNNERS):
            node, name = rid.split("/")
            await fleet_api.register(
                self.driver,
                Registration(
                    node=node,
                    name=name,
                    capabilities=["browser"] if i == 2 else [],
                    memory_mb=3000,
                    cpu_millis=3000,
                    lanes={"checks": 2, "control": 1},
                ),
            )

    async def _job_row(self, job_id: int) -> dict[str, Any]:
        rows = await self.driver.fetch("SELECT * FROM fleetq.jobs WHERE id = $1", job_id)
        return rows[0]

    def _holds(self, row: dict[str, Any], runner: str, token: int) -> bool:
        return (
            row["state"] in ("claimed", "running")
            and row["lease_owner"] == runner
            and row["lease_version"] == token
        )

    def _pick(self, data: st.DataObject) -> tuple[str, tuple[JobId, FencingToken]]:
        """A runner that believes it holds something, and one of those leases (current or
        long gone: zombies keep trying)."""
        runner = data.draw(st.sampled_from(sorted(r for r, ls in self.believed.items() if ls)))
        return runner, data.draw(st.sampled_from(self.believed[runner]))

    def _believes(self) -> bool:
        return any(self.believed.values())

    # -- rules -------------------------------------------------------------------------

    @initialize(n=st.integers(2, 6))
    def some_work(self, n: int) -> None:
        for i in range(n):
            self.submit(OPERATIONS[i % len(OPERATIONS)], None)

    @rule(op=st.sampled_from(OPERATIONS), key=st.sampled_from([None, None, "k1", "k2"]))
    def submit(self, op: tuple[str, str], key: str | None) -> None:
        answer = self.run(
            producer.submit(
                self.driver,
                project=op[0],
                operation=op[1],
                commit=SHA,
                submitted_by="machine",
                idempotency_key=key if op[0] == "tools" else None,
            )
        )
        self.submitted += answer.created

    @rule(runner=runner_ids, lane=st.sampled_from(["checks", "control"]), limit=st.integers(1, 3))
    def claim(self, runner: str, lane: str, limit: int) -> None:
        claims = self.run(
            leasing.claim(
                self.driver, runner=RunnerId(runner), lane=lane, limit=limit, claim_id=uuid.uuid4()
            )
        )
        for c in claims:
            assert c.lease_version > self.max_token.get(c.job_id, 0), "token did not increase"
            self.max_token[c.job_id] = c.lease_version
            assert c.job_id not in self.terminal, "a terminal job was claimed"
            self.believed[runner].append((c.job_id, c.lease_version))

    @precondition(_believes)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        runner, lease = self._pick(data)
        row = self.run(self._job_row(lease[0]))
        report = StartReport(
            job_id=lease[0],
            lease_version=lease[1],
            node=runner.split("/")[0],
            run_id=uuid.uuid4(),
            pid=1,
            process_started_at=datetime.now(UTC),
        )
        try:
            self.run(leasing.report_start(self.driver, runner=RunnerId(runner), start=report))
        except StaleLease:
            assert not (self._holds(row, runner, lease[1]) and row["state"] == "claimed")
        else:
            assert self._holds(row, runner, lease[1]), "a stale start report succeeded"

    @rule(runner=runner_ids)
    def claim_retried(self, runner: str) -> None:
        """A claim whose reply was lost is sent again under the same claim id: it gets back
        exactly what the first took, and nothing more."""
        claim_id = uuid.uuid4()
        first = self.run(
            leasing.claim(
                self.driver, runner=RunnerId(runner), lane="checks", limit=2, claim_id=claim_id
            )
        )
        again = self.run(
            leasing.claim(
                self.driver, runner=RunnerId(runner), lane="checks", limit=2, claim_id=claim_id
            )
        )
        taken = [(c.job_id, c.lease_version) for c in first]
        assert [(c.job_id, c.lease_version) for c in again] == taken, "a retried claim differs"
        for job_id, token in taken:
            assert token > self.max_token.get(job_id, 0), "token did not increase"
            self.max_token[job_id] = token
            self.believed[runner].append((job_id, token))

    @rule(runner=runner_ids)
    def heartbeat(self, runner: str) -> None:
        leases = list(dict(self.believed[runner]).items())
        rows = {j: self.run(self._job_row(j)) for j, _ in leases}
        answers = self.run(leasing.heartbeat(self.driver, runner=RunnerId(runner), leases=leases))
        for (job_id, token), answer in zip(leases, answers, strict=True):
            holds = self._holds(rows[job_id], runner, token)
            assert (answer.status == WriteStatus.OK) == holds, "heartbeat fence broken"

    @precondition(_believes)
    @rule(data=st.data(), outcome=st.sampled_from(list(Outcome)))
    def finish(self, data: st.DataObject, outcome: Outcome) -> None:
        runner, lease = self._pick(data)
        row = self.run(self._job_row(lease[0]))
        report = OutcomeReport(
            job_id=lease[0],
            lease_version=lease[1],
            outcome=outcome,
            exit_code=0 if outcome == Outcome.SUCCEEDED else 1,
        )
        (answer,) = self.run(
            leasing.complete_many(self.driver, runner=RunnerId(runner), outcomes=[report])
        )
        if answer.status == WriteStatus.OK:
            assert self._holds(row, runner, lease[1]), "a stale outcome succeeded"
        elif answer.status == WriteStatus.ALREADY:
            assert row["released_by"] == runner and row["released_version"] == lease[1]
        else:
            assert not self._holds(row, runner, lease[1])

    @precondition(_believes)
    @rule(data=st.data())
    def finish_retried(self, data: st.DataObject) -> None:
        """An outcome whose reply was lost is sent again: once recorded, the retry learns
        it is 'already' recorded, and nothing is written twice."""
        runner, lease = self._pick(data)
        report = OutcomeReport(
            job_id=lease[0], lease_version=lease[1], outcome=Outcome.SUCCEEDED, exit_code=0
        )
        (first,) = self.run(
            leasing.complete_many(self.driver, runner=RunnerId(runner), outcomes=[report])
        )
        (again,) = self.run(
            leasing.complete_many(self.driver, runner=RunnerId(runner), outcomes=[report])
        )
        if first.status in (WriteStatus.OK, WriteStatus.ALREADY):
            assert again.status == WriteStatus.ALREADY, "a retried outcome was not 'already'"
        else:
            assert again.status == first.status

    @precondition(_believes)
    @rule(data=st.data(), fenced=st.booleans())
    def hand_back(self, data: st.DataObject, fenced: bool) -> None:
        """A runner hands a lease back: shutting down, or after fencing itself (which
        counts a reassignment, so a job cannot cycle through self-fences without end)."""
        runner, lease = self._pick(data)
        row = self.run(self._job_row(lease[0]))
        try:
            status = self.run(
                leasing.release(
                    self.driver,
                    runner=RunnerId(runner),
                    job_id=lease[0],
                    token=lease[1],
                    reason="machine",
                    fenced=fenced,
                )
            )
        except StaleLease:
            assert not self._holds(row, runner, lease[1])
            return
        if status == WriteStatus.ALREADY:
            assert (row["released_by"], row["released_version"]) == (runner, lease[1])
            return
        assert self._holds(row, runner, lease[1]), "a stale hand-back succeeded"
        exhausted = fenced and row["reassign_count"] + 1 > self.cap
        assert status == ("failed" if exhausted else "ok"), (status, fenced, row)

    @precondition(_believes)
    @rule(data=st.data())
    def ledger_write(self, data: st.DataObject) -> None:
        """A handler's side effect through the fenced ledger, under the token its runner
        believes it holds (a zombie's too): accepted exactly when no higher token has
        written that key before."""
        runner, (job_id, token) = self._pick(data)
        key = f"effect-{job_id}"
        accepted = self.run(
            leasing.fenced_write(
                self.driver, key=key, job_id=job_id, token=token, value={"by": runner}
            )
        )
        self.ledger_writes += 1
        assert accepted == (token >= self.ledger_high.get(key, 0)), "the ledger's fence broke"
        if accepted:
            self.ledger_high[key] = token
            self.effects.setdefault(job_id, set()).add(token)

    @rule(runner=runner_ids)
    def zombie_finishes_everything(self, runner: str) -> None:
        """A runner back from a partition reports outcomes for every job it ever held,
        each under the oldest token it has for it."""
        oldest: dict[JobId, FencingToken] = {}
        for job_id, token in self.believed[runner]:
            oldest.setdefault(job_id, token)
        if not oldest:
            return
        rows = {j: self.run(self._job_row(j)) for j in oldest}
        reports = [
            OutcomeReport(job_id=j, lease_version=t, outcome=Outcome.FAILED, exit_code=9)
            for j, t in oldest.items()
        ]
        answers = self.run(
            leasing.complete_many(self.driver, runner=RunnerId(runner), outcomes=reports)
        )
        for report, answer in zip(reports, answers, strict=True):
            if answer.status == WriteStatus.OK:
                assert self._holds(rows[report.job_id], runner, report.lease_version), (
                    "a stale outcome succeeded"
                )

    @precondition(_believes)
    @rule(data=st.data())
    def lost(self, data: st.DataObject) -> None:
        runner, lease = self._pick(data)
        row = self.run(self._job_row(lease[0]))
        try:
            status = self.run(
                leasing.report_lost(
                    self.driver,
                    runner=RunnerId(runner),
                    job_id=lease[0],
                    token=lease[1],
                    reason="test",
                )
            )
        except StaleLease:
            assert not self._holds(row, runner, lease[1])
            return
        if status in ("requeued", "failed"):
            assert self._holds(row, runner, lease[1]), "a stale loss report succeeded"
            assert status == ("requeued" if row["lost_count"] == 0 else "failed")

    @rule(data=st.data(), roll=st.integers(0, 3))
    def cancel(self, data: st.DataObject, roll: int) -> None:
        """Now and then an operator cancels a job, in whatever state it is."""
        if roll or self.submitted == 0:
            return
        job_id = data.draw(st.integers(1, max(1, self.submitted + 2)))
        rows = self.run(self.driver.fetch("SELECT id FROM fleetq.jobs ORDER BY id"))
        if not rows:
            return
        target = JobId(rows[(job_id - 1) % len(rows)]["id"])
        self.run(producer.cancel(self.driver, job_id=target, actor="machine"))

    @rule(runner=runner_ids)
    def confirm_stops(self, runner: str) -> None:
        rows = self.run(
            self.driver.fetch(
                "SELECT id, lease_version FROM fleetq.jobs WHERE state = 'cancelled' "
                "AND reserved_on = $1",
                runner,
            )
        )
        for row in rows:
            self.run(
                leasing.confirm_stop(
                    self.driver,
                    runner=RunnerId(runner),
                    job_id=row["id"],
                    token=row["lease_version"],
                    signal=15,
                    reason="cancelled",
                )
            )

    @precondition(_believes)
    @rule(data=st.data())
    def lease_expires(self, data: st.DataObject) -> None:
        """Time passes for one lease (its runner went quiet): its expiry moves into the
        past and the reaper runs."""
        _, (job_id, _) = self._pick(data)
        self.run(
            self.driver.fetch(
                "UPDATE fleetq.jobs SET lease_expires_at = clock_timestamp() - interval '1 second' "
                "WHERE id = $1 AND state IN ('claimed', 'running')",
                job_id,
            )
        )
        self.run(leasing.reap(self.driver))

    @rule(roll=st.integers(0, 19))
    def everything_expires(self, roll: int) -> None:
        """Rarely, every lease at once (a partition of the whole fleet)."""
        if roll == 0:
            self.run(leasing.reap(self.driver, now=datetime.now(UTC) + timedelta(days=1)))

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def jobs_and_outcomes(self) -> None:
        rows = self.run(self.driver.fetch("SELECT id, state, lease_version FROM fleetq.jobs"))
        assert len(rows) == self.submitted, "a job disappeared (or appeared)"
        for row in rows:
            assert row["lease_version"] >= self.max_token.get(row["id"], 0), "token went back"
            if row["id"] in self.terminal:
                assert row["state"] == self.terminal[row["id"]], "a terminal job changed"
            elif row["state"] in TERMINAL_EVENTS:
                self.terminal[row["id"]] = row["state"]
        doubled = self.run(
            self.driver.fetch(
                "SELECT job_id FROM fleetq.events WHERE kind = ANY($1::text[]) "
                "GROUP BY job_id HAVING count(*) > 1",
                list(TERMINAL_EVENTS),
            )
        )
        assert doubled == [], "more than one terminal outcome"

    @invariant()
    def reservations_match_jobs(self) -> None:
        bad = self.run(
            self.driver.fetch("""
            SELECT r.id FROM fleetq.runners r
            WHERE r.reserved_memory_mb <> (SELECT coalesce(sum(memory_mb), 0) FROM fleetq.jobs
                                           WHERE reserved_on = r.id)
               OR r.reserved_cpu_millis <> (SELECT coalesce(sum(cpu_millis), 0) FROM fleetq.jobs
                                            WHERE reserved_on = r.id)
               OR EXISTS (SELECT 1 FROM fleetq.runner_lanes l WHERE l.runner_id = r.id
                          AND l.slots_used <> (SELECT count(*) FROM fleetq.jobs j
                                               WHERE j.reserved_on = r.id AND j.lane = l.lane))
        """)
        )
        assert bad == [], f"reservations drifted on {bad}"

    @invariant()
    def references_resolve(self) -> None:
        """The references the protocol keeps without foreign keys (migrations 0024 and
        0029): every lease holder, reservation and execution names a runner, every
        execution and verdict a job, every job a lane and an operation."""
        dangling = self.run(
            self.driver.fetch("""
            SELECT 'lease_owner' AS ref, j.id FROM fleetq.jobs j
            WHERE j.lease_owner IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM fleetq.runners r WHERE r.id = j.lease_owner)
            UNION ALL
            SELECT 'reserved_on', j.id FROM fleetq.jobs j
            WHERE j.reserved_on IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM fleetq.runners r WHERE r.id = j.reserved_on)
            UNION ALL
            SELECT 'execution', e.id FROM fleetq.executions e
            WHERE NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = e.job_id)
               OR NOT EXISTS (SELECT 1 FROM fleetq.runners r WHERE r.id = e.runner_id)
            UNION ALL
            SELECT 'verdict', v.job_id FROM fleetq.verdicts v
            WHERE NOT EXISTS (SELECT 1 FROM fleetq.jobs j WHERE j.id = v.job_id)
            UNION ALL
            SELECT 'lane', j.id FROM fleetq.jobs j
            WHERE NOT EXISTS (SELECT 1 FROM fleetq.lanes l WHERE l.name = j.lane)
            UNION ALL
            SELECT 'operation', j.id FROM fleetq.jobs j
            WHERE NOT EXISTS (SELECT 1 FROM fleetq.operations o
                              WHERE o.project = j.project AND o.name = j.operation)
        """)
        )
        assert dangling == [], f"references that resolve to nothing: {dangling}"

    @invariant()
    def ledger_counts_what_fencing_allowed(self) -> None:
        """The counters agree with the model: no write below an accepted higher token was
        accepted, and the jobs whose effects landed under two tokens are counted."""
        assert self.run(leasing.fenced_violations(self.driver)) == 0
        twice = sum(1 for tokens in self.effects.values() if len(tokens) > 1)
        assert self.run(leasing.fenced_duplicates(self.driver)) == twice
        (written,) = self.run(self.driver.fetch("SELECT count(*) AS n FROM fleetq.fenced_writes"))
        assert written["n"] == self.ledger_writes


def test_protocol_state_machine(db_dsn: str, sync_conn: SyncConnection) -> None:
    fleet.operations(sync_conn)
    QueueMachine.dsn = db_dsn
    run_state_machine_as_test(
        QueueMachine,
        settings=settings(
            max_examples=100,
            stateful_step_count=50,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
