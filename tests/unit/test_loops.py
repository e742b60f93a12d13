"""The runner's loops: a database error is retried, a bug is not (issue 12)."""

from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from fleetq.core.driver import map_error
from fleetq.core.errors import (
    ConnectionFailed,
    DatabaseBusy,
    FleetqError,
    InvalidInput,
    ReadOnlyServer,
)
from fleetq.runner import loops


def test_asyncpg_internal_state_errors_after_a_restart_are_connection_failures() -> None:
    """`cannot switch to state 12; another operation (2) is in progress`, raised by
    asyncpg during a PostgreSQL restart, ended the runner."""
    exc = asyncpg.exceptions.InternalClientError(
        "cannot switch to state 12; another operation (2) is in progress"
    )
    assert isinstance(map_error(exc), ConnectionFailed)
    assert isinstance(loops.environmental(exc), ConnectionFailed)


def test_a_bug_is_not_environmental() -> None:
    assert loops.environmental(KeyError("oops")) is None
    error = FleetqError("database error: lock timeout")
    assert loops.environmental(error) is error


async def test_every_retries_database_errors_and_keeps_going() -> None:
    done = asyncio.Event()
    calls: list[int] = []

    async def work() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise FleetqError("database error: canceling statement due to lock timeout")
        if len(calls) == 2:
            raise asyncpg.exceptions.InternalClientError("cannot switch to state 12")
        if len(calls) == 4:
            done.set()

    await asyncio.wait_for(loops.every(0.01, "test", work, done), 10)
    assert len(calls) == 4


async def test_every_lets_a_bug_end_the_loop() -> None:
    async def work() -> None:
        raise KeyError("a bug in fleetq")

    with pytest.raises(KeyError):
        await asyncio.wait_for(loops.every(0.01, "test", work, asyncio.Event()), 10)


async def test_persist_gives_up_only_when_told() -> None:
    give_up = asyncio.Event()
    tries = 0

    async def write() -> None:
        nonlocal tries
        tries += 1
        if tries == 3:
            give_up.set()
        raise ConnectionFailed("down")

    assert await asyncio.wait_for(loops.persist("a stop", write, give_up), 10) is False
    assert tries == 3


def test_backoff_grows_to_its_cap_and_resets() -> None:
    backoff = loops.Backoff(first=0.1, cap=1.0)
    delays = [backoff.next() for _ in range(8)]
    assert delays[0] < 0.2 and 0.8 <= delays[-1] <= 1.2
    backoff.reset()
    assert backoff.next() < 0.2


def test_a_lock_timeout_is_busy_and_transient() -> None:
    exc = asyncpg.exceptions.LockNotAvailableError("canceling statement due to lock timeout")
    error = map_error(exc)
    assert isinstance(error, DatabaseBusy) and loops.transient(error)


def test_a_refusal_for_good_is_not_transient() -> None:
    exc = asyncpg.exceptions.CharacterNotInRepertoireError("invalid byte sequence: 0x00")
    error = loops.environmental(exc)
    assert error is not None and not loops.transient(error)


def test_arguments_fleetq_passed_wrongly_are_a_bug() -> None:
    """asyncpg's client-side DataError is an InterfaceError, once read as a lost
    connection and retried for ever."""
    client_side = asyncpg.exceptions._base.DataError("invalid input for query argument $1")
    assert map_error(client_side) is None
    assert loops.environmental(InvalidInput("a batch names the same job twice")) is None


def test_a_read_only_server_is_an_outage_to_ride_out_not_a_bug() -> None:
    """A write on a standby (or a fenced primary), or no host in the DSN taking writes:
    retried like a lost connection, saying what it is."""
    refused = asyncpg.exceptions.ReadOnlySQLTransactionError(
        "cannot execute INSERT in a read-only transaction"
    )
    none_writable = asyncpg.exceptions.TargetServerAttributeNotMatched(
        "None of the hosts match the target attribute requirement 'read-write'"
    )
    for exc in (refused, none_writable):
        error = loops.environmental(exc)
        assert isinstance(error, ReadOnlyServer)
        assert loops.transient(error)
        assert "read-only" in str(error) or "accepts writes" in str(error)


async def test_sigusr1_s_dump_names_a_job_s_task_by_its_job(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A job's task has no name of its own (naming one per job cost the runner 4% of its
    CPU under a backlog): the dump takes the runner's label for it, "job:ID"."""
    from fleetq.runner.signals import dump_tasks

    parked = asyncio.ensure_future(asyncio.Event().wait())
    named = asyncio.ensure_future(asyncio.Event().wait())
    named.set_name("claim:checks")
    await asyncio.sleep(0)
    with caplog.at_level(logging.WARNING):
        dump_tasks([parked, named], labels={parked: "job:7"})
    parked.cancel()
    named.cancel()
    text = caplog.text
    assert "task job:7 waits in" in text and "task claim:checks waits in" in text
