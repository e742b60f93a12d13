"""One hierarchy of small, documented errors.

Each leaf's docstring is its default message. Errors never echo user payloads: a
message names the field, the file or the entry, not the bytes that were rejected.
"""

from __future__ import annotations


class FleetqError(Exception):
    """fleetq failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class ConnectionFailed(FleetqError):
    """Could not reach the PostgreSQL server."""


class ReadOnlyServer(ConnectionFailed):
    """The server reached accepts no writes: a standby, or a primary being demoted.
    Transient like a lost connection: after a failover the next connection (made with
    `target_session_attrs=read-write`) finds the new primary."""


class EmbeddedServerError(FleetqError):
    """The embedded PostgreSQL server could not be managed."""


class ExtraMissing(FleetqError):
    """A part of fleetq that is an install extra is not installed here (`pip install
    fleetq` is the runner and the command; `fleetq[console]`, `fleetq[api]` and
    `fleetq[server]` add the rest): the message names the extra, never an ImportError."""

    def __init__(self, what: str, extra: str, *, otherwise: str | None = None) -> None:
        self.extra = extra
        also = f" ({otherwise})" if otherwise else ""
        super().__init__(f"{what} needs the {extra} extra: pip install 'fleetq[{extra}]'{also}")


class MigrationError(FleetqError):
    """A migration could not be applied."""


class MigrationChecksumMismatch(MigrationError):
    """An applied migration file was changed after it was applied."""

    def __init__(self, version: int, name: str, recorded: str, found: str) -> None:
        self.version, self.name, self.recorded, self.found = version, name, recorded, found
        super().__init__(
            f"migration {name} was changed after it was applied "
            f"(recorded sha256 {recorded[:12]}…, file now {found[:12]}…); migrations are "
            "forward-only: restore the original file and put the change in a new migration"
        )


class SchemaOutOfDate(FleetqError):
    """The database schema is one this version of fleetq cannot run on: behind its code,
    or ahead of it through a contract migration (`contract`, the first such one)."""

    def __init__(self, expected: int, found: int, *, contract: str | None = None) -> None:
        self.expected, self.found, self.contract = expected, found, contract
        if contract is not None:
            super().__init__(
                f"database schema is at migration {found:04d}, past {contract}, a contract "
                f"migration that this fleetq (which knows up to {expected:04d}) cannot run "
                "on: upgrade fleetq on this machine"
            )
            return
        if found < expected:
            hint = "run `fleetq migrate` (with the same --dsn) to bring it up to date"
        else:
            hint = "this fleetq is older than the database: upgrade fleetq on this machine"
        super().__init__(
            f"database schema is at migration {found:04d}, this fleetq needs {expected:04d}: {hint}"
        )


class ConfigError(FleetqError):
    """A fleet configuration file is invalid; nothing was changed."""


class DatabaseBusy(FleetqError):
    """The database refused for now (a lock held past lock_timeout, a deadlock, a
    serialization failure, no free connection); the same request may succeed later."""


class QueryTimeout(ConnectionFailed):
    """The database did not answer in time; the statement may or may not have run."""


class StaleLease(FleetqError):
    """This runner no longer holds the job's lease: the write changed nothing."""

    def __init__(self, job_id: int, token: int, write: str = "write") -> None:
        self.job_id, self.token, self.write = job_id, token, write
        super().__init__(
            f"stale lease: {write} for job {job_id} under fencing token {token} was refused "
            "(the job was cancelled, expired or claimed again); nothing was changed"
        )


class NotAllowed(FleetqError):
    """The project or operation is not registered, or not allowed."""


class PermissionDenied(FleetqError):
    """The login may not do this (SQLSTATE 42501): it acts only as what it was made for
    (`fleetq roles`), e.g. a runner login naming another runner."""


class NotAuthenticated(PermissionDenied):
    """No valid API token (SQLSTATE FQ007): none was given to a gateway login, or the
    one given is unknown or revoked. HTTP answers 401 here, 403 for `PermissionDenied`."""


class InvalidInput(FleetqError):
    """The request was refused before it reached the queue."""


class IdempotencyConflict(FleetqError):
    """The idempotency key already names a job with other parameters."""


class NotFound(FleetqError):
    """No such job or runner."""


class CapacityConflict(FleetqError):
    """A runner's declared capacity is below what its live jobs hold."""


class RefusedNow(FleetqError):
    """Refused in the present state, possibly granted later (SQLSTATE FQ006): an
    operation with live jobs, a runner that is not yet offline or still holds work."""


# SQLSTATEs raised by the protocol functions (migrations/protocol/), for both drivers:
# psycopg reads an unknown class such as FQ as an OperationalError, which is not an
# outage.
BY_SQLSTATE: dict[str, type[FleetqError]] = {
    "FQ001": IdempotencyConflict,
    "FQ002": NotAllowed,
    "FQ003": InvalidInput,
    "FQ004": NotFound,
    "FQ005": CapacityConflict,
    "FQ006": RefusedNow,
    "FQ007": NotAuthenticated,
    "42501": PermissionDenied,  # insufficient_privilege: a login acting beyond itself
}
