"""The statements a runner makes, by name: all that `fleetq api` runs for a runner token.

A runner served through the API (`fleetq-runner --api`) runs the same code as one with a
DSN; its driver sends each statement's *name* and arguments, never SQL, and the API runs
the named block only if it is listed here, in the token holder's transaction. Each is one
call of a protocol function whose own check (`fleetq.acting_runner`, `fleetq.require`)
decides, as for a runner login, that the token's runner acts as itself only; the list
keeps the API from being a door to anything else the gateway login may read.

Not listed, and why: the runner-id lock of a direct runner (`runners_take_identity` and
its kin) is bound to a database session (a runner through the API holds its id for a
while instead, `runners_hold_identity`); `lease_lock_for_handler` needs a handler's own transaction
(`ctx.transaction()`), and `lease_fenced_write` a handler's pool: both keep a DSN.
"""

from __future__ import annotations

# set on an error answer of fleetq's own, naming its type: a runner acts on those only,
# never on a proxy's or a route's answer (fleetq/runner/remote.py)
ERROR_HEADER = "X-Fleetq-Error"

RUNNER_CALLS = frozenset(
    {
        # start-up: the schema, the runner id (held, renewed), registration, timing,
        # state, operations
        "migrate_has_table",
        "runners_hold_identity",
        "migrate_applied",
        "runners_register",
        "runners_lease_seconds",
        "runners_get_state",
        "runners_set_state",
        "lease_operations",
        # the lease protocol
        "lease_claim",
        "lease_heartbeat",
        "lease_report_start",
        "lease_complete",
        "lease_complete_and_claim",
        "lease_release",
        "lease_report_lost",
        "lease_confirm_stop",
        "lease_announce_lane",
        "output_append",
        # reconciliation and collection
        "lease_job_states",
        "lease_job",
        "lease_held_by",
        "lease_open_executions",
        "lease_note_event",
        # the passes every runner takes its turn at
        "lease_reap",
        "lease_next_retry_in",
        "schedules_of_lanes",
        "schedules_take_turn",
        "schedules_fire",
        "schedules_skip",
        "views_now",
    }
)
