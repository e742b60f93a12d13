"""How a runner connects: the settings its sessions ask for, the token naming this
process's sessions, and its pool."""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass

import asyncpg

from fleetq.core.db import dsn_settings
from fleetq.core.driver import connect_each_host, prepare_asyncpg, server_guard
from fleetq.core.models import RunnerId
from fleetq.runner import identity

# Runner sessions never hold a transaction or a lock for long (DESIGN: every call has a
# client timeout too, in the driver). Settings named in the DSN's query
# (`?lock_timeout=2000`) take precedence over these.
SESSION_SETTINGS = {
    "statement_timeout": "30000",
    "lock_timeout": "10000",
    "idle_in_transaction_session_timeout": "60000",
    "application_name": "fleetq-runner",
}


@dataclass(frozen=True)
class Session:
    """The DSN, the settings this runner's sessions ask for (those the DSN names itself
    left out), and the token that names this process's sessions."""

    dsn: str
    settings: Mapping[str, str]
    dsn_names: Container[str]
    token: str

    @classmethod
    def for_dsn(cls, dsn: str) -> Session:
        names = dsn_settings(dsn)
        return cls(
            dsn=dsn,
            settings={k: v for k, v in SESSION_SETTINGS.items() if k not in names},
            dsn_names=names,
            token=identity.new_token(),
        )


async def open_pool(session: Session, runner: RunnerId, *, lanes: int) -> asyncpg.Pool:
    """The runner's pool: a connection per lane's claim loop and four for the rest.

    min_size=0: creating the pool connects nothing, so a database that is not there yet
    shows up in start-up's first statement, which waits for it. reset=_keep_session: the
    runner's pooled sessions never LISTEN, SET or hold session locks, so asyncpg's reset
    on release (a round trip per call) is waste."""
    return await asyncpg.create_pool(
        session.dsn,
        connect=connect_each_host,
        min_size=0,
        max_size=4 + lanes,
        init=prepare_asyncpg,
        setup=server_guard(session.dsn),
        reset=_keep_session,
        server_settings={
            **session.settings,
            "application_name": identity.pool_application_name(runner, session.token),
        },
        timeout=10,  # to connect
    )


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """Nothing to reset (see `open_pool`)."""
