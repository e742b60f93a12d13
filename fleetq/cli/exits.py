"""Exit statuses a script or a CI gate can act on, one table for every command.

`fleetq result` answers with 0 (every check passed), 1 (one ran and failed), 3 (none
failed, but one could not run: an error of the fleet, or refused) or 2 (not decided
yet: still queued or running, cancelled, never asked). Anything that can never be
answered as asked has a status of its own, so a gate neither waits for ever on an
unknown project nor reads a typo as a failed build. The numbers above 2 follow BSD
sysexits.h.
"""

from __future__ import annotations

from enum import IntEnum

from fleetq.core import errors


class Exit(IntEnum):
    OK = 0
    FAILED = 1  # fleetq result: a check ran and failed
    NOT_YET = 2  # fleetq result: still queued or running, cancelled, or never asked
    ERROR = 3  # fleetq result: a check could not run (an error of the fleet, or refused)
    USAGE = 64  # the command line is wrong: an option, a short SHA, --limit -1
    DATA = 65  # can never be answered: unknown project, operation or job
    UNAVAILABLE = 69  # the database is unreachable, busy or timed out: try again
    SOFTWARE = 70  # an unexpected error (a bug, or a database error fleetq did not expect)
    TEMPFAIL = 75  # refused for now: live jobs, a runner not yet offline; try again later
    NO_PERMISSION = 77  # this login may not do that (fleetq roles)
    CONFIG = 78  # the schema needs `fleetq migrate`, a config file is wrong, an extra is missing
    INTERRUPTED = 130  # Ctrl-C


# What a commit's checks decided (core.models.decision), as `result` and `wait` exit
DECISION_EXIT = {
    "passed": Exit.OK,
    "failed": Exit.FAILED,
    "error": Exit.ERROR,
    "pending": Exit.NOT_YET,
}


def for_error(exc: errors.FleetqError) -> Exit:
    """The status for a fleetq error."""
    match exc:
        case errors.ExtraMissing():
            return Exit.CONFIG  # an install to change, not a moment to wait for
        case errors.InvalidInput():
            return Exit.USAGE
        case errors.NotAllowed() | errors.NotFound() | errors.IdempotencyConflict():
            return Exit.DATA
        case errors.ConnectionFailed() | errors.DatabaseBusy() | errors.EmbeddedServerError():
            return Exit.UNAVAILABLE
        case errors.RefusedNow():
            return Exit.TEMPFAIL
        case errors.PermissionDenied():
            return Exit.NO_PERMISSION
        case errors.SchemaOutOfDate() | errors.MigrationError() | errors.ConfigError():
            return Exit.CONFIG
        case _:
            return Exit.SOFTWARE
