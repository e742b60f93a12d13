"""Who may call what: the authorization matrix of every function a fleetq group can
execute.

Why a table in code: an entry point added without its rule is how notes, output, runner
state and schedules came to act for other tenants (issue 41). `tests/integration/
test_authz_matrix.py` reads `pg_proc` for each group and fails on a function with no row
here, or granted to a kind its row does not name; then it calls each row's `attack` as
every login kind against another tenant's job, runner and schedule, and checks that the
call is refused (SQLSTATE 42501) or changes and locks nothing of the victim's. docs/
security.md shows the table (`python -m fleetq.core.authz` prints it; a test keeps the two
equal).

An attack is SQL with placeholders: `{own}` the caller's runner id, `{victim}` the other
runner's, `{job}` the other runner's job (running under token 1), `{schedule}` a branch
schedule of a lane the caller's runner does not serve (with due ticks), `{sha}` another
commit, `{lane}` the lane the caller's runner serves. None: the function reads or computes
only, and touches no tenant's object.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """A login kind (fleetq.logins.kind), each a group role `fleetq_<kind>`."""

    RUNNER = "runner"
    SUBMITTER = "submitter"
    OPERATOR = "operator"
    READER = "reader"
    GATEWAY = "gateway"


@dataclass(frozen=True)
class Entry:
    """One function: the kinds that may call it, what each may touch, and a call against
    another tenant's objects."""

    function: str  # as `regprocedure` prints it
    touches: dict[Kind, str]
    attack: str | None
    # kinds that may act on anyone's objects here (an operator's cancel): not attacks
    reaches_any: frozenset[Kind] = frozenset()


_RUNNER_LEASES = "its own runner's leases (the token it was granted)"
_READ_ONLY = "nothing (reads settings or computes)"
_ALL_READERS = (Kind.SUBMITTER, Kind.OPERATOR, Kind.READER, Kind.GATEWAY)


# what a gateway login may do with a runner's function: nothing on its own (without a
# token every call refuses it), and for a runner token what that runner's login may
_AS_ITS_RUNNER = "as a runner token's runner only (fleetq-runner --api)"
# a runner's functions bound to a database session of its own: never a gateway's
_SESSION_BOUND = frozenset(
    {
        "fleetq.take_runner_id(text)",
        "fleetq.lock_for_handler(bigint,text,bigint)",
        "fleetq.fenced_write(text,bigint,bigint,jsonb)",
    }
)


def _runner(function: str, attack: str | None, touches: str = _RUNNER_LEASES) -> Entry:
    if function in _SESSION_BOUND:
        return Entry(function, {Kind.RUNNER: touches}, attack)
    return Entry(function, {Kind.RUNNER: touches, Kind.GATEWAY: _AS_ITS_RUNNER}, attack)


def _pure(function: str) -> Entry:
    return Entry(function, dict.fromkeys(_ALL_READERS, _READ_ONLY), None)


_TS = "timestamp with time zone"
_OUTCOME = "text,bigint[],bigint[],text[],integer[],text[],text[],integer[],integer[],integer[]"
_OUTCOME_ARGS = "'{own}', ARRAY[{job}]::bigint[], ARRAY[1]::bigint[], ARRAY['succeeded'], "
_OUTCOME_ARGS += "ARRAY[0], ARRAY[NULL::text], ARRAY['all tests passed'], ARRAY[1], ARRAY[1], "
_OUTCOME_ARGS += "ARRAY[NULL::integer]"
_FACTS = 'ARRAY[\'{{"environment": {{"runner": "{own}"}}}}\'::jsonb]'
_ELIGIBILITY = (
    "text[],text,integer,integer,text,text[],text,boolean,integer,integer,integer,integer"
)

MATRIX: tuple[Entry, ...] = (
    # the lease protocol: a runner acts as its own id, on leases it holds
    _runner(
        "fleetq.claim(text,text,integer,uuid)",
        "fleetq.claim('{own}', '{lane}', 5, NULL)",
        "queued jobs it is eligible for, as itself",
    ),
    _runner(
        "fleetq.heartbeat(text,bigint[],bigint[])",
        "fleetq.heartbeat('{own}', ARRAY[{job}]::bigint[], ARRAY[1]::bigint[])",
    ),
    _runner(
        f"fleetq.report_start(text,bigint,bigint,text,uuid,integer,{_TS},integer)",
        "fleetq.report_start('{own}', {job}, 1, 'node-a', gen_random_uuid(), 1, NULL, 1)",
    ),
    _runner(f"fleetq.complete({_OUTCOME})", f"fleetq.complete({_OUTCOME_ARGS})"),
    _runner(
        f"fleetq.complete_and_claim({_OUTCOME},text,integer,uuid)",
        f"fleetq.complete_and_claim({_OUTCOME_ARGS}, '{{lane}}', 1, NULL)",
    ),
    # with each verdict's provenance (0041): kept only with an outcome the fence accepts
    _runner(f"fleetq.complete({_OUTCOME},jsonb[])", f"fleetq.complete({_OUTCOME_ARGS}, {_FACTS})"),
    _runner(
        f"fleetq.complete_and_claim({_OUTCOME},text,integer,uuid,jsonb[])",
        f"fleetq.complete_and_claim({_OUTCOME_ARGS}, '{{lane}}', 1, NULL, {_FACTS})",
    ),
    _runner(
        "fleetq.report_lost(text,bigint,bigint,text)",
        "fleetq.report_lost('{own}', {job}, 1, 'lost')",
    ),
    _runner(
        "fleetq.confirm_stop(text,bigint,bigint,integer,text,integer)",
        "fleetq.confirm_stop('{own}', {job}, 1, 9, 'cancelled', NULL)",
    ),
    _runner(
        "fleetq.release(text,bigint,bigint,text,boolean,integer)",
        "fleetq.release('{own}', {job}, 1, 'released', false, NULL)",
    ),
    _runner(
        "fleetq.fenced_write(text,bigint,bigint,jsonb)",
        "fleetq.fenced_write('ledger', {job}, 999999, '{{}}')",
        "the fenced ledger, under a token it was granted",
    ),
    _runner(
        "fleetq.append_output(text,bigint,bigint,integer,bytea)",
        "fleetq.append_output('{own}', {job}, 1, 999, 'all tests passed')",
        "the output of runs it was granted",
    ),
    _runner(
        "fleetq.append_output(text,bigint,bigint,integer,bigint,bytea)",
        "fleetq.append_output('{own}', {job}, 1, 999, 0, 'all tests passed')",
        "the output of runs it was granted",
    ),
    _runner(
        "fleetq.runner_note(text,bigint,text,bigint,jsonb)",
        "fleetq.runner_note('adoption_refused', {job}, '{own}', 1, '{{}}')",
        "an adoption_refused note on a lease it holds",
    ),
    _runner(
        "fleetq.lock_for_handler(bigint,text,bigint)",
        "fleetq.lock_for_handler({job}, '{own}', 1)",
        "the row of a lease it holds, in its handler's transaction",
    ),
    # the runner's own row and reads
    _runner(
        "fleetq.register_runner(text,text,text[],integer,integer,text[],integer[],text,integer)",
        "fleetq.register_runner('node-b', 'r2', '{{}}', 1, 1, ARRAY['{lane}'], ARRAY[1], 'x', 1)",
        "its own runner's row",
    ),
    Entry(
        "fleetq.set_runner_state(text,text,text,text)",
        {
            Kind.RUNNER: "its own runner: draining or offline, never over an operator's state",
            Kind.OPERATOR: "any runner (audited as itself)",
            Kind.GATEWAY: _AS_ITS_RUNNER,
        },
        "fleetq.set_runner_state('{own}', 'offline', 'restart me', 'x')",
        frozenset({Kind.OPERATOR}),
    ),
    _runner(
        "fleetq.take_runner_id(text)",
        "fleetq.take_runner_id('{victim}')",
        "its own runner id's coordination row",
    ),
    _runner(
        "fleetq.hold_runner_id(text,text,integer)",
        "fleetq.hold_runner_id('{victim}', 'x', 30)",
        "its own runner id's coordination row (held for a while, through the API)",
    ),
    _runner("fleetq.runner_state(text)", "fleetq.runner_state('{victim}')", "reads its own row"),
    _runner("fleetq.runner_held(text)", "fleetq.runner_held('{victim}')", "reads its own leases"),
    _runner(
        "fleetq.runner_job(text,bigint)",
        "fleetq.runner_job('{own}', {job})",
        "reads a job it holds",
    ),
    _runner(
        "fleetq.runner_job_states(text,bigint[])",
        "fleetq.runner_job_states('{own}', ARRAY[{job}]::bigint[])",
        "reads jobs it claimed",
    ),
    _runner(
        "fleetq.runner_open_executions(text)",
        "fleetq.runner_open_executions('{victim}')",
        "reads its own executions",
    ),
    # leading: any runner may lead; what it settles is due work only
    _runner(
        f"fleetq.reap(integer,{_TS})",
        "fleetq.reap(1000, NULL)",
        "expired leases (as the one leader of the moment)",
    ),
    # schedules: settled by the runners of their lane, each due tick once
    _runner(
        f"fleetq.fire_schedule(text,{_TS},text)",
        "fleetq.fire_schedule('{schedule}', date_trunc('minute', clock_timestamp()), '{sha}')",
        "a due tick of a schedule of its lanes, at the schedule's commit (a branch's: the "
        "head it resolved)",
    ),
    _runner(
        f"fleetq.skip_schedule(text,{_TS})",
        "fleetq.skip_schedule('{schedule}', date_trunc('minute', clock_timestamp()))",
        "due ticks of its lanes' schedules that the catch-up rule leaves unfired",
    ),
    _runner(
        f"fleetq.take_schedule_turn(text,text,{_TS})",
        "fleetq.take_schedule_turn('{own}', '{schedule}', date_trunc('minute', clock_timestamp()))",
        "the turn to settle a due tick of its lanes' schedules, as itself",
    ),
    _runner(
        "fleetq.lane_schedules(text)",
        "fleetq.lane_schedules('{victim}')",
        "reads the schedules of its own lanes",
    ),
    _runner("fleetq.runner_schedules()", None, "reads the schedules in force"),
    Entry(
        "fleetq.runner_operations()",
        dict.fromkeys((Kind.RUNNER, *_ALL_READERS), "reads the operations"),
        None,
    ),
    _pure("fleetq.provenance_whole(jsonb)"),
    Entry(
        "fleetq.runner_timing()",
        dict.fromkeys((Kind.RUNNER, *_ALL_READERS), "reads the lease settings"),
        None,
    ),
    # producers and operators
    Entry(
        "fleetq.submit(text,text,text,text,text,text,text,jsonb,bigint[],text)",
        {
            Kind.SUBMITTER: "new jobs, as its own identity",
            Kind.OPERATOR: "new jobs, as itself",
            Kind.GATEWAY: "what the token's holder may",
        },
        "fleetq.submit('tools', 'lint', '{sha}', NULL, 'k', NULL, 'victim-bot', '{{}}', "
        "ARRAY[{job}]::bigint[], NULL)",
    ),
    Entry(
        "fleetq.submit_many(text[],text[],text[],text[],text[],text[],jsonb[],text[],text)",
        {Kind.SUBMITTER: "new jobs, as its own identity", Kind.OPERATOR: "new jobs, as itself"},
        "fleetq.submit_many(ARRAY['tools'], ARRAY['lint'], ARRAY['{sha}'], NULL, "
        "ARRAY['k2'], NULL, NULL, NULL, 'victim-bot')",
    ),
    Entry(
        "fleetq.rerun(bigint,text,text)",
        {Kind.SUBMITTER: "new jobs, as its own identity", Kind.OPERATOR: "new jobs, as itself"},
        "fleetq.rerun({job}, 'victim-bot', 'k3')",
    ),
    Entry(
        "fleetq.cancel(bigint,text,text)",
        {
            Kind.SUBMITTER: "the jobs it submitted",
            Kind.OPERATOR: "any job (audited)",
            Kind.GATEWAY: "what the token's holder may",
        },
        "fleetq.cancel({job}, 'victim-bot', 'x')",
        frozenset({Kind.OPERATOR}),
    ),
    Entry(
        "fleetq.forget_runner(text,text)",
        {Kind.OPERATOR: "an offline runner holding nothing"},
        "fleetq.forget_runner('{victim}', 'x')",
        frozenset({Kind.OPERATOR}),
    ),
    Entry(
        "fleetq.pause_schedule(text,boolean,text,text)",
        {Kind.OPERATOR: "any schedule (audited)"},
        "fleetq.pause_schedule('{schedule}', true, 'x', 'x')",
        frozenset({Kind.OPERATOR}),
    ),
    Entry(
        "fleetq.act_for_token(text)",
        {Kind.GATEWAY: "acts as a presented token's holder"},
        "fleetq.act_for_token('not-a-token')",
    ),
    # reads and pure helpers of the readers' queries
    Entry(
        "fleetq.explain_jobs(bigint[])",
        dict.fromkeys(_ALL_READERS, "reads the runners' verdicts for jobs"),
        None,
    ),
    Entry(
        "fleetq.waiting_on(bigint,text)", dict.fromkeys(_ALL_READERS, "reads dependencies"), None
    ),
    Entry(
        "fleetq.watch_jobs(bigint[])",
        dict.fromkeys(
            (Kind.SUBMITTER, Kind.OPERATOR, Kind.READER),
            "its own session's waits; reads the jobs' states",
        ),
        "fleetq.watch_jobs(ARRAY[{job}])",
    ),
    Entry(
        "fleetq.next_retry_in()",
        {
            Kind.RUNNER: "reads when the next retry falls due (a number, no job)",
            Kind.GATEWAY: _AS_ITS_RUNNER,
        },
        None,
    ),
    _pure("fleetq.setting_int(text)"),
    _pure("fleetq.setting_seconds(text)"),
    _pure(f"fleetq.eligible({_ELIGIBILITY})"),
    _pure(f"fleetq.ineligibility({_ELIGIBILITY})"),
    _pure(f"fleetq.runner_is_stale({_TS})"),
    _pure(f"fleetq.runner_listed({_TS},{_TS})"),
)


def markdown() -> str:
    """The matrix as docs/security.md shows it."""
    kinds = list(Kind)
    lines = [
        "| function | " + " | ".join(k.value for k in kinds) + " |",
        "|---|" + "---|" * len(kinds),
    ]
    for entry in sorted(MATRIX, key=lambda e: e.function):
        name = entry.function.split("(")[0].removeprefix("fleetq.")
        cells = [entry.touches.get(k, "—") for k in kinds]
        row = f"| `{name}` | " + " | ".join(cells) + " |"
        if row != lines[-1]:  # overloads that mean the same are one row
            lines.append(row)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
